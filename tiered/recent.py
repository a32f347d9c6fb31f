"""RecentRecords: the batches the store's dispatcher just decoded, handed to the tiered
dispatcher so that, while it keeps up, it reuses them instead of decoding the same
CommitLog bytes again.

``offer`` runs on the store dispatcher's thread, ``take`` on the tiered dispatcher's.
Bounded: at most ``limit`` records are held; a tiered dispatcher lagging further behind
decodes from the file instead (``take`` then finds nothing that starts where it reads).
Thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque

from store.message import DispatchInfo

RECENT_RECORDS = 1 << 16  # decoded records held from the store's dispatcher, at most


class RecentRecords:
    def __init__(self, limit: int = RECENT_RECORDS) -> None:
        self._limit = limit
        self._batches: deque[list[DispatchInfo]] = deque()
        self._records = 0
        self._lock = threading.Lock()

    def offer(self, records: list[DispatchInfo]) -> None:
        """The store dispatcher's listener: a batch it dispatched, in log order."""
        with self._lock:
            self._batches.append(records)
            self._records += len(records)
            while self._records > self._limit:  # lagging far behind: decode then
                self._records -= len(self._batches.popleft())

    def take(self, offset: int, length: int) -> tuple[list[DispatchInfo], int]:
        """The offered records that tile ``[offset, offset + length)`` from its start, and
        the bytes they cover; ``([], 0)`` when the offers do not start at ``offset``."""
        out: list[DispatchInfo] = []
        end, limit = offset, offset + length
        with self._lock:
            batches = self._batches
            while batches and batches[0][-1].commit_offset < offset:  # behind us
                self._records -= len(batches.popleft())
            while batches:
                batch = batches[0]
                last = batch[-1]
                batch_end = last.commit_offset + last.record_size
                if batch[0].commit_offset != end or batch_end > limit:
                    break
                out += batch
                end = batch_end
                self._records -= len(batches.popleft())
        return out, end - offset
