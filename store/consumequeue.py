"""ConsumeQueue: per topic/queue, a dense array of fixed-size entries pointing into the
CommitLog.  Entry ``n`` is the message with queue offset ``n``.

Files: ``<data>/consumequeue/<topic>/<queue_id>/<first_queue_offset:020d>.cq``, each
holding ``entries_per_file`` entries.  Entry layout (big-endian, ``ENTRY.size == 24``)::

    0   8   commit_offset   where the record starts in the CommitLog
    8   4   record_size
    12  4   tag_hash        zlib.crc32 of the tag (0 = no tag), for filtering without a read
    16  8   store_at_ms     for time-based retention and seeking

Writes are ``pwrite`` at ``queue_offset * 24``: idempotent, so a dispatcher replaying the
CommitLog after a crash rewrites identical bytes instead of appending duplicates.

A *hole* is an entry of zeros (``record_size == 0``, ``CqEntry.is_hole``): a queue offset
with no message, never to be read.  Holes replace the entries of records a torn tail took
(``clear_beyond``: the queue keeps its end, so queue offsets a consumer group may already
have passed are never given to new messages) and fill the slot of a damaged record the
dispatcher skipped (the file has zeros there).

Thread-safety: one dispatcher thread writes; any thread may read.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
from dataclasses import dataclass

ENTRY = struct.Struct(">QIIQ")
assert ENTRY.size == 24
_HOLE = bytes(ENTRY.size)


@dataclass(frozen=True, slots=True)
class CqEntry:
    queue_offset: int
    commit_offset: int
    record_size: int
    tag_hash: int
    store_at_ms: int

    @property
    def is_hole(self) -> bool:
        """No message has this queue offset (see the module docstring): skip it."""
        return self.record_size == 0


class ConsumeQueue:
    """One topic/queue's entries.  Writer: the dispatcher thread; readers: any thread."""

    def __init__(self, directory: str, entries_per_file: int = 300_000) -> None:
        self._dir = directory
        self._per_file = entries_per_file
        self._fds: dict[int, int] = {}  # first queue offset of a file -> fd
        self._lock = threading.Lock()
        self._dirty: set[int] = set()
        os.makedirs(directory, exist_ok=True)
        self.min_offset = 0
        self.max_offset = 0  # one past the last entry
        self._load()

    def _load(self) -> None:
        bases = sorted(int(n[:-3]) for n in os.listdir(self._dir) if n.endswith(".cq"))
        for base in bases:
            self._fds[base] = os.open(self._path(base), os.O_RDWR)
        if bases:
            self.min_offset = bases[0]
            last = bases[-1]
            size = os.fstat(self._fds[last]).st_size
            self.max_offset = last + size // ENTRY.size

    def _path(self, base: int) -> str:
        return os.path.join(self._dir, f"{base:020d}.cq")

    def _fd(self, base: int, create: bool) -> int | None:
        fd = self._fds.get(base)
        if fd is None and create:
            fd = os.open(self._path(base), os.O_RDWR | os.O_CREAT, 0o644)
            with self._lock:
                self._fds[base] = fd
        return fd

    def put_many(self, entries: list[tuple[int, bytes]]) -> None:
        """``(queue_offset, packed entry)`` in offset order; each run of consecutive
        entries within one file is written with one ``pwrite``."""
        i, n = 0, len(entries)
        while i < n:
            first = entries[i][0]
            base = first - first % self._per_file
            limit = min(n, i + base + self._per_file - first)  # stay inside this file
            j = i + 1
            while j < limit and entries[j][0] == first + (j - i):
                j += 1
            fd = self._fd(base, create=True)
            assert fd is not None
            os.pwrite(fd, b"".join([e[1] for e in entries[i:j]]), (first - base) * ENTRY.size)
            self._dirty.add(base)
            if first + (j - i) > self.max_offset:
                self.max_offset = first + (j - i)
            i = j

    def get(self, queue_offset: int, count: int) -> list[CqEntry]:
        """Up to ``count`` entries from ``queue_offset`` (fewer at the end of a file)."""
        if queue_offset < self.min_offset:
            queue_offset = self.min_offset
        count = min(count, self.max_offset - queue_offset)
        if count <= 0:
            return []
        base = queue_offset - queue_offset % self._per_file
        with self._lock:
            fd = self._fds.get(base)
        if fd is None:
            return []
        count = min(count, base + self._per_file - queue_offset)
        data = os.pread(fd, count * ENTRY.size, (queue_offset - base) * ENTRY.size)
        return [
            CqEntry(queue_offset + i, *ENTRY.unpack_from(data, i * ENTRY.size))
            for i in range(len(data) // ENTRY.size)
        ]

    def flush(self) -> None:
        """fsync every file written since the last flush."""
        dirty, self._dirty = self._dirty, set()
        for base in dirty:
            fd = self._fds.get(base)
            if fd is not None:
                os.fdatasync(fd)

    def clear_beyond(self, commit_end: int) -> int:
        """Turn trailing entries that point at or past ``commit_end`` (a lost CommitLog
        tail) into holes, durably; ``max_offset`` stays.  Returns the entries cleared."""
        cleared, last = 0, self.max_offset - 1
        while last >= self.min_offset:
            entries = self.get(last, 1)
            if not entries:
                break
            e = entries[0]
            if not e.is_hole:
                if e.commit_offset < commit_end:
                    break
                base = last - last % self._per_file
                os.pwrite(self._fds[base], _HOLE, (last - base) * ENTRY.size)
                self._dirty.add(base)
                cleared += 1
            last -= 1
        self.flush()
        return cleared

    def delete_files_before(self, keep_from_queue_offset: int) -> int:
        """Delete whole files whose entries are all below ``keep_from_queue_offset``."""
        deleted = 0
        with self._lock:
            bases = sorted(self._fds)
        for base in bases[:-1]:
            if base + self._per_file > keep_from_queue_offset:
                break
            with self._lock:
                fd = self._fds.pop(base)
            os.close(fd)
            os.unlink(self._path(base))
            self._dirty.discard(base)
            deleted += 1
        with self._lock:
            if self._fds:
                self.min_offset = max(self.min_offset, min(self._fds))
        return deleted

    def set_min_offset(self, queue_offset: int) -> None:
        """Logically expire entries below ``queue_offset`` (retention)."""
        self.min_offset = max(self.min_offset, min(queue_offset, self.max_offset))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)
