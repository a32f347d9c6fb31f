"""TieredQueue.scan: a queue read in order from its log alone (what a takeover's journal
replay does) gives what repeated reads give, entry for entry, in about half the tier
requests; damage of the log costs it what it costs ``read``, nothing more, and damage of
the consume queue costs it nothing where the log is whole.  Real
providers (memory, with a counting wrapper), no mock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import tiered.queue
from store.consumequeue import ENTRY
from store.message import Message, encode_record
from store.queues import tag_hash
from tests.tiered.faults import FaultyProvider
from tiered.provider import Provider
from tiered.providers.memory import MemoryProvider
from tiered.queue import TieredEntry, TieredQueue


def _record(qo: int, body_bytes: int = 80) -> bytes:
    return encode_record(Message(f"id{qo}", "t", (b"%d-" % qo).ljust(body_bytes, b"x"),
                                 queue_offset=qo, store_at_ms=1000 + qo,
                                 tag=f"tag{qo % 3}" if qo % 4 else ""))


def _queue(provider: Provider, n: int = 60, batch: int = 1, first: int = 0,
           body_bytes: int = 80) -> TieredQueue:
    """Queue offsets ``first``.. ``first + n - 1``, committed ``batch`` at a time (one
    log and one cq object per commit: a journal commits one record at a time)."""
    q = TieredQueue(provider, "b0", "t", 0, segment_bytes=1 << 20)
    for qo in range(first, first + n):
        tag = f"tag{qo % 3}" if qo % 4 else ""
        q.append(qo, _record(qo, body_bytes), tag_hash(tag), 1000 + qo)
        if (qo - first) % batch == batch - 1:
            assert q.commit()
    assert q.commit()
    return q


def _read_all(q: TieredQueue, start: int = 0) -> list[TieredEntry]:
    got: list[TieredEntry] = []
    while batch := q.read(start, 5000):
        got += batch
        start = batch[-1].queue_offset + 1
    return got


def _fresh(provider: Provider, q: TieredQueue) -> TieredQueue:
    return TieredQueue(provider, "b0", "t", 0, q.to_json())  # as a mount sees it


@pytest.mark.parametrize("start", [0, 1, 37, 99, 100, 150])
def test_a_scan_gives_what_reads_give_in_half_the_requests(start: int) -> None:
    # Given a queue of 100 records committed one at a time, its first offset 3
    counted = FaultyProvider(MemoryProvider())
    q = _queue(counted, n=100, first=3)
    # When it is scanned and read from the same offset
    counted.reads = 0
    scanned = list(_fresh(counted, q).scan(start))
    scan_reads, counted.reads = counted.reads, 0
    read = _read_all(_fresh(counted, q), start)
    # Then both give every entry from there: the same offsets, records, tags, times
    assert scanned == read
    assert [e.queue_offset for e in scanned] == list(range(max(start, 3), 103))
    assert all(e.tag_hash == tag_hash(f"tag{e.queue_offset % 3}" if e.queue_offset % 4
                                      else "") for e in scanned)
    assert all(e.store_at_ms == 1000 + e.queue_offset for e in scanned)
    # and the scan asks the tier for about half as much (the log only, one cq entry)
    if scanned:
        assert scan_reads <= counted.reads // 2 + 1, (scan_reads, counted.reads)


def test_records_larger_than_a_step_and_cut_by_steps_are_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    provider = MemoryProvider()
    q = _queue(provider, n=40, batch=7, body_bytes=3000)
    monkeypatch.setattr(tiered.queue, "SCAN_BYTES", 1000)  # a record spans several steps
    assert list(_fresh(provider, q).scan(0)) == _read_all(q)
    monkeypatch.setattr(tiered.queue, "SCAN_BYTES", 4500)  # steps cut records in two
    assert list(_fresh(provider, q).scan(5)) == _read_all(q, 5)


def _where(q: TieredQueue, qo: int) -> tuple[str, int, int]:
    """The log object holding ``qo``'s record, where it starts in it, and its size."""
    pos, size, _, _ = ENTRY.unpack(q.cq.read(qo * ENTRY.size, ENTRY.size))
    path, offset = q.log.locate(pos)
    return path, offset, size


def _cut_log(provider: Provider, q: TieredQueue, qo: int, keep: int) -> None:
    path = _where(q, qo)[0]
    provider.write(path, provider.read(path)[:keep])


def _flip_log(provider: Provider, q: TieredQueue, qo: int, at: int) -> None:
    path, start, _ = _where(q, qo)
    data = bytearray(provider.read(path))
    data[start + at] ^= 0xFF
    provider.write(path, bytes(data))


def _cut_cq(provider: Provider, q: TieredQueue, qo: int, keep: int) -> None:
    path, _ = q.cq.locate(qo * ENTRY.size)
    provider.write(path, provider.read(path)[:keep])


DAMAGE: dict[str, Callable[[Provider, TieredQueue], None]] = {
    "log object cut in a record": lambda p, q: _cut_log(p, q, 24, 150),
    "log object cut to nothing": lambda p, q: _cut_log(p, q, 24, 0),
    "log object missing": lambda p, q: p.delete(_where(q, 5)[0]),
    "a flipped header byte": lambda p, q: _flip_log(p, q, 33, 40),
    "a flipped body byte": lambda p, q: _flip_log(p, q, 33, 100),
    "a flipped size byte": lambda p, q: _flip_log(p, q, 33, 6),
    "the last log object missing": lambda p, q: p.delete(_where(q, 59)[0]),
}
CQ_DAMAGE: dict[str, Callable[[Provider, TieredQueue], None]] = {
    "cq object cut": lambda p, q: _cut_cq(p, q, 45, ENTRY.size // 2),
    "cq object missing": lambda p, q: p.delete(q.cq.locate(12 * ENTRY.size)[0]),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("batch", [1, 10])
def test_damage_costs_a_scan_what_it_costs_reads(kind: str, batch: int) -> None:
    # Given a queue whose tier copy was damaged
    provider = MemoryProvider()
    q = _queue(provider, n=60, batch=batch)
    DAMAGE[kind](provider, q)
    # When it is scanned, and read, from every offset around the damage
    for start in (0, 20, 24, 33, 45, 58):
        expected = _read_all(_fresh(provider, q), start)
        # Then the scan gives exactly what reads give: every intact entry, nothing else
        assert list(_fresh(provider, q).scan(start)) == expected, (kind, start)
    assert len(_read_all(_fresh(provider, q))) < 60  # the damage did cost something


@pytest.mark.parametrize("kind", sorted(CQ_DAMAGE))
@pytest.mark.parametrize("batch", [1, 10])
def test_a_damaged_consume_queue_costs_a_scan_nothing(kind: str, batch: int) -> None:
    # Given a queue whose consume-queue copy was damaged, its log whole
    provider = MemoryProvider()
    q = _queue(provider, n=60, batch=batch)
    whole = _read_all(q)
    CQ_DAMAGE[kind](provider, q)
    assert len(_read_all(_fresh(provider, q))) < 60  # reads lose the entries it held
    # When it is scanned from before the damage; Then every record is there, as it was
    # (each names its own queue offset, and passes its check)
    for start in (0, 20):
        assert list(_fresh(provider, q).scan(start)) == whole[start:], (kind, start)
