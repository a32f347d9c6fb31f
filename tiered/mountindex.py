"""MountIndex: a departed broker's key index, read by a broker that mounts its tier.

QueryMessages by key or id on a mount (``tiered.mount.MountedBroker``) reads the departed
broker's sealed key-index files (their catalogue's copy in the tier,
``<broker>/index/catalog.json``), the same digests its own broker would look up.  What no
sealed file covers (its open index file, lost with it: at most its last
``tier.index_entries`` / ``tier.index_ms`` of records) the mount indexes itself on the
first query: each queue's records after its entries in the last sealed file that lists it
(the catalogue keeps that queue offset) are read from the tier once, and their digests
kept packed in memory, 36 bytes per id or key (``tiered.index.scan``), for at most
``_TAIL_MAX_RECORDS`` records (more only when the catalogue is lost: logged).  A
catalogue written before it kept those offsets: the tail starts at the first segment
holding data stored after that file ends (less a minute of clock slack).  A lookup of
what was stored since a time (``lookup_since``: a resend's, at a broker that took the
topics over) has a tail of its own, of only what was stored from then on, and reads only
the sealed files of that window that list the topic.

Reading the tail: one queue's log is read in order (``TieredQueue.scan``: its records,
``_TAIL_CHUNK`` at a time against the budget), the queues' at once, ``TAIL_THREADS`` at a time (each
read is an object-store round trip, and a takeover waits for this before it accepts
sends: ``cluster.handover.InheritedIds.warm``).  Their entries are kept in the queues'
order, so the index is the one a read of queue after queue makes.  The queues draw their
reads from one budget of ``_TAIL_MAX_RECORDS`` records: when it runs out (a lost
catalogue), which queues' tails are cut short depends on which reads came first (read
queue after queue: the last ones).  A read that fails (``TierError``) fails the index
and stops the other queues' reads at their next chunk.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from store.clock import SystemClock
from store.consumequeue import ENTRY
from store.message import HEADER
from store.names import DELAYED_STREAM, is_system_stream
from tiered.errors import TierError, TierNotFound
from tiered.flatfile import readers, reading_on
from tiered.index import OPEN_ENTRY, IndexFile, IndexHit, TieredIndex, digest, scan
from tiered.provider import Provider
from tiered.queue import TieredEntry, TieredQueue
from tiered.recentids import (
    QueueRef,
    RecentIds,
    covers,
    decode,
    encode,
    path_of,
    short_of,
)

log = logging.getLogger(__name__)

TAIL_THREADS = 8  # queues whose tails are read at once
_TAIL_CHUNK = 512  # entries read per tier read while indexing the unsealed tail
_TAIL_MAX_RECORDS = 1 << 21  # memory bound of that index (2 entries of 36 bytes each)
_CLOCK_SLACK_MS = 60_000  # a catalogue without queue offsets: store times may step back


class Tail(NamedTuple):
    """What no sealed index file covers, indexed here."""

    entries: list[tuple[int, bytes]]  # (queue ref, packed OPEN_ENTRYs), in queue order
    names: list[QueueRef]  # queue ref -> (topic, queue, generation)
    records: int


class _Index(NamedTuple):
    reader: TieredIndex  # the sealed files' lookups
    files: list[IndexFile]
    tail: Tail
    topics: list[frozenset[str]]  # per sealed file: the topics of its queues


class MountIndex:
    """The key index of broker ``broker``'s queues ``queues`` in the tier on
    ``provider`` (the mount's own dict: a queue it drops is not indexed by a later
    build).  ``work_dir``: a local directory for its index slot caches.  Thread-safe:
    the first lookup builds the index under its lock (other lookups wait for it)."""

    def __init__(self, provider: Provider, broker: str, work_dir: str,
                 queues: Mapping[tuple[str, int], TieredQueue],
                 threads: int = TAIL_THREADS,
                 served_end: Callable[[tuple[str, int]], int | None] = lambda _: None
                 ) -> None:
        self.broker = broker
        self._served_end = served_end
        self._provider = provider
        self._work_dir = work_dir
        self._queues = queues
        self._threads = threads
        self._lock = threading.Lock()
        self._all: _Index | None = None
        self._recent: tuple[int, _Index] | None = None  # (since ms, index)

    def warm(self, since_ms: int) -> None:
        """Index now what ``lookup_since(..., since_ms)`` would at its first call."""
        self._index(since_ms)

    def tail(self, since_ms: int = 0) -> Tail:
        """The tail this index holds (built now if not yet): of everything, or of what
        was stored from ``since_ms`` on."""
        return self._index(since_ms).tail

    def lookup(self, d: int) -> list[IndexHit]:
        """The entries of digest ``d`` (``tiered.index.id_digest`` / ``key_digest``)."""
        index = self._index()
        hits = [IndexHit(*index.tail.names[ref], qo, stored)
                for ref, qo, stored, _ in scan(index.tail.entries, d)]
        return hits + (index.reader.lookup(d, index.files) if index.files else [])

    def lookup_since(self, d: int, topic: str, since_ms: int) -> list[IndexHit]:
        """``lookup`` of records stored at or after ``since_ms`` in ``topic``'s queues
        or the delayed stream: only the sealed files that reach ``since_ms`` and list
        one of them are read (one ranged read each, a file expired meanwhile skipped)."""
        index = self._index(since_ms)
        hits = [IndexHit(*index.tail.names[ref], qo, stored)
                for ref, qo, stored, _ in scan(index.tail.entries, d)]
        for f, topics in zip(index.files, index.topics, strict=True):
            if f.end_ms >= since_ms and (topic in topics or DELAYED_STREAM in topics):
                try:
                    hits += index.reader.lookup(d, [f])
                except TierNotFound:
                    continue
        return [h for h in hits if h.store_at_ms >= since_ms]

    def _index(self, since_ms: int = 0) -> _Index:
        """The sealed files and the tail, built once; with ``since_ms``, a tail of only
        what was stored from then on, kept apart (rebuilt for an earlier time)."""
        with self._lock:
            if since_ms:
                if self._recent is None or self._recent[0] > since_ms:
                    self._recent = since_ms, self._build(since_ms)
                return self._recent[1]
            if self._all is None:
                self._all = self._build(0)
            return self._all

    def _build(self, since_ms: int) -> _Index:
        files = self._catalogue()
        reader = TieredIndex(self._provider, self.broker,
                             os.path.join(self._work_dir, "index"), SystemClock()).open()
        return _Index(reader, files, self._read_tail(files, since_ms),
                      [frozenset(q[0] for q in f.queues) for f in files])

    def _catalogue(self) -> list[IndexFile]:
        try:
            raw = json.loads(self._provider.read(f"{self.broker}/index/catalog.json"))
            return [IndexFile(**{**f, "queues": [tuple(q) for q in f["queues"]]})
                    for f in raw["files"]]
        except TierNotFound:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            log.error("mount of %s: its key-index catalogue is damaged (its records are "
                      "indexed here instead): %s", self.broker, exc)
            return []

    def _read_tail(self, files: list[IndexFile], since_ms: int) -> Tail:
        """Read and index, per queue, the records after the last sealed file's (and
        stored at or after ``since_ms``); the queues at once."""
        ends: dict[QueueRef, int] = {}
        ends_ms: dict[QueueRef, int] = {}
        for f in files:
            for i, queue in enumerate(f.queues):
                if i < len(f.ends):
                    ends[queue] = max(ends.get(queue, 0), f.ends[i])
                else:
                    ends_ms[queue] = max(ends_ms.get(queue, 0), f.end_ms)
        queues = [q for q in list(self._queues.values())  # not the journal's streams:
                  if not is_system_stream(q.topic) or q.topic == DELAYED_STREAM]  # no ids
        refs: dict[QueueRef, int] = {(q.topic, q.queue_id, q.generation):
                                     self._end(q, since_ms) for q in queues}
        kept = self._kept(since_ms, len(files), refs) if since_ms else None
        if kept is not None:  # (``tiered.recentids``: a chain's earlier taker read it)
            names = [ref for ref in refs if ref in kept.bodies]
            tail = Tail([(i, kept.bodies[ref]) for i, ref in enumerate(names)], names,
                        kept.records)
            log.info("mount of %s: %d record(s) no sealed key-index file covers, from its "
                     "recent ids in the tier", self.broker, tail.records)
            return tail
        budget = _Budget(_TAIL_MAX_RECORDS)

        def one(q: TieredQueue) -> tuple[bytes, bool]:
            with reading_on(readers("index-read")):  # not ahead of a takeover's replay
                return _queue_tail(q, _tail_start(q, ends, ends_ms), since_ms, budget,
                                   refs[(q.topic, q.queue_id, q.generation)])

        threads = min(self._threads, len(queues))
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="mount-index") as pool:
                results = list(pool.map(one, queues))
        else:
            results = [one(q) for q in queues]
        tail = Tail([], [], _TAIL_MAX_RECORDS - budget.left)
        for q, (body, _) in zip(queues, results, strict=True):
            if body:
                tail.entries.append((len(tail.names), body))
                tail.names.append((q.topic, q.queue_id, q.generation))
        if any(cut for _, cut in results):
            log.error("mount of %s: more than %d records no sealed key-index file covers "
                      "(its catalogue lost or damaged?); QueryMessages will not find the "
                      "rest (Pop still serves them)", self.broker, tail.records)
        log.info("mount of %s: indexed %d record(s) no sealed key-index file covers",
                 self.broker, tail.records)
        if since_ms and not any(cut for _, cut in results):
            self._keep(RecentIds(since_ms, len(files), tail.records, refs, {
                (q.topic, q.queue_id, q.generation): body
                for q, (body, _) in zip(queues, results, strict=True) if body}))
        return tail

    def _end(self, q: TieredQueue, since_ms: int) -> int:
        """Where ``q``'s tail ends: its committed end, or for a resend's lookup (since a
        time) the end the broker asking serves when it was told one (a commit the
        departed broker had on its way when fenced lands past it, counted by no lookup:
        read by none, and no reason to read the kept recent ids again)."""
        end = q.committed_queue_offset
        served = self._served_end((q.topic, q.queue_id)) if since_ms else None
        return end if served is None else min(end, served)

    def _kept(self, since_ms: int, files: int, ends: dict[QueueRef, int]
              ) -> RecentIds | None:
        """The recent ids kept in the tier (``tiered.recentids``), if they cover this
        read; None: read the queues."""
        try:
            kept = decode(self._provider.read(path_of(self.broker)))
        except TierNotFound:
            return None
        except (TierError, ValueError) as exc:
            log.warning("mount of %s: its recent ids in the tier are unusable (read from "
                        "its queues instead): %s", self.broker, exc)
            return None
        if covers(kept, since_ms, files, ends):
            return kept
        short = short_of(kept, ends)
        log.info("mount of %s: its recent ids in the tier do not cover this read (since "
                 "%d, asked %d; sealed files %d, known %d; queues read short: %s)",
                 self.broker, kept.since_ms, since_ms, kept.files, files, short[:5])
        return None

    def _keep(self, recent: RecentIds) -> None:
        """Keep the recent ids just read in the tier, for the next broker of a chain."""
        try:
            self._provider.write(path_of(self.broker), encode(recent))
        except TierError as exc:  # the next one reads the queues
            log.warning("mount of %s: could not keep its recent ids in the tier: %s",
                        self.broker, exc)




class _Budget:
    """The records the tail's readers may still read, all together: a read takes its
    count first and settles it with what it got.  Thread-safe."""

    def __init__(self, records: int) -> None:
        self._cond = threading.Condition()
        self.left = records
        self._taken = 0  # by reads not settled yet
        self._closed = False

    def take(self, want: int) -> int:
        """Up to ``want`` records to read; 0 when none are left (once the reads under
        way have settled: one may give some back) or after ``close``."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self.left > 0 or not self._taken)
            got = 0 if self._closed else min(want, self.left)
            self.left -= got
            self._taken += got
            return got

    def spent(self) -> bool:
        """Would ``take`` give nothing?"""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self.left > 0 or not self._taken)
            return self._closed or self.left <= 0

    def settle(self, taken: int, read: int) -> None:
        with self._cond:
            self.left += taken - read
            self._taken -= taken
            self._cond.notify_all()

    def close(self) -> None:
        """No more reads: one failed (the index fails with it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _queue_tail(q: TieredQueue, start: int, since_ms: int, budget: _Budget, end: int
                ) -> tuple[bytes, bool]:
    """The packed entries of ``q``'s records from ``start`` (and stored at or after
    ``since_ms``) to ``end``, and whether the budget cut them short."""
    key_prefix = b"k" + q.topic.encode() + b"\0"
    body = bytearray()
    try:
        if since_ms and not budget.spent():  # (its binary search reads too)
            start = first_offset_stored(q, start, end, since_ms)
        entries = q.scan(start)  # its log read alone, in order
        while start < end:
            count = budget.take(min(_TAIL_CHUNK, end - start))
            if not count:
                return bytes(body), True
            got = [e for e in itertools.islice(entries, count) if e.queue_offset < end]
            budget.settle(count, len(got))
            if not got:
                break
            body += b"".join(_tail_entries(key_prefix, e) for e in got)
            start = got[-1].queue_offset + 1
    except BaseException:
        budget.close()
        raise
    return bytes(body), False


def _tail_start(q: TieredQueue, ends: dict[QueueRef, int], ends_ms: dict[QueueRef, int]
                ) -> int:
    """The first queue offset of ``q`` no sealed file covers."""
    key = (q.topic, q.queue_id, q.generation)
    if key in ends:
        return max(ends[key], q.min_queue_offset)
    if key in ends_ms:  # a catalogue without queue offsets: by store time
        position = q.cq.segments_before(ends_ms[key] - _CLOCK_SLACK_MS)
        return q.first_queue_offset + position // ENTRY.size
    return q.min_queue_offset


def _tail_entries(key_prefix: bytes, e: TieredEntry) -> bytes:
    """The packed OPEN_ENTRYs of a record (its id, and its key when set), as the owner's
    ``TieredIndex.add_batch`` made them (no CommitLog position: a mount has none)."""
    h = HEADER.unpack_from(e.record)
    id_len, topic_len, key_len = h[10], h[11], h[12]
    at = HEADER.size
    out = OPEN_ENTRY.pack(digest(b"m" + e.record[at : at + id_len]), e.queue_offset,
                          e.store_at_ms, 0, 0)
    if key_len:
        at += id_len + topic_len
        out += OPEN_ENTRY.pack(digest(key_prefix + e.record[at : at + key_len]),
                               e.queue_offset, e.store_at_ms, 0, 0)
    return out


def first_offset_stored(q: TieredQueue, lo: int, hi: int, at_ms: int) -> int:
    """The first queue offset in ``[lo, hi)`` stored at or after ``at_ms`` (store times
    ascend along a queue), by a binary search of consume-queue entries (a hole or damage
    at a probe: the first readable record after it); ``hi`` if none."""
    while lo < hi:
        mid = (lo + hi) // 2
        at = q.stored_at(mid)
        if at is not None:
            lo, hi = (mid + 1, hi) if at < at_ms else (lo, mid)
            continue
        got = q.read(mid, 1)
        if got and got[0].queue_offset < hi and got[0].store_at_ms < at_ms:
            lo = got[0].queue_offset + 1
        else:
            hi = mid
    return lo
