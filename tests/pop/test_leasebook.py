"""LeaseBook on its own: real RocksDB (``store.kv.KV``), a real store for the queues'
bounds, a manual clock; leases recorded the way a Pop records them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pop.checkpoint import PopCheckpoint
from pop.handle import ReceiptHandle
from pop.leasebook import LeaseBook
from pop.model import (
    AlreadyDone,
    AlreadyRequeued,
    HandleSuperseded,
    ReceiptHandleExpired,
    Requeue,
    placeholder,
)
from pop.source import QueueBounds, QueueSource
from store.clock import ManualClock
from store.kv import KV
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic

SECRET = b"s" * 32


class Parts:
    """A store with topic ``t`` (1 queue), the POP RocksDB and a lease book on them."""

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root, self.clock = root, clock
        self.store = MessageStore(StoreConfig(str(root / "data")), clock)
        self.store.open()
        self.store.start()
        if self.store.topics.get("t") is None:
            self.store.create_topic(Topic("t", 1))
        self.kv = KV(str(root / "pop"))
        self.source = QueueSource(self.store)
        self.book = LeaseBook(self.store, self.kv, SECRET, clock, self.source)

    def send(self, n: int) -> None:
        self.store.put([Message("", "t", f"m{i}".encode()) for i in range(n)]).result(10)
        assert self.store.wait_visible(10)

    def lease(self, group: str, count: int, invisible_s: int = 30) -> list[str]:
        """Lease the next ``count`` entries of ``t``/0 as a Pop does; their handles."""
        now = self.clock.now_ms()
        expire = now + invisible_s * 1000
        with self.book.lock(group, "t"):
            start = self.book.pop_offset(group, "t", 0, self.source.bounds("t", 0))
            ck = PopCheckpoint(start, now, expire, count, bytearray((count + 7) // 8))
            recorded = self.book.record_lease(group, "t", 0, ck)
            ticket = self.book.write(recorded.puts)
        self.book.wait(ticket)
        assert recorded.deadline == (group, "t", 0, start, expire)
        return [self.book.receipts.encode(group,
                                          ReceiptHandle("t", 0, start, start + i, expire, 1))
                for i in range(count)]

    def close(self) -> None:
        self.store.stop()
        self.kv.close()

    def reopen(self) -> Parts:
        self.close()
        return Parts(self.root, self.clock)


@pytest.fixture
def parts(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Parts]:
    p = Parts(tmp_path, manual_clock)
    yield p
    p.close()


def _reopen(parts: Parts) -> Parts:
    new = parts.reopen()
    parts.__dict__.update(new.__dict__)  # the fixture closes what is current
    return parts


def test_leases_and_positions_are_loaded_from_rocksdb(parts: Parts) -> None:
    # Given two leases written durably
    parts.send(5)
    first = parts.lease("G", 2)
    parts.lease("G", 2)
    expire = parts.book.receipts.decode("G", first[0], parts.clock.now_ms()).expire_at_ms
    # When a new book is built on the same RocksDB
    _reopen(parts)
    # Then it holds both leases with their deadlines, and leases on from offset 4
    assert sorted(parts.book.deadlines()) == [("G", "t", 0, 0, expire), ("G", "t", 0, 2, expire)]
    assert parts.book.statistics().open_checkpoints == 2
    with parts.book.lock("G", "t"):
        assert parts.book.pop_offset("G", "t", 0, parts.source.bounds("t", 0)) == 4
    assert parts.book.group_pairs() == [("G", "t")]


def test_an_ack_closes_the_lease_and_returns_its_deadline(parts: Parts) -> None:
    parts.send(3)
    handles = parts.lease("G", 3)
    decoded, errors = parts.book.receipts.decode_all("G", handles)
    assert errors == [None] * 3 and decoded[2] is not None
    expire = decoded[2].expire_at_ms
    partial = parts.book.ack("G", decoded[:2])
    assert partial.errors == [None, None] and partial.retired == [] and partial.ticket
    parts.book.wait(partial.ticket)
    done = parts.book.ack("G", decoded[2:])
    assert done.retired == [("G", "t", 0, 0, expire)]
    parts.book.wait(done.ticket)
    again = parts.book.ack("G", decoded)  # idempotent: nothing more to write or close,
    # and its OK waits for the write that acked them (the latest: nothing new written)
    assert (again.errors, again.ticket, again.retired) == ([None] * 3, done.ticket, [])
    assert parts.book.journal.last_ticket == done.ticket
    assert parts.book.statistics().acked == 3
    _reopen(parts)  # the ack offset moved past the lease, durably
    assert parts.book.deadlines() == []
    assert parts.book.statistics().open_checkpoints == 0
    [stats] = parts.book.group_statistics()
    assert (stats.in_flight, stats.backlog, stats.lag) == (0, 0, 0)


def test_a_handle_checks_expiry_and_supersession(parts: Parts) -> None:
    parts.send(2)
    a, b = parts.lease("G", 2, invisible_s=10)
    ha = parts.book.receipts.decode("G", a, parts.clock.now_ms())
    later = parts.clock.now_ms() + 60_000
    ticket = parts.book.change_invisible_time("G", ha, later)
    parts.book.wait(ticket)
    with parts.book.lock("G", "t"), pytest.raises(HandleSuperseded):
        parts.book.lease_of("G", ha)
    moved = ReceiptHandle(ha.topic, ha.queue_id, ha.ck_start, ha.queue_offset, later, 1)
    with parts.book.lock("G", "t"):
        ck, i = parts.book.lease_of("G", moved)
    assert ck is not None and i == 0 and ck.expire_of(0) == later
    assert ("G", "t", 0, 0, later) in parts.book.deadlines()
    parts.clock.advance(10_000)
    with pytest.raises(ReceiptHandleExpired):
        parts.book.receipts.decode("G", b, parts.clock.now_ms())
    assert parts.book.entries_due(("G", "t", 0, 0, ha.expire_at_ms)) == [1]
    assert parts.book.entries_due(("G", "t", 0, 0, later)) == [0]
    parts.book.wait(parts.book.ack("G", [moved]).ticket)
    with pytest.raises(AlreadyDone):
        parts.book.change_invisible_time("G", moved, later + 1)


def test_requeued_entries_are_done_and_counted_by_outcome(parts: Parts) -> None:
    parts.send(3)
    handles = parts.lease("G", 3)
    decoded = [parts.book.receipts.decode("G", h, parts.clock.now_ms()) for h in handles]
    reqs = [Requeue("G", "t", 0, 0, 0, placeholder(), 0, None),
            Requeue("G", "t", 0, 0, 1, placeholder(), None, "bad payload")]
    with parts.book.lock("G", "t"):
        assert parts.book.entry_at("G", "t", 0, 1) == (0, 1)
        assert parts.book.mark_requeued(reqs, "released") == []  # entry 2 still open
        assert parts.book.entry_at("G", "t", 0, 1) is None
        with pytest.raises(AlreadyRequeued):
            parts.book.lease_of("G", decoded[0])
        last = Requeue("G", "t", 0, 0, 2, placeholder(), 0, None)
        retired = parts.book.mark_requeued([last], "revived")
    assert retired == [("G", "t", 0, 0, decoded[2].expire_at_ms)]
    s = parts.book.statistics()
    assert (s.released, s.dead_lettered, s.revived, s.open_checkpoints) == (1, 1, 1, 0)
    [g] = parts.book.group_statistics()
    assert (g.redelivered, g.dead_lettered, g.in_flight) == (2, 1, 0)


def test_pop_offset_moves_into_the_queue_bounds(parts: Parts) -> None:
    parts.send(4)
    parts.lease("G", 4)
    with parts.book.lock("G", "t"):
        # retention removed entries the group had not reached
        assert parts.book.pop_offset("G", "t", 0, QueueBounds(9, 9, 12)) == 9
        # the queue's tail was lost: new messages take those offsets again
        assert parts.book.pop_offset("G", "t", 0, QueueBounds(0, 0, 6)) == 6
        assert parts.book.next_queue("G", "t") == 0
        assert parts.book.next_queue("G", "t") == 1


def test_forget_topic_drops_leases_and_positions(parts: Parts) -> None:
    parts.send(2)
    parts.lease("G", 1)
    parts.book.forget_topic("t")
    assert parts.book.group_pairs() == [] and parts.book.deadlines() == []
    _reopen(parts)
    assert parts.book.statistics().open_checkpoints == 0 and parts.book.group_pairs() == []
