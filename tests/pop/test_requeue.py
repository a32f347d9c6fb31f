"""Requeuer on its own: given a lease book, a queue source and a revive schedule on a
real store and real RocksDB, with a manual clock (no PopService, no broker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pop.checkpoint import PopCheckpoint
from pop.model import (
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_REASON,
    AlreadyRequeued,
    dlq_topic,
    retry_topic,
)
from pop.policy import RetryPolicy
from pop.requeue import Requeuer
from pop.schedule import ReviveSchedule
from pop.settle import PROP_LEASE, decode_lease
from store.clock import ManualClock
from store.errors import InvalidArgument
from store.message import Message
from testkit.wait import wait_until
from tests.pop.test_leasebook import Parts


class Env(Parts):
    def __init__(self, root: Path, clock: ManualClock, policy: RetryPolicy | None = None
                 ) -> None:
        super().__init__(root, clock)
        self.schedule = ReviveSchedule(clock)
        self.schedule.add(self.book.deadlines())
        self.requeuer = Requeuer(self.store, self.kv, clock, self.book, self.source,
                                 self.schedule, policy)

    def leased(self, group: str, count: int, invisible_s: int = 30) -> list[str]:
        handles = self.lease(group, count, invisible_s)
        self.schedule.add(self.book.deadlines())
        return handles

    def messages(self, topic: str) -> list[Message]:
        assert self.store.wait_visible(10)
        if self.store.topics.get(topic) is None:
            return []
        entries = self.store.consume_queue_entries(topic, 0, 0, 100)
        found = self.store.read_messages_skipping([(e.commit_offset, e.record_size)
                                                   for e in entries])
        return [m for m in found if isinstance(m, Message)]


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock, RetryPolicy(max_attempts=2, jitter=0))
    yield e
    e.close()


def test_a_release_copies_the_message_then_closes_its_entry(env: Env) -> None:
    # Given two leased messages
    env.send(2)
    a, b = env.leased("G", 2)
    sent = env.messages("t")
    # When the consumer releases the first with no delay
    assert env.requeuer.release_many("G", [(a, 0)]) == [None]
    # Then its copy is on the retry topic, naming the entry it replaces, and the entry
    # is done; releasing again is a no-op
    [copy] = env.messages(retry_topic("G", "t"))
    assert (copy.message_id, copy.body, copy.delivery_attempt) == \
        (sent[0].message_id, sent[0].body, 1)
    lease = decode_lease(copy.properties[PROP_LEASE])
    assert lease is not None and (lease.topic, lease.queue_offset) == ("t", 0)
    assert env.requeuer.release_many("G", [(a, 0)]) == [None]
    with env.book.lock("G", "t"), pytest.raises(AlreadyRequeued):
        env.book.lease_of("G", env.book.receipts.decode("G", a, env.clock.now_ms()))
    assert len(env.messages(retry_topic("G", "t"))) == 1
    assert env.book.statistics().released == 1
    assert env.requeuer.pending_deadlines == 1  # b's lease is still open
    # When the second is dead-lettered by the consumer, the lease closes
    assert env.requeuer.dead_letter_many("G", [(b, "cannot parse")]) == [None]
    [dead] = env.messages(dlq_topic("G", "t"))
    assert dead.properties[PROP_DLQ_REASON] == "cannot parse"
    assert env.requeuer.pending_deadlines == 0
    assert env.book.statistics().open_checkpoints == 0


def test_a_bad_release_delay_is_refused_before_anything_changes(env: Env) -> None:
    env.send(1)
    [a] = env.leased("G", 1)
    with pytest.raises(InvalidArgument, match="between 0 and 12 h"):
        env.requeuer.release_many("G", [(a, -1)])
    assert env.messages(retry_topic("G", "t")) == []
    assert env.book.statistics().open_checkpoints == 1


def test_expired_leases_revive_on_the_retry_topic_once(env: Env) -> None:
    env.send(3)
    env.leased("G", 3, invisible_s=1)
    assert env.requeuer.revive_due() == 0  # not yet
    env.clock.advance(1_000)
    assert env.requeuer.revive_due() == 3
    copies = env.messages(retry_topic("G", "t"))
    assert [m.body for m in copies] == [b"m0", b"m1", b"m2"]
    assert all(m.delivery_attempt == 1 for m in copies)
    assert env.requeuer.revive_due() == 0  # done: never twice
    assert env.requeuer.pending_deadlines == 0
    s = env.book.statistics()
    assert (s.revived, s.open_checkpoints) == (3, 0)


def test_past_max_attempts_a_revive_dead_letters(env: Env) -> None:
    # Given a message revived once (its copy is attempt 1)
    env.send(1)
    env.leased("G", 1, invisible_s=1)
    env.clock.advance(1_000)
    assert env.requeuer.revive_due() == 1
    [copy] = env.messages(retry_topic("G", "t"))
    # When its copy is leased from the retry topic and expires too (max_attempts = 2)
    now = env.clock.now_ms()
    rtopic = retry_topic("G", "t")
    with env.book.lock("G", "t"):  # the copy's lease, as a Pop records it
        env.book.pop_offset("G", rtopic, 0, env.source.bounds(rtopic, 0))
        rec = env.book.record_lease("G", rtopic, 0, PopCheckpoint(0, now, now + 1000, 1,
                                                                  bytearray(1)))
        env.book.wait(env.book.write(rec.puts))
    assert rec.deadline is not None
    env.schedule.add([rec.deadline])
    env.clock.advance(1_000)
    assert env.requeuer.revive_due() == 1
    # Then it goes to the dead-letter topic with the reason and the attempts
    [dead] = env.messages(dlq_topic("G", "t"))
    assert dead.message_id == copy.message_id
    assert dead.properties[PROP_DLQ_REASON] == "max attempts (2) reached"
    assert dead.properties[PROP_DLQ_ATTEMPTS] == "2"
    assert env.book.statistics().dead_lettered == 1


def test_the_revive_thread_fires_due_deadlines(env: Env) -> None:
    env.send(1)
    env.leased("G", 1, invisible_s=1)
    env.clock.advance(1_000)
    env.requeuer.start()
    try:
        # the thread revives on its own: poll its outcome
        wait_until(lambda: env.book.statistics().revived > 0, 10, "the revive thread to fire")
    finally:
        env.requeuer.stop()
    assert env.book.statistics().revived == 1
    assert len(env.messages(retry_topic("G", "t"))) == 1
