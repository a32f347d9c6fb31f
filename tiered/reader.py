"""TieredReader: decides, per queue and read, whether Pop reads the local store or the
tier, and reads the tier through the shared read-ahead cache.

The read strategy (``tier.read``):

``disable``      never read the tier (what local retention deleted is gone for Pop);
``not_in_disk``  read the tier only below the oldest queue offset still on local disk
                 (default);
``not_in_mem``   also read the tier for data outside the local hot window, the newest
                 ``hot_bytes`` of the CommitLog (the part the page cache can be expected to
                 hold), when the tier already has it: a consumer far behind then costs
                 the tier, not the local disk the producers write to;
``force``        read everything the tier has committed from the tier (tests, and
                 checking the tier).

In every strategy data the tier does not have yet is read locally.

QueryMessages falls through to the tier's key index (``tiered.index``: its open file,
then its sealed files) for what local retention deleted, in every strategy but
``disable``.
"""

from __future__ import annotations

import contextlib

from store.errors import StoreError
from store.message import Message, decode_record
from store.store import MessageStore
from tiered.dispatcher import TieredDispatcher
from tiered.index import IndexFile, IndexHit, id_digest, key_digest
from tiered.queue import TieredEntry
from tiered.readahead import ReadAheadCache

STRATEGIES = ("disable", "not_in_disk", "not_in_mem", "force")


class TieredReader:
    def __init__(self, dispatcher: TieredDispatcher, store: MessageStore, strategy: str,
                 cache: ReadAheadCache | None = None, hot_bytes: int = 1 << 30) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown tier read strategy {strategy!r}: use one of "
                             f"{', '.join(STRATEGIES)}")
        self._dispatcher = dispatcher
        self._store = store
        self.strategy = strategy
        self.cache = cache
        self.hot_bytes = hot_bytes

    def min_queue_offset(self, topic: str, queue_id: int) -> int | None:
        if self.strategy == "disable":
            return None
        return self._dispatcher.min_queue_offset(topic, queue_id)

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        """The queue offset below which Pop reads this queue from the tier."""
        if self.strategy in ("disable", "not_in_disk"):
            return local_low
        q = self._dispatcher.queue(topic, queue_id)
        tier_end = q.committed_queue_offset if q is not None else -1
        if tier_end <= local_low:
            return local_low
        if self.strategy == "force":
            return tier_end
        cl = self._store.commitlog
        hot_start = cl.confirmed_offset - self.hot_bytes
        if hot_start <= cl.min_offset:
            return local_low  # all of the local CommitLog is hot
        lo, hi = local_low, tier_end  # first queue offset whose record is hot
        while lo < hi:  # a hole counts as hot: read locally, where Pop skips it
            mid = (lo + hi) // 2
            e = self._store.consume_queue_entries(topic, queue_id, mid, 1)
            if e and not e[0].is_hole and e[0].commit_offset < hot_start:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def read(self, topic: str, queue_id: int, queue_offset: int,
             count: int) -> list[TieredEntry]:
        """Up to ``count`` consecutive entries from the first readable queue offset at or
        after ``queue_offset`` (``TieredQueue.read``: damaged ones are skipped)."""
        if self.cache is not None:
            got = self.cache.read(topic, queue_id, queue_offset, count)
        else:
            got = self._dispatcher.read(topic, queue_id, queue_offset, count)
        return got or self._local_after_damage(topic, queue_id, queue_offset, count)

    def _local_after_damage(self, topic: str, queue_id: int, queue_offset: int,
                            count: int) -> list[TieredEntry]:
        """Nothing readable is left in the tier from ``queue_offset`` (all of it damaged,
        reported by the tier) below the oldest entry on local disk: go on there, so a
        reader is never stuck in front of the damage."""
        local_low, _ = self._store.queue_bounds(topic, queue_id)
        if queue_offset >= local_low or count <= 0:
            return []
        out = []
        for e in self._store.consume_queue_entries(topic, queue_id, local_low, count):
            record = b""  # a hole, or gone meanwhile: the reader's record check skips it
            if not e.is_hole:
                with contextlib.suppress(StoreError):
                    record = self._store.commitlog.read(e.commit_offset, e.record_size)
            out.append(TieredEntry(e.queue_offset, e.tag_hash, e.store_at_ms, record))
        return out

    # ------------------------------------------------------------------ queries

    def query_by_message_id(self, message_id: str, commit_offset: int | None) -> list[Message]:
        """The record with this id in the tier.  ``commit_offset`` (what a broker-assigned
        id names) narrows the search to the one index file that covers it."""
        if self.strategy == "disable":
            return []
        index, d = self._dispatcher.index, id_digest(message_id)
        for m in self._messages(index.lookup_open(d)):  # before the snapshot (a seal)
            if m.message_id == message_id:
                return [m]
        files = index.snapshot()
        if commit_offset is not None:
            files = [f for f in files if f.begin_offset <= commit_offset < f.end_offset]
        for f in reversed(files):
            for m in self._messages(index.lookup(d, [f])):
                if m.message_id == message_id:
                    return [m]
        return []

    def query_by_key(self, topic: str, key: str, limit: int, before_offset: int,
                     exclude: set[tuple[int, int]]) -> list[Message]:
        """The newest ``limit`` messages of ``topic`` with ``key`` among records below
        CommitLog offset ``before_offset`` (the open index file's, then the sealed files'),
        skipping (queue, queue offset) pairs in ``exclude``; oldest first."""
        if self.strategy == "disable" or limit <= 0:
            return []
        index, d = self._dispatcher.index, key_digest(topic, key)
        skip = set(exclude)

        def matching(hits: list[IndexHit]) -> list[Message]:
            out = [m for m in self._messages(hits) if m.topic == topic and m.key == key
                   and (m.queue_id, m.queue_offset) not in skip]
            skip.update((m.queue_id, m.queue_offset) for m in out)  # a seal in between
            return sorted(out, key=lambda m: (m.store_at_ms, m.queue_id, m.queue_offset))

        found = matching(index.lookup_open(d, before_offset))  # before the snapshot
        files: list[IndexFile] = [f for f in index.snapshot() if f.begin_offset < before_offset]
        for f in reversed(files):  # newest file first
            if len(found) >= limit:
                break
            found = matching(index.lookup(d, [f])) + found
        return found[-limit:]

    def _messages(self, hits: list[IndexHit]) -> list[Message]:
        out = []
        for h in hits:
            q = self._dispatcher.queue(h.topic, h.queue_id)
            if q is None or q.generation != h.generation:
                continue  # a deleted topic's old generation
            entries = q.read(h.queue_offset, 1)
            if entries and entries[0].queue_offset == h.queue_offset:
                out.append(decode_record(entries[0].record))
        return out
