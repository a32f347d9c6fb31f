"""TimerFlatFiles: far-future delayed messages parked on the tier, one file per bucket
(default one hour) of due time, so the broker's memory and local disk do not grow with
how far ahead users schedule.

A TimerFlatFile is a sequence of immutable objects (S3 has no append)::

    <prefix>/<bucket start ms:013d>/<first commit offset:020d>.tff

each holding, in CommitLog order, entries of::

    commit_offset u64 (big-endian) | one whole CommitLog record (``store.message`` framing,
                                     CRC-checked when read)

The offset is where the record sits in the CommitLog, its identity in the timer store.
The object name is the CommitLog offset of its first record, so a
batch written again after a crash replaces its earlier copy instead of adding one; the
same record in two objects is harmless (preload keys entries by due time and offset).

``buckets`` is the sorted table of bucket start -> object paths, rebuilt by ``recover``
from a listing.  Thread-safe.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from sortedcontainers import SortedDict

from store.message import RecordError, check_record
from tiered.errors import TierError
from tiered.provider import Provider

_OFFSET = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class FlatFileStats:
    buckets: int
    objects: int
    next_bucket_ms: int


class TimerFlatFiles:
    def __init__(self, provider: Provider, bucket_ms: int, prefix: str = "timer") -> None:
        self.provider = provider
        self.bucket_ms = bucket_ms
        self._prefix = prefix
        self._lock = threading.Lock()
        self._buckets: SortedDict = SortedDict()  # bucket start ms -> list of object paths

    def bucket_of(self, deliver_at_ms: int) -> int:
        return deliver_at_ms - deliver_at_ms % self.bucket_ms

    def recover(self) -> int:
        """Rebuild the table from the tier; returns the number of objects found."""
        paths = self.provider.list(self._prefix + "/")
        with self._lock:
            self._buckets.clear()
            for path in paths:
                parts = path[len(self._prefix) + 1 :].split("/")
                if len(parts) == 2 and parts[1].endswith(".tff") and parts[0].isdigit():
                    self._buckets.setdefault(int(parts[0]), []).append(path)
        return len(paths)

    def append(self, bucket_start_ms: int, records: list[tuple[int, bytes]]) -> str:
        """Write one batch of ``(commit_offset, record)`` of one bucket as a new object
        (durable on return)."""
        path = f"{self._prefix}/{bucket_start_ms:013d}/{records[0][0]:020d}.tff"
        self.provider.write(path, b"".join(_OFFSET.pack(o) + r for o, r in records))
        with self._lock:
            objects = self._buckets.setdefault(bucket_start_ms, [])
            if path not in objects:
                objects.append(path)
        return path

    def buckets_until(self, start_ms_inclusive: int) -> list[int]:
        """Bucket starts ``<= start_ms_inclusive`` that still have files."""
        with self._lock:
            return list(self._buckets.irange(maximum=start_ms_inclusive))

    def read_bucket(self, bucket_start_ms: int) -> Iterator[tuple[int, bytes]]:
        """Every ``(commit_offset, record)`` of the bucket (CRC-checked)."""
        with self._lock:
            paths = list(self._buckets.get(bucket_start_ms, []))
        for path in paths:
            data = self.provider.read(path)
            pos = 0
            while pos < len(data):
                try:
                    if len(data) - pos < _OFFSET.size:
                        raise RecordError("truncated entry")
                    (offset,) = _OFFSET.unpack_from(data, pos)
                    size = check_record(data, pos + _OFFSET.size)
                except RecordError as exc:
                    raise TierError(f"TimerFlatFile {path} is corrupt at byte {pos}: {exc}; "
                                    "its bucket is left in place") from exc
                start = pos + _OFFSET.size
                yield int(offset), data[start : start + size]
                pos = start + size

    def drop_bucket(self, bucket_start_ms: int) -> None:
        """Delete the bucket's objects (after its records are safely elsewhere)."""
        with self._lock:
            paths = self._buckets.pop(bucket_start_ms, [])
        for path in paths:
            self.provider.delete(path)

    def statistics(self) -> FlatFileStats:
        with self._lock:
            return FlatFileStats(
                buckets=len(self._buckets),
                objects=sum(len(v) for v in self._buckets.values()),
                next_bucket_ms=self._buckets.peekitem(0)[0] if self._buckets else 0)
