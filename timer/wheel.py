"""A hierarchical timing wheel (Varghese & Lauck; the shape Kafka's purgatory uses).

Level ``i`` has ``slots`` buckets of width ``tick_ms * slots**i``; an entry goes into the
lowest level whose span covers its due time, and cascades down a level each time the
bucket holding it comes due, until it expires at the bottom level, which has ``tick_ms``
resolution.  Non-empty buckets sit in a heap by expiry, so ``advance`` costs time in
proportion to the buckets that come due, not to the time crossed: a manual clock can jump
hours in one call.

The wheel is pure data: no threads, no clock.  ``advance(now_ms)`` returns the entries
whose due time is ``<= now_ms``; it never returns one early.  Removal is O(1) through an
index of where each key sits.

Each key points at its bucket object (``_Bucket``: the entries and the bucket's id), not
at the id: a bucket whose entries share one due time (a hot instant, a million messages
due at one millisecond) cascades down the levels by changing its id, touching no key,
and a bottom bucket that comes due fires by ``popitem`` from its end.

Memory: the entries it holds, and one heap entry per bucket id (level, expiry).  A
bucket that empties leaves its heap entry behind (skipped when it comes up); a new
bucket with the same id reuses it instead of pushing another, so adding and removing
keys (leases acked at once, cancels) never piles up stale heap entries.
Not thread-safe: the owner serialises access.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
BucketId = tuple[int, int]  # (level, expiry_ms)


class _Bucket(dict[Any, int]):
    """A bucket's entries (key -> due_ms) and its id, which changes when it moves whole."""

    __slots__ = ("id",)

    def __init__(self, bucket_id: BucketId) -> None:
        super().__init__()
        self.id = bucket_id


