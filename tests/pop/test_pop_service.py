"""PopService with a manual clock on a real store and real RocksDB."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pop.handle import HandleCodec, InvalidReceiptHandle, ReceiptHandle
from pop.model import AlreadyRequeued, HandleSuperseded
from pop.service import PopService, ReceiptHandleExpired, TagFilter
from store.clock import ManualClock
from store.consumequeue import ENTRY
from store.errors import InvalidArgument, TopicNotFound
from store.kv import KV
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic

SECRET = b"k" * 32


class Env:
    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root, self.clock = root, clock
        self.store = MessageStore(StoreConfig(str(root / "data")), clock)
        self.store.open()
        self.store.start()
        self.kv = KV(str(root / "pop"))
        self.pop = PopService(self.store, self.kv, SECRET, clock)

    def send(self, n: int, topic: str = "t", tag: str = "") -> list[Message]:
        out = self.store.put([Message("", topic, f"m{i}".encode(), tag=tag)
                              for i in range(n)]).result(10)
        assert self.store.dispatcher is not None
        assert self.store.dispatcher.wait_dispatched(self.store.commitlog.confirmed_offset, 10)
        return out

    def close(self) -> None:
        self.store.stop()
        self.kv.close()

    def reopen(self) -> Env:
        self.close()
        return Env(self.root, self.clock)


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    e.store.create_topic(Topic("t", 2))
    yield e
    e.close()


def test_a_group_gets_each_message_once_and_groups_are_independent(env: Env) -> None:
    sent = env.send(10)
    a1 = env.pop.pop("t", "A", 6, 30)
    a2 = env.pop.pop("t", "A", 32, 30)
    b = env.pop.pop("t", "B", 32, 30)
    ids = {m.message_id for m in sent}
    got_a = [p.message.message_id for p in a1 + a2]
    assert len(got_a) == 10 and set(got_a) == ids  # no message leased twice in A
    assert {p.message.message_id for p in b} == ids
    assert env.pop.pop("t", "A", 32, 30) == []
    assert all(p.delivery_attempt == 1 for p in a1)


def test_ack_is_idempotent_and_moves_the_offset(env: Env) -> None:
    env.send(4)
    got = env.pop.pop("t", "G", 32, 30)
    for p in got:
        env.pop.ack("G", p.receipt_handle)
        env.pop.ack("G", p.receipt_handle)  # again: fine
    assert env.pop.statistics().open_checkpoints == 0
    assert env.pop.statistics().acked == 4


def test_ack_after_the_lease_expired_is_refused(env: Env) -> None:
    env.send(1)
    (p,) = env.pop.pop("t", "G", 1, 10)
    env.clock.advance(10_000)
    with pytest.raises(ReceiptHandleExpired, match="expired"):
        env.pop.ack("G", p.receipt_handle)


def test_a_renewable_handle_settles_its_entry_at_the_deadline_it_has_now(env: Env) -> None:
    # Given two messages leased for 30 s with renewable handles (a push consumer's),
    # each lease renewed twice (ChangeInvisibleTime: the plain handle it returns
    # supersedes only plain ones)
    env.send(2)
    kept, released = env.pop.renewable("G", env.pop.pop("t", "G", 2, 30))
    plain = ""
    for _ in range(2):
        env.clock.advance(25_000)
        for p in (kept, released):
            plain = env.pop.change_invisible_time("G", p.receipt_handle, 30)
    env.clock.advance(1_000)
    env.pop.change_invisible_time("G", plain, 30)
    with pytest.raises(HandleSuperseded):  # a plain handle is replaced as before
        env.pop.ack("G", plain)
    # Then the renewable handles, 50 s past their first deadline, still work: one acks
    env.pop.ack("G", kept.receipt_handle)
    assert env.pop.statistics().acked == 1
    # and none settles an entry once it is released, or past its current deadline
    env.pop.change_invisible_time("G", released.receipt_handle, 0)
    env.pop.revive_due(env.clock.now_ms())
    with pytest.raises(AlreadyRequeued):
        env.pop.ack("G", released.receipt_handle)
    env.send(1)
    (late,) = env.pop.renewable("G", env.pop.pop("t", "G", 1, 10))
    env.clock.advance(10_000)
    with pytest.raises(ReceiptHandleExpired):
        env.pop.ack("G", late.receipt_handle)


def test_forged_altered_and_cross_group_handles_are_refused(env: Env) -> None:
    env.send(1)
    (p,) = env.pop.pop("t", "G", 1, 30)
    with pytest.raises(InvalidReceiptHandle, match="another group"):
        env.pop.ack("OTHER", p.receipt_handle)
    tampered = p.receipt_handle[:-3] + ("A" if p.receipt_handle[-3] != "A" else "B") + \
        p.receipt_handle[-2:]
    with pytest.raises(InvalidReceiptHandle):
        env.pop.ack("G", tampered)
    forged = HandleCodec(b"x" * 32).encode("G", ReceiptHandle("t", 0, 0, 0, 2**40, 1))
    with pytest.raises(InvalidReceiptHandle):
        env.pop.ack("G", forged)
    for junk in ("", "!!!", "AAAA"):
        with pytest.raises(InvalidReceiptHandle):
            env.pop.ack("G", junk)


def test_bad_pop_arguments(env: Env) -> None:
    with pytest.raises(TopicNotFound):
        env.pop.pop("missing", "G", 1, 30)
    for args in [("t", "", 1, 30), ("t", "G", 0, 30), ("t", "G", 33, 30), ("t", "G", 1, 0),
                 ("t", "G", 1, 12 * 3600 + 1)]:
        with pytest.raises(InvalidArgument):
            env.pop.pop(*args)
    with pytest.raises(InvalidArgument):
        TagFilter.parse("a ||")


def test_tag_filter_skips_and_still_advances(env: Env) -> None:
    env.send(3, tag="red")
    env.send(3, tag="blue")
    got = env.pop.pop("t", "G", 32, 30, TagFilter.parse("blue || green"))
    assert sorted(p.message.tag for p in got) == ["blue"] * 3
    for p in got:
        env.pop.ack("G", p.receipt_handle)
    assert env.pop.statistics().open_checkpoints == 0


def test_acks_and_leases_survive_restart(env: Env) -> None:
    env.send(6)
    got = env.pop.pop("t", "G", 32, 30)
    acked = got[:3]
    for p in acked:
        env.pop.ack("G", p.receipt_handle)
    env2 = env.reopen()
    try:
        # leased messages stay leased; nothing is handed out twice
        assert env2.pop.pop("t", "G", 32, 30) == []
        for p in got[3:]:
            env2.pop.ack("G", p.receipt_handle)  # handles stay valid across restarts
        assert env2.pop.statistics().open_checkpoints == 0
        fresh = env2.send(2)
        assert {p.message.message_id for p in env2.pop.pop("t", "G", 32, 30)} == \
            {m.message_id for m in fresh}
    finally:
        env.__dict__.update(env2.__dict__)


def test_deleting_a_topic_forgets_its_offsets(env: Env) -> None:
    env.send(3)
    for p in env.pop.pop("t", "G", 32, 30):
        env.pop.ack("G", p.receipt_handle)
    env.store.delete_topic("t")
    env.pop.forget_topic("t")
    env.store.create_topic(Topic("t", 2))
    env.send(2)
    assert len(env.pop.pop("t", "G", 32, 30)) == 2
    assert os.path.isdir(env.kv.path)


def test_deleting_a_topic_deletes_its_retry_topics(env: Env) -> None:
    """A Nack made a retry topic (``%RETRY%G%t``); deleting ``t`` deletes it too (the
    store's delete refused the broker's own name: DeleteTopic failed INVALID_ARGUMENT
    half done)."""
    env.send(1)
    (p,) = env.pop.pop("t", "G", 32, 30)
    assert env.pop.release_many("G", [(p.receipt_handle, 1000)]) == [None]
    assert env.store.topics.get("%RETRY%G%t") is not None
    env.store.delete_topic("t")
    env.pop.forget_topic("t")
    assert [t.name for t in env.store.topics.list()] == []


def test_a_pop_racing_local_retention_leases_nothing_it_cannot_read(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a queue whose oldest CommitLog segment local retention has just deleted,
    # before it moved the queue's low mark past it
    store = MessageStore(StoreConfig(str(tmp_path / "data"), segment_bytes=64 << 10),
                         manual_clock)
    store.open()
    store.start()
    kv = KV(str(tmp_path / "pop"))
    try:
        pop = PopService(store, kv, SECRET, manual_clock)
        store.create_topic(Topic("t", 1))
        for _ in range(10):  # one segment holds a batch whole: 64 KiB is three batches
            store.put([Message("", "t", b"x" * 1000) for _ in range(20)]).result(10)
        assert store.wait_visible(10)
        assert store.commitlog.delete_oldest_segment() > 0
        # When a group pops (before: INTERNAL, "commitlog offset ... is not on local disk")
        got = pop.pop("t", "G", 32, 30)
        # Then it answers, and leases nothing it could not read
        assert got == [] and pop.statistics().open_checkpoints == 0
    finally:
        store.stop()
        kv.close()


def test_an_entry_pointing_at_another_topics_record_is_skipped_not_delivered(
        env: Env) -> None:
    """A damaged (or forged) ConsumeQueue entry of topic ``t`` that points at a record of
    topic ``secret``: Pop on ``t`` skips it and never hands out the other topic's body."""
    env.store.create_topic(Topic("secret", 1))
    env.send(1, topic="t")  # t's queue 0 or 1 has queue offset 0
    (hidden,) = env.store.put([Message("", "secret", b"SECRET")]).result(10)
    assert env.store.wait_visible(10)
    qid = 0 if env.store.queues.queue("t", 0).max_offset else 1
    cq = env.store.queues.queue("t", qid)
    cq.put_many([(cq.max_offset, ENTRY.pack(hidden.commit_offset, hidden.record_size, 0,
                                            hidden.store_at_ms))])
    got = env.pop.pop("t", "g", 32, 30)
    assert [m.message.topic for m in got] == ["t"]
    assert all(m.message.body != b"SECRET" for m in got)
