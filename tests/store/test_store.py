"""MessageStore on real files and real RocksDB."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from store.clock import ManualClock, SystemClock
from store.errors import AlreadyExists, InvalidArgument, TopicNotFound
from store.message import DispatchInfo, Message, decode_record, encode_record
from store.store import MessageStore, StoreConfig
from store.topics import Topic


def _put(store: MessageStore, n: int, topic: str = "t", key: str = "") -> list[DispatchInfo]:
    out = store.put([Message("", topic, f"body-{i}".encode() * 20, key=key)
                     for i in range(n)]).result(10)
    assert store.dispatcher is not None
    assert store.dispatcher.wait_dispatched(store.commitlog.confirmed_offset, 10)
    return out


def _entries(store: MessageStore, topic: str, queues: int) -> list[list[int]]:
    out = []
    for q in range(queues):
        offsets: list[int] = []
        while got := store.consume_queue_entries(topic, q, len(offsets), 1000):
            offsets += [e.commit_offset for e in got]
        out.append(offsets)
    return out


def _reopen(config: StoreConfig) -> MessageStore:
    s = MessageStore(config, SystemClock())
    s.open()
    s.start()
    return s


def test_consume_queues_are_dense_and_survive_restart(store: MessageStore) -> None:
    store.create_topic(Topic("t", 3))
    sent = _put(store, 300)
    before = _entries(store, "t", 3)
    assert sorted(o for q in before for o in q) == sorted(m.commit_offset for m in sent)
    for q in range(3):
        lo, hi = store.queue_bounds("t", q)
        assert (lo, hi) == (0, len(before[q]))
    store.stop()
    s = _reopen(store.config)
    assert _entries(s, "t", 3) == before
    s.stop()


def test_rebuild_from_the_commitlog_duplicates_nothing(store: MessageStore) -> None:
    store.create_topic(Topic("t", 2))
    _put(store, 250)
    before = _entries(store, "t", 2)
    store.stop()
    data = store.config.data_dir
    # Given: the dispatcher checkpoint lost -> full replay over existing files
    os.remove(os.path.join(data, "checkpoint", "consumequeue"))
    s = _reopen(store.config)
    assert _entries(s, "t", 2) == before
    s.stop()
    # Given: the consume queues lost entirely -> rebuilt from the CommitLog
    shutil.rmtree(os.path.join(data, "consumequeue"))
    os.remove(os.path.join(data, "checkpoint", "consumequeue"))
    s = _reopen(store.config)
    assert _entries(s, "t", 2) == before
    # and new sends continue the queue offsets without a gap
    more = _put(s, 4)
    n0, n1 = len(before[0]), len(before[1])
    assert sorted(m.queue_offset for m in more) == sorted([n0, n0 + 1, n1, n1 + 1])
    s.stop()


def test_keys_and_ids_are_queryable(store: MessageStore) -> None:
    store.create_topic(Topic("t", 4))
    _put(store, 5, key="order-1")
    other = _put(store, 3, key="order-2")
    assert [m.key for m in store.query_by_key("t", "order-1", 10)] == ["order-1"] * 5
    assert len(store.query_by_key("t", "order-1", 2)) == 2
    found = store.query_by_message_id(other[1].message_id)
    assert [(m.message_id, m.body) for m in found] == [(other[1].message_id, b"body-1" * 20)]
    assert store.query_by_message_id("NOPE") == []
    with pytest.raises(TopicNotFound):
        store.query_by_key("missing", "k", 1)


def test_client_chosen_ids_are_indexed(store: MessageStore) -> None:
    store.create_topic(Topic("t", 2))
    store.put([Message("replay-0001", "t", b"again")]).result(10)
    _put(store, 3)
    (m,) = store.query_by_message_id("replay-0001")
    assert (m.message_id, m.body) == ("replay-0001", b"again")
    store.stop()
    s = _reopen(store.config)
    assert [m.body for m in s.query_by_message_id("replay-0001")] == [b"again"]
    s.stop()


def test_messages_with_one_key_share_a_queue(store: MessageStore) -> None:
    store.create_topic(Topic("t", 8))
    sent = _put(store, 20, key="same")
    assert len({m.queue_id for m in sent}) == 1
    assert [m.queue_offset for m in sent] == list(range(20))


def test_bad_messages_are_refused(store: MessageStore) -> None:
    store.create_topic(Topic("t", 1))
    with pytest.raises(TopicNotFound):
        store.check(Message("", "nope", b"x"))
    with pytest.raises(InvalidArgument, match="body is empty"):
        store.check(Message("", "t", b""))
    with pytest.raises(InvalidArgument, match="over the maximum"):
        store.check(Message("", "t", b"x" * (store.config.max_body_bytes + 1)))
    with pytest.raises(InvalidArgument, match="topic is empty"):
        store.check(Message("", "", b"x"))
    with pytest.raises(InvalidArgument, match="printable ASCII"):
        store.check(Message("idé", "t", b"x"))


def test_topic_catalogue(store: MessageStore) -> None:
    assert store.create_topic(Topic("a", 2))[1] is True
    assert store.create_topic(Topic("a", 2))[1] is False
    with pytest.raises(AlreadyExists):
        store.create_topic(Topic("a", 3))
    with pytest.raises(InvalidArgument):
        store.create_topic(Topic("bad name!", 1))
    with pytest.raises(InvalidArgument, match="reserved"):
        store.topics.create(Topic("%reserved", 1))
    with pytest.raises(InvalidArgument):
        store.create_topic(Topic("z", 0))
    with pytest.raises(InvalidArgument, match="tier keeps data longer"):
        store.create_topic(Topic("z", 1, retention_ms=10_000, tier_retention_ms=5_000))
    assert store.create_topic(Topic("y", 1, retention_ms=5_000, tier_retention_ms=10_000))[1]
    store.stop()
    s = _reopen(store.config)
    assert [(t.name, t.tier_retention_ms) for t in s.topics.list()] == [("a", 0),
                                                                         ("y", 10_000)]
    s.stop()


def test_deleted_topic_does_not_come_back(store: MessageStore) -> None:
    store.create_topic(Topic("t", 1))
    _put(store, 10)
    store.delete_topic("t")
    store.create_topic(Topic("t", 1))
    fresh = _put(store, 2)
    assert [m.queue_offset for m in fresh] == [0, 1]
    store.stop()
    os.remove(os.path.join(store.config.data_dir, "checkpoint", "consumequeue"))
    s = _reopen(store.config)  # a full replay must not resurrect the old 10
    assert s.queue_bounds("t", 0) == (0, 2)
    s.stop()


def test_auto_create_topics(tmp_path: Path) -> None:
    s = _reopen(StoreConfig(str(tmp_path), auto_create_topics=True, default_queue_count=2))
    s.check(Message("", "fresh", b"x"))
    assert s.topics.require("fresh").queue_count == 2
    s.stop()


def test_size_retention_deletes_only_dispatched_segments(tmp_path: Path) -> None:
    cfg = StoreConfig(str(tmp_path), segment_bytes=4096, retention_bytes=8192,
                      cq_entries_per_file=10)
    s = _reopen(cfg)
    s.create_topic(Topic("t", 1))
    for _ in range(20):
        _put(s, 5)
    before = s.commitlog.statistics()
    assert s.dispatcher is not None
    s.dispatcher.catch_up()  # persists every dispatcher's position
    freed = s.run_retention()
    after = s.commitlog.statistics()
    assert freed > 0
    assert after.bytes_on_disk <= 8192 + 4096
    assert after.min_offset > before.min_offset
    lo, hi = s.queue_bounds("t", 0)
    assert lo > 0 and hi == 100
    # every entry still visible points at data still on disk
    for e in s.consume_queue_entries("t", 0, lo, 100):
        assert s.read_message(e.commit_offset, e.record_size).topic == "t"
    s.stop()


def test_topic_retention_by_age(tmp_path: Path) -> None:
    clock = ManualClock()
    s = MessageStore(StoreConfig(str(tmp_path), cq_entries_per_file=10), clock)
    s.open()
    s.start()
    s.create_topic(Topic("short", 1, retention_ms=60_000))
    _put(s, 15, topic="short")
    clock.advance(61_000)
    _put(s, 5, topic="short")
    s.run_retention()
    assert s.queue_bounds("short", 0) == (15, 20)
    s.stop()


def test_the_inlined_writer_encodes_exactly_like_encode_record(store: MessageStore) -> None:
    store.create_topic(Topic("t", 3))
    sent = store.put([Message("", "t", b"plain"), Message("", "t", b"k", key="key-1", tag="x"),
                      Message("mine-1", "t", b"p", properties={"a": "b"})]).result(10)
    for info in sent:
        raw = store.commitlog.read(info.commit_offset, info.record_size)
        assert encode_record(decode_record(raw)) == raw
