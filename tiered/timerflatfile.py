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

A damaged object (cut short, a flipped byte) costs only the entries it damaged:
``read_bucket`` yields every entry that passes its check, finds the next valid one after
damage (the record magic, then a CRC-valid record), and logs and counts what it skipped,
so one bad object never holds up its bucket or the buckets after it.

``buckets`` is the sorted table of bucket start -> object paths, rebuilt by ``recover``
from a listing.  Memory: one path per object of every bucket not yet preloaded (an
object per write batch of ``timer.flat_batch_ms``), and the damaged objects among them.
Thread-safe.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from sortedcontainers import SortedDict

from store.message import RECORD_MAGIC, RecordError, check_record
from tiered.provider import Provider

log = logging.getLogger(__name__)

_OFFSET = struct.Struct(">Q")
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class FlatFileStats:
    buckets: int
    objects: int
    next_bucket_ms: int
    damaged_objects: int = 0  # objects found cut or holding a bad entry (since start)


class TimerFlatFiles:
    def __init__(self, provider: Provider, bucket_ms: int, prefix: str = "timer") -> None:
        self.provider = provider
        self.bucket_ms = bucket_ms
        self._prefix = prefix
        self._lock = threading.Lock()
        self._buckets: SortedDict = SortedDict()  # bucket start ms -> list of object paths
        self._damaged: set[str] = set()  # objects found damaged, until they are dropped
        self._damaged_seen = 0  # every object ever found damaged

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

    def objects(self, bucket_start_ms: int) -> list[str]:
        """The bucket's object paths as of now (read them, then drop exactly these)."""
        with self._lock:
            return list(self._buckets.get(bucket_start_ms, []))

    def read_bucket(self, bucket_start_ms: int, paths: list[str] | None = None
                    ) -> Iterator[tuple[int, bytes]]:
        """Every valid ``(commit_offset, record)`` of the bucket's objects (``paths``:
        these ones only), CRC-checked.  Damage (a cut object, a record failing its
        check) never raises: it is logged at ERROR with the object and byte, counted in
        ``damaged_objects``, and reading goes on at the next valid entry of the object.
        A tier that cannot be reached still raises (``TierError``)."""
        for path in self.objects(bucket_start_ms) if paths is None else paths:
            yield from self._entries(path, self.provider.read(path))

    def _entries(self, path: str, data: bytes) -> Iterator[tuple[int, bytes]]:
        pos = 0
        while pos < len(data):
            try:
                if len(data) - pos < _OFFSET.size:
                    raise RecordError("truncated entry")
                (offset,) = _OFFSET.unpack_from(data, pos)
                size = check_record(data, pos + _OFFSET.size)
            except RecordError as exc:
                nxt = _next_entry(data, pos + 1)
                self._report(path, pos, len(data), nxt, str(exc))
                if nxt < 0:
                    return
                pos = nxt
                continue
            start = pos + _OFFSET.size
            yield int(offset), data[start : start + size]
            pos = start + size

    def _report(self, path: str, pos: int, size: int, nxt: int, reason: str) -> None:
        with self._lock:
            self._damaged_seen += path not in self._damaged
            self._damaged.add(path)
        rest = (f"skipped {nxt - pos} bytes to the next valid entry" if nxt >= 0 else
                f"the {size - pos} bytes left are skipped")
        log.error("damaged TimerFlatFile %s at byte %d of %d: %s; %s", path, pos, size,
                  reason, rest)

    def drop_bucket(self, bucket_start_ms: int, paths: list[str]) -> None:
        """Delete these objects of the bucket: the ones whose records are safely elsewhere
        (read with ``objects``); an object written meanwhile stays."""
        with self._lock:
            objects = self._buckets.get(bucket_start_ms, [])
            doomed = [p for p in objects if p in paths]
            left = [p for p in objects if p not in doomed]
            if left:
                self._buckets[bucket_start_ms] = left
            else:
                self._buckets.pop(bucket_start_ms, None)
            self._damaged.difference_update(doomed)
        for path in doomed:
            self.provider.delete(path)

    def statistics(self) -> FlatFileStats:
        with self._lock:
            return FlatFileStats(
                buckets=len(self._buckets),
                objects=sum(len(v) for v in self._buckets.values()),
                next_bucket_ms=self._buckets.peekitem(0)[0] if self._buckets else 0,
                damaged_objects=self._damaged_seen)


def _next_entry(data: bytes, pos: int) -> int:
    """The first position at or after ``pos`` where a valid entry (offset, then a record
    that passes its check) begins; -1 if none."""
    i = data.find(_MAGIC_BYTES, pos + _OFFSET.size)
    while i >= 0:
        try:
            check_record(data, i)
        except RecordError:
            i = data.find(_MAGIC_BYTES, i + 1)
            continue
        return i - _OFFSET.size
    return -1
