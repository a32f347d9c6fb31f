"""ReadAheadCache over a real TieredQueue: one tier fetch serves many reads, the window
grows additively and halves when read-ahead expires unread, the byte bound holds, and
a second group is served from memory."""

from __future__ import annotations

import tracemalloc

from store.clock import ManualClock
from store.message import Message, encode_record
from tests.tiered.faults import FaultyProvider
from tiered.providers.memory import MemoryProvider
from tiered.queue import TieredQueue
from tiered.readahead import ENTRY_OVERHEAD, ReadAheadCache


def _queue(n: int) -> tuple[TieredQueue, FaultyProvider]:
    provider = FaultyProvider(MemoryProvider())
    q = TieredQueue(provider, "b0", "t", 0)
    for qo in range(n):
        q.append(qo, encode_record(Message(f"id{qo}", "t", b"x" * 100, queue_offset=qo)),
                 0, 1000 + qo)
    assert q.commit()
    return q, provider


def _cache(q: TieredQueue, clock: ManualClock, **kw: int) -> ReadAheadCache:
    return ReadAheadCache(lambda t, qid, qo, n: q.read(qo, n), clock, min_window=32,
                          max_window=256, **kw)


def test_one_fetch_serves_the_reads_that_follow(manual_clock: ManualClock) -> None:
    q, provider = _queue(1000)
    cache = _cache(q, manual_clock)
    got = []
    for at in range(0, 64, 8):
        batch = cache.read("t", 0, at, 8)
        assert [e.queue_offset for e in batch] == list(range(at, at + 8))
        got += batch
    assert [e.record for e in got] == [e.record for e in q.read(0, 64)]
    s = cache.statistics()
    assert s.fetches == 2 and s.hits == 48  # 0..31 then 32..71 (window 32 + 8)
    assert provider.reads == 2 * 2 + 2  # each fetch: one cq read and one log read
    # a second group reading the same range costs the tier nothing
    before = provider.reads
    assert [e.queue_offset for e in cache.read("t", 0, 0, 32)] == list(range(32))
    assert provider.reads == before


def test_window_grows_additively_and_halves_when_read_ahead_expires_unread(
        manual_clock: ManualClock) -> None:
    q, _ = _queue(2000)
    cache = _cache(q, manual_clock, ttl_ms=1000)
    at = 0
    windows = []
    for _ in range(6):  # each read misses at the window's end: +16 per fetch
        cache.read("t", 0, at, 16)
        windows.append(cache.window("t", 0))
        at += cache.window("t", 0) + 100  # skip ahead: the next read misses
    assert windows == [48, 64, 80, 96, 112, 128]
    manual_clock.advance(1001)  # everything cached expires, most of it unread
    cache.read("t", 0, 1900, 1)
    assert cache.window("t", 0) == 128 // 2 + 1
    assert cache.statistics().expired_unread > 0


def test_the_cache_stays_within_its_byte_bound(manual_clock: ManualClock) -> None:
    q, _ = _queue(2000)
    entry = len(q.read(0, 1)[0].record) + ENTRY_OVERHEAD
    cache = _cache(q, manual_clock, max_bytes=50 * entry)
    for at in range(0, 1000, 10):
        assert len(cache.read("t", 0, at, 10)) == 10
        assert cache.statistics().bytes <= 50 * entry
    assert cache.window("t", 0) < 256  # evicting unread read-ahead halved it


def test_the_byte_bound_holds_for_what_python_keeps(manual_clock: ManualClock) -> None:
    # Given a 4 MiB cache over small records (100-byte bodies), read ahead far
    q, _ = _queue(30_000)
    cache = _cache(q, manual_clock, max_bytes=4 << 20)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for at in range(0, 30_000, 32):
            cache.read("t", 0, at, 32)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # Then the entries it keeps (over 4,000) take no more than the bound in memory
    assert cache.statistics().entries > 4_000
    assert held <= (4 << 20) * 1.1
