"""TieredIndex: the key / message-id index of what the tier holds, as compacted hash-slot
files, so a lookup by key in the tier costs one ranged read per index file.

The tiered dispatcher adds every record it uploads: one entry for its message id and
one for its key, if it has one.  Entries collect in the open file (in memory); at
``max_entries`` or ``seal_ms`` the file is sealed: its entries are grouped by hash slot,
so each slot's entries are contiguous (the compacted layout), and the file is uploaded as
one object::

    <broker>/index/<begin commit offset:020d>
        header   ">4sHII"  magic b"CMQX", version 1, slot count, entry count
        slots    slot count x ">II"  (first entry, entry count)
        entries  entry count x ">IIQQ"  (hash, queue ref, queue offset, store time ms),
                 ordered by slot

A 64-bit digest of the indexed text (``m<message id>`` or ``k<topic>\\0<key>``): its CRC32
picks the slot and its Adler-32 is kept as the entry's check hash; collisions are settled
by reading the record.  The queue ref is the file's
n-th (topic, queue, generation), listed in the catalogue.

The catalogue ``<data>/tiered/index/catalog.json`` (copied to ``<broker>/index/catalog.json``
for a broker that mounts the tier read-only) lists the sealed files with their CommitLog
and time ranges, and per queue the queue offset after its last entry in the file: what
follows the last one is what a mount indexes itself (``tiered.mount``).  A local copy of
each file's header and slot table (``<data>/tiered/index/<name>.slots``) turns the slot
lookup into a local ``pread``, so the tier sees one ranged read per file; without it
(another broker) the slot is read from the object first.

Lookups search the open file too (``lookup_open``): local retention may delete a record's
segment long before its file is sealed, and the tier holds the record by then.  Its
entries stay packed (36 bytes each, the digest first), so that search is a byte search
over at most ``max_entries`` entries, with no per-entry objects in memory.

Crash safety: the open file's entries are appended to ``<data>/tiered/index/open`` and
fsynced (``persist``) before the dispatcher writes its checkpoint, and reloaded on start;
records the open or a sealed file already covers are not added again when the dispatcher
replays.  Writes come from the dispatcher's thread, which seals in two steps so the
upload runs beside the queues' (``begin_seal``, ``finish_seal``), and never starts a seal
while an earlier attempt that timed out may still land; ``expire`` (retention) and
lookups from any thread.  No lock is held across tier I/O: given a ``Mirror``, the
catalogue's copy in the tier is handed to it (the dispatcher writes it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from store.clock import Clock
from store.files import write_atomic
from store.message import DispatchInfo
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider
from tiered.uploads import Mirror, Upload

log = logging.getLogger(__name__)

HEADER = struct.Struct(">4sHII")
# the open file on local disk: blocks of one queue's entries
FRAME = struct.Struct(">II")  # payload length, CRC32 of the payload
OPEN_BLOCK = struct.Struct(">IQIH")  # queue id, generation, entry count, topic length; topic
OPEN_ENTRY = struct.Struct(">QQQQI")  # digest, queue offset, store time, commit offset, size
SLOT = struct.Struct(">II")
ENTRY = struct.Struct(">IIQQ")
_DIGEST = struct.Struct(">Q")  # an OPEN_ENTRY's first field
MAGIC = b"CMQX"
ENTRIES_PER_SLOT = 16  # average; a lookup reads about this many entries


def digest(text: bytes) -> int:
    """64 bits of ``text``: Adler-32 (the entry's check hash) over CRC32 (its slot)."""
    return zlib.adler32(text) << 32 | zlib.crc32(text)


def id_digest(message_id: str) -> int:
    return digest(b"m" + message_id.encode())


def key_digest(topic: str, key: str) -> int:
    return digest(b"k" + topic.encode() + b"\0" + key.encode())


def scan(blocks: list[tuple[int, bytes]], d: int) -> list[tuple[int, int, int, int]]:
    """(queue ref, queue offset, store time, commit offset) of each packed OPEN_ENTRY in
    ``blocks`` whose digest is ``d``: a byte search (C speed, no Python work per entry);
    a match not on an entry's boundary is not an entry's digest."""
    needle = _DIGEST.pack(d)
    out = []
    for ref, body in blocks:
        at = body.find(needle)
        while at >= 0:
            if at % OPEN_ENTRY.size:
                at = body.find(needle, at + 1)
                continue
            _, qo, stored, commit, _ = OPEN_ENTRY.unpack_from(body, at)
            out.append((ref, qo, stored, commit))
            at = body.find(needle, at + OPEN_ENTRY.size)
    return out


class IndexHit(NamedTuple):
    topic: str
    queue_id: int
    generation: int
    queue_offset: int
    store_at_ms: int


@dataclass(slots=True)
class IndexFile:
    name: str
    begin_offset: int  # CommitLog range of the records it covers
    end_offset: int
    begin_ms: int
    end_ms: int
    entries: int
    slots: int
    queues: list[tuple[str, int, int]] = field(default_factory=list)
    # per queue (same order): the queue offset after its last entry here; a mount indexes
    # itself what follows the last sealed file (empty: a catalogue written before it)
    ends: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _OpenFile:
    begin_offset: int = -1
    end_offset: int = 0
    begin_ms: int = 0
    end_ms: int = 0
    opened_ms: float = 0.0
    count: int = 0  # entries
    blocks: list[tuple[int, bytes]] = field(default_factory=list)  # (queue ref, OPEN_ENTRYs)
    queues: dict[tuple[str, int, int], int] = field(default_factory=dict)
    names: list[tuple[str, int, int]] = field(default_factory=list)  # ref -> queue
    ends: dict[int, int] = field(default_factory=dict)  # ref -> queue offset after its last

    def entries(self) -> list[tuple[int, int, int, int]]:
        """(digest, queue ref, queue offset, store time) of every entry."""
        return [(d, ref, qo, at) for ref, body in self.blocks
                for d, qo, at, _, _ in OPEN_ENTRY.iter_unpack(body)]
    unsaved: bytearray = field(default_factory=bytearray)  # entries not yet in the open file


def compact(entries: list[tuple[int, int, int, int]]) -> tuple[bytes, int]:
    """The compacted file of ``entries`` (digest, queue ref, queue offset, store time) and
    its slot count."""
    slots = max(1, len(entries) // ENTRIES_PER_SLOT)
    by_slot: list[list[tuple[int, int, int, int]]] = [[] for _ in range(slots)]
    for e in entries:
        by_slot[(e[0] & 0xFFFFFFFF) % slots].append(e)
    table = bytearray()
    body = bytearray()
    first = 0
    for group in by_slot:
        table += SLOT.pack(first, len(group))
        for d, ref, qo, at in group:
            body += ENTRY.pack(d >> 32, ref, qo, at)
        first += len(group)
    return HEADER.pack(MAGIC, 1, slots, len(entries)) + bytes(table) + bytes(body), slots


class TieredIndex:
    def __init__(self, provider: Provider, broker: str, local_dir: str, clock: Clock,
                 max_entries: int = 1 << 20, seal_ms: int = 300_000,
                 mirror: Mirror | None = None) -> None:
        self._provider = provider
        self._mirror = mirror  # None: the catalogue's copy is written at once
        self._prefix = f"{broker}/index"
        self._dir = local_dir
        self._clock = clock
        self.max_entries = max_entries
        self.seal_ms = seal_ms
        self._lock = threading.Lock()  # the catalogue
        self._open = _OpenFile()
        self._sealing: tuple[_OpenFile, int] | None = None  # begin_seal: (file, slots)
        self._late: Upload | None = None  # a seal that timed out: it may still land
        self.files: list[IndexFile] = []
        self.sealed_end = 0

    def open(self) -> TieredIndex:
        """Load the catalogue and the open file's entries from local disk; returns self."""
        os.makedirs(self._dir, exist_ok=True)
        path = os.path.join(self._dir, "catalog.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
            if raw.get("version") != 1:
                raise TierError(f"unknown index catalogue version {raw.get('version')!r}")
            self.sealed_end = raw["sealed_end"]
            self.files = [IndexFile(**{**f, "queues": [tuple(q) for q in f["queues"]]})
                          for f in raw["files"]]
        self._load_open()
        return self

    # ------------------------------------------------------------------ writes

    def _load_open(self) -> None:
        try:
            with open(self._open_path(), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        pos = 0
        while pos + FRAME.size <= len(raw):  # frames: one per persist, all or nothing
            size, crc = FRAME.unpack_from(raw, pos)
            frame = raw[pos + FRAME.size : pos + FRAME.size + size]
            if len(frame) != size or zlib.crc32(frame) != crc:
                break  # a torn tail: its records are replayed
            pos += FRAME.size + size
            at = 0
            while at < len(frame):
                qid, gen, count, tlen = OPEN_BLOCK.unpack_from(frame, at)
                topic = frame[at + OPEN_BLOCK.size : at + OPEN_BLOCK.size + tlen].decode()
                at += OPEN_BLOCK.size + tlen
                body = frame[at : at + count * OPEN_ENTRY.size]
                at += count * OPEN_ENTRY.size
                kept = [e for e in OPEN_ENTRY.iter_unpack(body)  # else sealed (a crash
                        if e[3] + e[4] > self.sealed_end]          # after sealing)
                if kept:
                    self._add_block(topic, qid, gen,
                                    b"".join(OPEN_ENTRY.pack(*e) for e in kept), kept,
                                    kept[-1][1])
        self._open.unsaved.clear()

    @property
    def covered(self) -> int:
        """The CommitLog offset up to which records are indexed (open or sealed)."""
        return self._open.end_offset if self._open.count else self.sealed_end

    def add_batch(self, topic: str, queue_id: int, generation: int,
                  records: list[DispatchInfo], covered: int) -> None:
        """Index one queue's records (message id, and key when set), skipping those
        below ``covered`` (``self.covered`` before this read of the CommitLog began: a
        replay)."""
        crc, adler, pack = zlib.crc32, zlib.adler32, OPEN_ENTRY.pack
        key_prefix = b"k" + topic.encode() + b"\0"
        parts = []
        kept = []
        for r in records:
            if r.commit_offset < covered:
                continue  # a replayed record the index already holds
            kept.append(r)
            text = b"m" + r.message_id.encode()  # digest(), inlined: the hot loop
            parts.append(pack(adler(text) << 32 | crc(text), r.queue_offset, r.store_at_ms,
                              r.commit_offset, r.record_size))
            if r.key:
                text = key_prefix + r.key.encode()
                parts.append(pack(adler(text) << 32 | crc(text), r.queue_offset,
                                  r.store_at_ms, r.commit_offset, r.record_size))
        if parts:
            self._add_block(topic, queue_id, generation, b"".join(parts),
                            [(0, 0, r.store_at_ms, r.commit_offset, r.record_size)
                             for r in (kept[0], kept[-1])], kept[-1].queue_offset)

    def _add_block(self, topic: str, queue_id: int, generation: int, body: bytes,
                   ends: list[tuple[int, int, int, int, int]], last_queue_offset: int) -> None:
        """Add one queue's packed entries; ``ends`` holds (at least) its first and last
        entry, in CommitLog order.  Lookups may read the open file meanwhile: a queue's
        name is listed before a block refers to it."""
        o = self._open
        first, last = ends[0], ends[-1]
        if not o.count:
            o.begin_offset, o.begin_ms = first[3], first[2]
            o.opened_ms = self._clock.monotonic_ms()
        qkey = (topic, queue_id, generation)
        ref = o.queues.get(qkey)
        if ref is None:
            ref = o.queues[qkey] = len(o.queues)
            o.names.append(qkey)
        o.ends[ref] = max(o.ends.get(ref, 0), last_queue_offset + 1)
        n = len(body) // OPEN_ENTRY.size
        o.blocks.append((ref, body))
        o.count += n
        o.end_offset = max(o.end_offset, last[3] + last[4])
        o.end_ms = max(o.end_ms, first[2], last[2])
        name = topic.encode()
        o.unsaved += OPEN_BLOCK.pack(queue_id, generation, n, len(name)) + name + body

    def persist(self) -> None:
        """Make the open file's new entries durable (before the dispatcher's checkpoint
        passes their records)."""
        o = self._open
        if not o.unsaved:
            return
        fd = os.open(self._open_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            payload = bytes(o.unsaved)
            os.write(fd, FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        o.unsaved.clear()

    def _open_path(self) -> str:
        return os.path.join(self._dir, "open")

    def seal_due(self, force: bool = False) -> bool:
        o = self._open
        if not o.count:
            return False
        return (force or o.count >= self.max_entries
                or self._clock.monotonic_ms() - o.opened_ms >= self.seal_ms)

    def seal(self) -> IndexFile | None:
        """Compact, upload and list the open file, at once; None if it is empty.  Raises
        ``TierError`` when the upload fails (the open file stays, to retry)."""
        up = self.begin_seal()
        if up is None:
            return None
        up.start(self._provider, None)
        f = self.finish_seal(up)
        if f is None:
            raise TierError(f"upload of index file {up.path} failed: {up.error()}")
        return f

    def begin_seal(self) -> Upload | None:
        """The open file, compacted, as an upload for the caller to start; None when it
        is empty or an earlier attempt that timed out is still running (a late write
        must never land over a newer one)."""
        late = self._late
        if late is not None and late.future is not None and not late.future.done():
            return None
        self._late = None
        o = self._open
        if not o.count:
            return None
        data, slots = compact(o.entries())
        self._sealing = (o, slots)
        return Upload(f"{self._prefix}/{o.begin_offset:020d}", data)

    def finish_seal(self, up: Upload) -> IndexFile | None:
        """After ``begin_seal``'s upload ended (no ``add_batch`` in between): list the
        file and start a new open one; None (the open file stays) when it failed."""
        assert self._sealing is not None and self._sealing[0] is self._open
        o, slots = self._sealing
        self._sealing = None
        ok = up.outcome()
        if ok is False:
            self._late = up
        if not ok:
            return None
        name = f"{o.begin_offset:020d}"
        write_atomic(self._slots_path(name), up.data[: HEADER.size + slots * SLOT.size])
        queues = sorted(o.queues, key=lambda q: o.queues[q])
        f = IndexFile(name, o.begin_offset, o.end_offset, o.begin_ms, o.end_ms,
                      o.count, slots, queues, [o.ends[o.queues[q]] for q in queues])
        with self._lock:
            self.files.append(f)
            self.sealed_end = o.end_offset
            self._save()
        write_atomic(self._open_path(), b"")  # a crash before this: the load skips them
        self._open = _OpenFile()
        return f

    def expire(self, keep: Callable[[IndexFile], bool]) -> list[str]:
        """Drop the files ``keep(file)`` says no longer hold anything worth finding (all
        their data expired); returns the object paths, to delete after this returns."""
        with self._lock:
            gone = [f for f in self.files if not keep(f)]
            if not gone:
                return []
            self.files = [f for f in self.files if keep(f)]
            self._save()
        for f in gone:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._slots_path(f.name))
        return [f"{self._prefix}/{f.name}" for f in gone]

    def _save(self) -> None:
        """Persist the catalogue locally (caller holds the lock), then its tier copy."""
        text = json.dumps({"version": 1, "sealed_end": self.sealed_end,
                           "files": [asdict(f) for f in self.files]}).encode()
        write_atomic(os.path.join(self._dir, "catalog.json"), text)
        if self._mirror is not None:
            self._mirror.put(f"{self._prefix}/catalog.json", text)
        else:
            self._provider.write(f"{self._prefix}/catalog.json", text)

    def _slots_path(self, name: str) -> str:
        return os.path.join(self._dir, name + ".slots")

    # ------------------------------------------------------------------ lookups

    def lookup(self, d: int, files: list[IndexFile]) -> list[IndexHit]:
        """Entries whose hash matches digest ``d`` in ``files`` (one ranged tier read per
        file that has any candidate in the slot)."""
        hits: list[IndexHit] = []
        for f in files:
            slot = (d & 0xFFFFFFFF) % f.slots
            first, count = self._slot(f, slot)
            if not count:
                continue
            at = HEADER.size + f.slots * SLOT.size + first * ENTRY.size
            raw = self._provider.read(f"{self._prefix}/{f.name}", at, count * ENTRY.size)
            if len(raw) != count * ENTRY.size:
                raise TierError(f"index file {f.name} is shorter than its slot table says")
            want = d >> 32
            for h, ref, qo, stored in ENTRY.iter_unpack(raw):
                if h == want:
                    topic, qid, gen = f.queues[ref]
                    hits.append(IndexHit(topic, qid, gen, qo, stored))
        return hits

    def lookup_open(self, d: int, before_offset: int | None = None) -> list[IndexHit]:
        """Entries whose digest is ``d`` in the open file (not sealed yet: no file in the
        tier lists them), of records below CommitLog offset ``before_offset`` if given.
        Take it before ``snapshot``: a seal in between then shows an entry twice, never
        not at all."""
        o = self._open
        blocks = list(o.blocks)
        names = list(o.names)  # after the blocks: it names every ref they hold
        return [IndexHit(*names[ref], qo, stored) for ref, qo, stored, commit in scan(blocks, d)
                if before_offset is None or commit < before_offset]

    def _slot(self, f: IndexFile, slot: int) -> tuple[int, int]:
        at = HEADER.size + slot * SLOT.size
        try:
            fd = os.open(self._slots_path(f.name), os.O_RDONLY)
        except FileNotFoundError:  # not ours (or lost): read the slot from the object
            try:
                raw = self._provider.read(f"{self._prefix}/{f.name}", at, SLOT.size)
            except TierNotFound:
                return 0, 0  # expired meanwhile
        else:
            try:
                raw = os.pread(fd, SLOT.size, at)
            finally:
                os.close(fd)
        if len(raw) != SLOT.size:
            raise TierError(f"index file {f.name}: slot {slot} is beyond its table")
        first, count = SLOT.unpack(raw)
        return int(first), int(count)

    def snapshot(self) -> list[IndexFile]:
        with self._lock:
            return list(self.files)
