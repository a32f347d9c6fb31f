"""TimerFlatFiles: far-future delayed messages parked on the tier, one file per bucket
(default one hour) of due time, so the broker's memory and local disk do not grow with
how far ahead users schedule.

A TimerFlatFile is a sequence of immutable objects (S3 has no append)::

    <prefix>/<bucket start ms:013d>/<first offset:020d>.tff

each holding, in the order written, entries of::

    offset u64 (big-endian) | one whole CommitLog record (``store.message`` framing,
                              CRC-checked when read)

The offset is the entry's identity in the timer store: where the record sits in this
broker's CommitLog, or an *adopted offset* (below) for a message taken over from
another broker.  The object name is the offset of its first entry, so a batch written
again after a crash replaces its earlier copy instead of adding one; the same record in
two objects is harmless (preload keys entries by due time and offset).

**Adopted offsets.**  A broker that takes another over (``cluster.adoption``) schedules
the departed broker's pending messages without appending them to its own CommitLog;
each keeps, in this broker's timer store, journal and TimerFlatFiles, an identity no
CommitLog offset can take (``adopted_offset``), the same at every broker of a chain of
takeovers::

    bit 63      1                 (CommitLog offsets stay below 2**63)
    bits 62-41  origin code       22 bits of BLAKE2b over the name of the broker that
                                  first accepted the message (``origin_code``)
    bits 40-0   queue offset      its record's offset in that broker's delayed stream

**Adopted objects.**  ``adopt`` lists another broker's TimerFlatFile prefix
(``<departed>/timer``) into the table: its objects are read and deleted by this broker's
preload as its own (the far future stays where it is, written once).  Their entries are
read under adopted offsets: an entry whose offset has bit 63 set keeps it; any other is
that broker's CommitLog offset and becomes ``adopted_offset(<its broker>, <the record's
queue offset>)``.  ``recover`` lists the adopted prefixes again at every start.

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

import hashlib
import logging
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedDict

from store.message import HEADER, RECORD_MAGIC, RecordError, check_record
from tiered.provider import Provider

log = logging.getLogger(__name__)

_OFFSET = struct.Struct(">Q")
_ENTRY_HEAD = struct.Struct(">QIII")  # offset, then the record's magic, size and CRC-32
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "big")
ADOPTED = 1 << 63  # bit 63 of an offset: adopted from another broker
ORIGIN_BITS, QUEUE_OFFSET_BITS = 22, 41
MAX_ADOPTED_QUEUE_OFFSET = (1 << QUEUE_OFFSET_BITS) - 1


def origin_code(broker: str) -> int:
    """The 22-bit code of a broker name in adopted offsets."""
    digest = hashlib.blake2b(broker.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - ORIGIN_BITS)


def adopted_offset(broker: str, queue_offset: int) -> int:
    """The identity of the delayed record ``broker`` accepted at ``queue_offset`` of its
    delayed stream, at every broker that adopts it.  Raises ``ValueError`` past
    ``MAX_ADOPTED_QUEUE_OFFSET``."""
    if not 0 <= queue_offset <= MAX_ADOPTED_QUEUE_OFFSET:
        raise ValueError(f"delayed-stream queue offset {queue_offset} of {broker} does not "
                         f"fit an adopted offset (at most {MAX_ADOPTED_QUEUE_OFFSET})")
    return ADOPTED | origin_code(broker) << QUEUE_OFFSET_BITS | queue_offset


def is_adopted(offset: int) -> bool:
    return offset >= ADOPTED


def placed(offset: int, bucket_start_ms: int) -> int:
    """One int for an entry of a bucket's objects: a set of them says which buckets hold
    which offsets (one offset may be in two, a copy moved)."""
    return offset << 64 | bucket_start_ms


def owner_of(path: str) -> str:
    """The broker under whose prefix a TimerFlatFile object is (``<broker>/timer/...``)."""
    return path.split("/", 1)[0]


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

    def recover(self, adopted: Iterable[str] = ()) -> int:
        """Rebuild the table from the tier: this broker's objects and those of the
        ``adopted`` prefixes; returns the number of objects found."""
        with self._lock:
            self._buckets.clear()
        found = self._list(self._prefix)
        for prefix in adopted:
            found.update(self.adopt(prefix))
        return len(found)

    def adopt(self, prefix: str) -> dict[str, int]:
        """Read another broker's TimerFlatFiles (``<broker>/timer``) as this broker's from
        now on (module docstring); returns the objects found, with their buckets."""
        return self._list(prefix)

    def _list(self, prefix: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for path in self.provider.list(prefix + "/"):
            parts = path[len(prefix) + 1 :].split("/")
            if len(parts) == 2 and parts[1].endswith(".tff") and parts[0].isdigit():
                found[path] = int(parts[0])
        with self._lock:
            for path, bucket in found.items():
                objects = self._buckets.setdefault(bucket, [])
                if path not in objects:
                    objects.append(path)
        return found

    def append(self, bucket_start_ms: int, records: list[tuple[int, bytes]]) -> str:
        """Write one batch of ``(offset, record)`` of one bucket as a new object (durable
        on return)."""
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
        """Every valid ``(offset, record)`` of the bucket's objects (``paths``: these ones
        only), CRC-checked; an adopted object's under adopted offsets.  Damage (a cut
        object, a record failing its check) never raises: it is logged at ERROR with the
        object and byte, counted in ``damaged_objects``, and reading goes on at the next
        valid entry of the object.  A tier that cannot be reached still raises
        (``TierError``)."""
        for path in self.objects(bucket_start_ms) if paths is None else paths:
            entries = self._entries(path, self.provider.read(path))
            if path.startswith(self._prefix + "/"):
                yield from entries
            else:
                yield from _adopted_entries(owner_of(path), entries)

    def offsets(self, path: str) -> list[int]:
        """The offsets of one object's valid entries (an adopted object's under adopted
        offsets), as ``read_bucket`` reads them but without copying a record: the fast
        path of a takeover looking at a million entries.  An object with damage is read
        again by ``read_bucket``, which reports it."""
        data = self.provider.read(path)
        foreign = not path.startswith(self._prefix + "/")
        base = adopted_offset(owner_of(path), 0) if foreign else 0
        view, out, pos, end = memoryview(data), [], 0, len(data)
        head, crc32 = _ENTRY_HEAD.unpack_from, zlib.crc32
        try:
            while pos < end:
                offset, magic, total, crc = head(data, pos)
                at = pos + _OFFSET.size
                if magic != RECORD_MAGIC or total < HEADER.size or at + total > end or \
                        crc32(view[at + 12:at + total]) != crc:
                    raise RecordError("damaged")
                if foreign and offset < ADOPTED:
                    qo = _OFFSET.unpack_from(data, at + 16)[0]
                    if qo <= MAX_ADOPTED_QUEUE_OFFSET:
                        out.append(base | qo)
                else:
                    out.append(offset)
                pos = at + total
        except (RecordError, struct.error):
            bucket = int(path.rsplit("/", 2)[-2])
            return [o for o, _ in self.read_bucket(bucket, [path])]
        return out

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

    def foreign_prefixes(self) -> set[str]:
        """The other brokers' prefixes (``<broker>/timer``) of the objects held now: an
        adopted prefix not among them has nothing left to read."""
        mine = self._prefix + "/"
        with self._lock:
            return {f"{owner_of(p)}/timer" for paths in self._buckets.values()
                    for p in paths if not p.startswith(mine)}

    def statistics(self) -> FlatFileStats:
        with self._lock:
            return FlatFileStats(
                buckets=len(self._buckets),
                objects=sum(len(v) for v in self._buckets.values()),
                next_bucket_ms=self._buckets.peekitem(0)[0] if self._buckets else 0,
                damaged_objects=self._damaged_seen)


def _adopted_entries(broker: str, entries: Iterable[tuple[int, bytes]]
                     ) -> Iterator[tuple[int, bytes]]:
    """Entries of ``broker``'s object under adopted offsets (module docstring); one
    whose queue offset fits none (no delayed-stream record) is skipped: nothing adopted
    can name it."""
    base = adopted_offset(broker, 0)
    for offset, record in entries:
        if is_adopted(offset):
            yield offset, record
        elif (qo := _OFFSET.unpack_from(record, 16)[0]) <= MAX_ADOPTED_QUEUE_OFFSET:
            yield base | qo, record


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
