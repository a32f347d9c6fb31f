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

A queue holds no file descriptor of its own: every read and write borrows one from the
shared ``FileCache`` (bounded, least recently used closed first), so the number of queues
does not decide the number of open files.  Loading a queue lists its folder and stats its
newest file; nothing is opened until it is read or written.

Thread-safety: one dispatcher thread writes; any thread may read.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from store.filecache import FileCache
from store.files import fsync_dir

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

    def __init__(self, directory: str, files: FileCache, entries_per_file: int = 300_000,
                 create: bool = True) -> None:
        """``create``: make the folder if it is missing (else it must exist)."""
        self._dir = directory
        self._files = files
        self._per_file = entries_per_file
        self._bases: list[int] = []  # first queue offset of each file, ascending
        self._lock = threading.Lock()  # _bases
        self._dirty: set[int] = set()
        if create:
            os.makedirs(directory, exist_ok=True)
        self.min_offset = 0
        self.max_offset = 0  # one past the last entry
        self._load()

    def _load(self) -> None:
        self._bases = sorted(int(n[:-3]) for n in os.listdir(self._dir) if n.endswith(".cq"))
        if self._bases:
            self.min_offset = self._bases[0]
            last = self._bases[-1]
            self.max_offset = last + os.stat(self._path(last)).st_size // ENTRY.size

    def _path(self, base: int) -> str:
        return os.path.join(self._dir, f"{base:020d}.cq")

    def _write(self, base: int, data: bytes, at: int) -> None:
        if base not in self._dirty:
            with self._lock:
                i = bisect.bisect_left(self._bases, base)
                if i == len(self._bases) or self._bases[i] != base:
                    self._bases.insert(i, base)
        with self._files.use(self._path(base), create=True) as fd:
            os.pwrite(fd, data, at)
        self._dirty.add(base)

    def put_many(self, entries: list[tuple[int, bytes]]) -> None:
        """``(queue_offset, packed entry)`` in ascending offset order, each offset once;
        each run of consecutive entries within one file is written with one ``pwrite``
        (a file's share that is one run is found without looking at each entry)."""
        i, n = 0, len(entries)
        while i < n:
            first = entries[i][0]
            base = first - first % self._per_file
            limit = min(n, i + base + self._per_file - first)  # stay inside this file
            if entries[limit - 1][0] - first == limit - 1 - i:  # ascending: all consecutive
                j = limit
            else:
                j = i + 1
                while j < limit and entries[j][0] == first + (j - i):
                    j += 1
            self._write(base, b"".join([e[1] for e in entries[i:j]]),
                        (first - base) * ENTRY.size)
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
        count = min(count, base + self._per_file - queue_offset)
        try:
            with self._files.use(self._path(base)) as fd:
                data = os.pread(fd, count * ENTRY.size, (queue_offset - base) * ENTRY.size)
        except FileNotFoundError:  # never written, or deleted by retention meanwhile
            return []
        return [
            CqEntry(queue_offset + i, *ENTRY.unpack_from(data, i * ENTRY.size))
            for i in range(len(data) // ENTRY.size)
        ]

    @property
    def dirty_files(self) -> int:
        """Files written since the last flush."""
        return len(self._dirty)

    def flushed(self) -> None:
        """Files written so far were made durable some other way (``syncfs``)."""
        self._dirty = set()

    def flush(self) -> None:
        """fsync every file written since the last flush (through the cache: a file it
        closed meanwhile is opened again; see ``store.filecache``)."""
        dirty, self._dirty = self._dirty, set()
        for base in sorted(dirty):
            try:
                with self._files.use(self._path(base)) as fd:
                    os.fdatasync(fd)
            except FileNotFoundError:  # deleted by retention since it was written
                continue

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
                self._write(base, _HOLE, (last - base) * ENTRY.size)
                cleared += 1
            last -= 1
        self.flush()
        return cleared

    def expire(self, expired: Callable[[CqEntry], bool]) -> None:
        """Move the low mark past the (sorted) prefix of expired entries and delete the
        files below it.  A hole counts as the first entry after it that is not one (none:
        not expired)."""
        lo, hi = self.min_offset, self.max_offset
        first = self._first_entry(lo, hi)
        if first is None or not expired(first):
            return  # the usual case, one read: nothing (more) to expire
        while lo < hi:
            mid = (lo + hi) // 2
            e = self._first_entry(mid, hi)
            if e is not None and expired(e):
                lo = mid + 1
            else:
                hi = mid
        self.set_min_offset(lo)
        self.delete_files_before(lo)

    def _first_entry(self, queue_offset: int, end: int) -> CqEntry | None:
        """The first entry at or after ``queue_offset`` (below ``end``) that is not a hole."""
        while queue_offset < end:
            entries = self.get(queue_offset, min(end - queue_offset, 256))
            if not entries:
                return None
            for e in entries:
                if not e.is_hole:
                    return e
            queue_offset = entries[-1].queue_offset + 1
        return None

    def delete_files_before(self, keep_from_queue_offset: int) -> int:
        """Delete whole files whose entries are all below ``keep_from_queue_offset``."""
        deleted = 0
        with self._lock:
            bases = list(self._bases)
        for base in bases[:-1]:
            if base + self._per_file > keep_from_queue_offset:
                break
            with self._lock:
                self._bases.remove(base)
            path = self._path(base)
            self._files.forget(path)
            os.unlink(path)
            self._dirty.discard(base)
            deleted += 1
        with self._lock:
            if self._bases:
                self.min_offset = max(self.min_offset, self._bases[0])
        return deleted

    def start_at(self, queue_offset: int) -> None:
        """Make an empty queue begin at ``queue_offset`` (a queue taken over from another
        broker continues its offsets): its first file is extended, sparse, to that entry
        and made durable; the entries before it are holes.  No-op when it is there."""
        if self.max_offset >= queue_offset:
            return
        base = queue_offset - queue_offset % self._per_file
        with self._files.use(self._path(base), create=True) as fd:
            os.ftruncate(fd, max(os.fstat(fd).st_size, (queue_offset - base) * ENTRY.size))
            os.fsync(fd)
        fsync_dir(self._dir)
        with self._lock:
            if base not in self._bases:
                bisect.insort(self._bases, base)
            self.min_offset = self._bases[0]
        self.max_offset = queue_offset

    def set_min_offset(self, queue_offset: int) -> None:
        """Logically expire entries below ``queue_offset`` (retention)."""
        self.min_offset = max(self.min_offset, min(queue_offset, self.max_offset))

    def close(self) -> None:
        """Close this queue's descriptors in the cache."""
        with self._lock:
            bases = list(self._bases)
        for base in bases:
            self._files.forget(self._path(base))

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)