class TimingWheel(Generic[K]):
    def __init__(self, tick_ms: int = 1, slots: int = 64, levels: int = 4,
                 start_ms: int = 0) -> None:
        if tick_ms < 1 or slots < 2 or levels < 1:
            raise ValueError("tick_ms >= 1, slots >= 2, levels >= 1")
        self.tick_ms = tick_ms
        self.slots = slots
        self.levels = levels
        self._widths: list[int] = [tick_ms * int(slots**i) for i in range(levels)]
        self._current_ms = start_ms - start_ms % tick_ms
        self._buckets: dict[BucketId, _Bucket] = {}  # by id: every non-empty bucket
        self._heap: list[tuple[int, int]] = []  # (expiry_ms, level) of non-empty buckets
        self._in_heap: set[BucketId] = set()  # bucket ids with a heap entry
        self._where: dict[K, _Bucket] = {}  # each key's bucket (holding it)
        self._overflow: dict[K, int] = {}  # beyond the top level's span

    def __len__(self) -> int:
        return len(self._where) + len(self._overflow)

    def __contains__(self, key: K) -> bool:
        return key in self._where or key in self._overflow

    @property
    def span_ms(self) -> int:
        """How far ahead of the current time the wheel's levels reach."""
        return self._widths[-1] * self.slots

    def add(self, key: K, due_ms: int) -> bool:
        """Schedule ``key``; returns False if it is already due (the caller fires it)."""
        self.remove(key)
        return self._place(key, due_ms)

    def _place(self, key: K, due_ms: int) -> bool:
        if due_ms < self._current_ms + self.tick_ms:
            return False
        for level, width in enumerate(self._widths):
            if due_ms < self._current_ms + width * self.slots:
                bucket = self._bucket((level, due_ms - due_ms % width))
                bucket[key] = due_ms
                self._where[key] = bucket
                return True
        self._overflow[key] = due_ms
        return True

    def remove(self, key: K) -> bool:
        bucket = self._where.pop(key, None)
        if bucket is not None:
            del bucket[key]
            if not bucket:  # the heap entry goes stale and is skipped later
                del self._buckets[bucket.id]
            return True
        return self._overflow.pop(key, None) is not None

    def next_expiry_ms(self) -> int | None:
        """When ``advance`` next has work (a bucket comes due), or None if empty."""
        while self._heap:
            expiry, level = self._heap[0]
            if (level, expiry) in self._buckets:
                return max(expiry, self._current_ms)
            self._pop()  # stale: the bucket emptied
        if self._overflow:
            # the first tick at which the levels reach the earliest overflow entry
            pull_at = min(self._overflow.values()) - self.span_ms + 1
            return pull_at + (-pull_at) % self.tick_ms
        return None

    def advance(self, now_ms: int, limit: int | None = None) -> list[tuple[K, int]]:
        """Move the wheel to ``now_ms``; return ``(key, due_ms)`` of the entries due, at
        most ``limit`` of them (the rest stay due and come with the next call)."""
        fired: list[tuple[K, int]] = []
        cap = limit if limit is not None else -1
        now_tick = now_ms - now_ms % self.tick_ms
        while len(fired) != cap:
            self._pull_overflow()
            if not self._heap or self._heap[0][0] > now_ms:
                if self._current_ms >= now_tick:
                    break
                self._current_ms = now_tick  # nothing else due: move, then pull again
                continue
            expiry, level = self._heap[0]
            bucket = self._buckets.get((level, expiry))
            if bucket is None:
                self._pop()  # stale heap entry
                continue
            self._current_ms = max(self._current_ms, expiry - expiry % self.tick_ms)
            if level > 0:
                self._cascade((level, expiry), bucket)
                continue
            if expiry + self.tick_ms <= now_ms + 1:  # the whole tick is due: take in bulk
                self._fire_whole(bucket, fired, cap)
            while bucket and len(fired) != cap:
                key, due = bucket.popitem()
                del self._where[key]
                if due <= now_ms:
                    fired.append((key, due))
                elif not self._place(key, due):  # later than now, inside the current tick
                    self._place_exact(key, due)
            if not bucket and self._buckets.get((level, expiry)) is bucket:
                del self._buckets[(level, expiry)]
                self._pop()
        return fired

    def _fire_whole(self, bucket: _Bucket, fired: list[tuple[K, int]], cap: int) -> None:
        """Fire a due bottom bucket's entries, up to ``cap`` in all (-1: no cap), from
        its end (``popitem``: no search through the entries already taken)."""
        where = self._where
        n = len(bucket) if cap < 0 else min(len(bucket), cap - len(fired))
        if n == len(bucket):
            fired += bucket.items()
            for key in bucket:
                del where[key]
            bucket.clear()
            return
        take = [bucket.popitem() for _ in range(n)]
        for key, _ in take:
            del where[key]
        fired += take

    def _cascade(self, bucket_id: BucketId, bucket: _Bucket) -> None:
        """Move a higher level's bucket that came due down the levels (a due entry to an
        exact bottom bucket, which ``advance`` fires next).  A bucket whose entries share
        one due time (a hot instant: a million messages due at one millisecond) moves
        whole: it takes the new id, or the smaller of it and the bucket there already
        goes into the larger."""
        del self._buckets[bucket_id]
        self._pop()
        dues = set(bucket.values())
        if len(dues) > 1:
            for key, due in bucket.items():
                if not self._place(key, due):
                    self._place_exact(key, due)
            return
        target_id = self._bucket_for(dues.pop())
        target = self._buckets.get(target_id)
        if target is None:
            bucket.id = target_id  # the whole bucket moves; its keys point at it still
            self._buckets[target_id] = bucket
            self._push(target_id)
            return
        if len(bucket) > len(target):
            bucket, target = target, bucket
            target.id = target_id
            self._buckets[target_id] = target
        target.update(bucket)
        self._where.update(dict.fromkeys(bucket, target))

    def _bucket(self, bucket_id: BucketId) -> _Bucket:
        """The bucket with this id, made (with its heap entry) if there is none."""
        bucket = self._buckets.get(bucket_id)
        if bucket is None:
            bucket = self._buckets[bucket_id] = _Bucket(bucket_id)
            self._push(bucket_id)
        return bucket

    def _bucket_for(self, due_ms: int) -> BucketId:
        """The bucket ``_place`` (or, for an entry due now, ``_place_exact``) picks."""
        if due_ms >= self._current_ms + self.tick_ms:
            for level, width in enumerate(self._widths):
                if due_ms < self._current_ms + width * self.slots:
                    return (level, due_ms - due_ms % width)
        return (0, due_ms)

    def _place_exact(self, key: K, due_ms: int) -> None:
        bucket = self._bucket((0, due_ms))
        bucket[key] = due_ms
        self._where[key] = bucket

    def _push(self, bucket_id: BucketId) -> None:
        """Give a new bucket a heap entry, unless an emptied namesake left one there."""
        if bucket_id not in self._in_heap:
            self._in_heap.add(bucket_id)
            heapq.heappush(self._heap, (bucket_id[1], bucket_id[0]))

    def _pop(self) -> None:
        expiry, level = heapq.heappop(self._heap)
        self._in_heap.discard((level, expiry))

    def _pull_overflow(self) -> None:
        """Bring entries the levels now reach out of the overflow (due ones into an exact
        bucket, so ``advance`` fires them within its limit)."""
        if not self._overflow:
            return
        horizon = self._current_ms + self.span_ms
        ready = [(k, d) for k, d in self._overflow.items() if d < horizon]
        for key, due in ready:
            del self._overflow[key]
            if not self._place(key, due):
                self._place_exact(key, due)
