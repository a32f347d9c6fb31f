"""ReadAheadCache: entries fetched from the tier ahead of the consumers, shared by every
group that reads the queue.

A read that the cache cannot serve fetches ``max(needed, window)`` entries of the queue
in one go (one ranged read of the tiered ConsumeQueue and one of the log); the window
works like a congestion window:

* additive increase: each fetch grows the queue's window by the size of the read that
  caused it, up to ``max_window`` entries;
* multiplicative decrease: when cached entries of the queue expire (``ttl_ms``) or are
  evicted (the cache is bounded by ``max_bytes``) before anyone read them, the window is
  halved, down to ``min_window``.

Entries stay until they expire or are evicted, so a second group reading the same range
shortly after the first is served from memory.

Memory: at most ``max_bytes`` (``tier.read_ahead_bytes``) as Python holds it, and
nothing older than ``ttl_ms``.  Each entry counts its record plus ``ENTRY_OVERHEAD``,
what its bookkeeping costs (the entry tuple and its ints, its slots in the queue's
dict, read set and expiry order, their keys; measured: bench/RESULTS.md, "Notes moved
from docstrings").
Thread-safe; fetches run outside the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from store.clock import Clock
from tiered.queue import TieredEntry

Fetch = Callable[[str, int, int, int], list[TieredEntry]]
ENTRY_OVERHEAD = 800  # bytes of bookkeeping per cached entry (measured, see above)


@dataclass(slots=True)
class _QueueCache:
    window: int
    entries: dict[int, TieredEntry] = field(default_factory=dict)
    read: set[int] = field(default_factory=set)  # cached offsets some group has read


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int = 0  # entries served from memory
    fetches: int = 0  # reads that went to the tier
    fetched: int = 0  # entries those reads brought
    expired_unread: int = 0  # entries dropped before any group read them
    bytes: int = 0
    entries: int = 0


@dataclass(slots=True)
class _Counters:
    hits: int = 0
    fetches: int = 0
    fetched: int = 0
    expired_unread: int = 0
    bytes: int = 0


class ReadAheadCache:
    def __init__(self, fetch: Fetch, clock: Clock, max_bytes: int = 64 << 20,
                 ttl_ms: int = 10_000, min_window: int = 32, max_window: int = 4096) -> None:
        self._fetch = fetch
        self._clock = clock
        self.max_bytes = max_bytes
        self.ttl_ms = ttl_ms
        self.min_window = min_window
        self.max_window = max_window
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, int], _QueueCache] = {}
        # every cached entry in insertion (= expiry) order: key -> (expires at, bytes)
        self._order: OrderedDict[tuple[str, int, int], tuple[float, int]] = OrderedDict()
        self._stats = _Counters()

    def window(self, topic: str, queue_id: int) -> int:
        with self._lock:
            q = self._queues.get((topic, queue_id))
            return q.window if q is not None else self.min_window

    def statistics(self) -> CacheStats:
        with self._lock:
            s = self._stats
            return CacheStats(s.hits, s.fetches, s.fetched, s.expired_unread, s.bytes,
                              len(self._order))

    def read(self, topic: str, queue_id: int, queue_offset: int,
             count: int) -> list[TieredEntry]:
        """Up to ``count`` consecutive entries from ``queue_offset`` (or, like
        ``TieredQueue.read``, from the first readable one after damage there)."""
        key = (topic, queue_id)
        with self._lock:
            self._sweep(self._clock.monotonic_ms())
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _QueueCache(self.min_window)
            got: list[TieredEntry] = []
            at = queue_offset
            while len(got) < count:
                e = q.entries.get(at)
                if e is None:
                    break
                got.append(e)
                q.read.add(at)
                at += 1
            self._stats.hits += len(got)
            if len(got) == count:
                return got
            need = count - len(got)
            want = max(need, q.window)
        fetched = self._fetch(topic, queue_id, at, want)
        with self._lock:
            q = self._queues.setdefault(key, q)
            q.window = min(self.max_window, q.window + count)
            self._stats.fetches += 1
            self._stats.fetched += len(fetched)
            expires = self._clock.monotonic_ms() + self.ttl_ms
            for i, e in enumerate(fetched):
                k = (topic, queue_id, e.queue_offset)
                if k in self._order:
                    continue
                size = len(e.record) + ENTRY_OVERHEAD
                q.entries[e.queue_offset] = e
                if i < need:
                    q.read.add(e.queue_offset)
                self._order[k] = (expires, size)
                self._stats.bytes += size
            self._evict_to_bound()
        if got and fetched and fetched[0].queue_offset != at:
            return got  # the tier skipped damaged entries at ``at``: keep the run unbroken
        return got + fetched[:need]

    # ------------------------------------------------------------------ eviction

    def _sweep(self, now: float) -> None:
        halved: set[tuple[str, int]] = set()
        while self._order:
            k, (expires, _size) = next(iter(self._order.items()))
            if expires > now:
                break
            self._drop(k, halved)

    def _evict_to_bound(self) -> None:
        halved: set[tuple[str, int]] = set()
        while self._order and self._stats.bytes > self.max_bytes:
            self._drop(next(iter(self._order)), halved)

    def _drop(self, k: tuple[str, int, int], halved: set[tuple[str, int]]) -> None:
        _expires, size = self._order.pop(k)
        self._stats.bytes -= size
        topic, qid, qo = k
        q = self._queues[(topic, qid)]
        del q.entries[qo]
        if qo in q.read:
            q.read.discard(qo)
            return
        self._stats.expired_unread += 1
        if (topic, qid) not in halved:  # once per sweep: one halving per wasted batch
            halved.add((topic, qid))
            q.window = max(self.min_window, q.window // 2)
