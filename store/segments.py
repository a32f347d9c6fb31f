"""The CommitLog's segment files: ``<base offset, 20 digits>.log`` in one directory, in
offset order.  The newest is the active one (the only one written); the others are
sealed.  A record never spans two segments.

``SegmentFiles`` keeps the open descriptors and finds the segment holding an offset; one
lock guards the list against a roll (``new``), retention (``delete_oldest``) and readers.
Sizes are kept by the CommitLog's writer thread (``Segment.size``).

A reader uses a sealed segment's descriptor only inside ``with files.pinned(...)``: while
it is pinned, retention unlinks the file but leaves the descriptor open, and the last
reader out closes it.  Closed at once, its number could be given to the next file opened
(a new segment, a ConsumeQueue file) and a read already past the lookup would return that
file's bytes as if they were the record asked for.  The active segment is never deleted.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from store.errors import StorageIOError
from store.files import fsync_dir


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: str
    fd: int
    size: int
    readers: int = 0  # pinned by this many reads (guarded by SegmentFiles._lock)
    deleted: bool = False  # unlinked: the last reader closes ``fd``

    @property
    def end(self) -> int:
        return self.base_offset + self.size


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


class SegmentFiles:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._lock = threading.Lock()

    def open_all(self) -> list[Segment]:
        """Open the directory's segments (creating the first when there is none)."""
        os.makedirs(self.directory, exist_ok=True)
        for name in sorted(n for n in os.listdir(self.directory) if n.endswith(".log")):
            path = os.path.join(self.directory, name)
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            self._add(Segment(int(name[:-4]), path, fd, os.fstat(fd).st_size))
        if not self._segments:
            self.new(0)
        return self.all()

    def new(self, base_offset: int) -> Segment:
        """Create the segment starting at ``base_offset``: the active one from now on."""
        path = os.path.join(self.directory, segment_name(base_offset))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.directory)
        seg = Segment(base_offset, path, fd, 0)
        self._add(seg)
        return seg

    def _add(self, seg: Segment) -> None:
        with self._lock:
            self._segments.append(seg)
            self._bases.append(seg.base_offset)

    def all(self) -> list[Segment]:
        with self._lock:
            return list(self._segments)

    @property
    def active(self) -> Segment | None:
        with self._lock:
            return self._segments[-1] if self._segments else None

    @property
    def min_offset(self) -> int:
        with self._lock:
            return self._bases[0] if self._bases else 0

    def at_or_before(self, offset: int) -> Segment | None:
        """The segment ``offset`` falls in, or would (past its end); None below the oldest."""
        with self._lock:
            i = bisect.bisect_right(self._bases, offset) - 1
            return self._segments[i] if i >= 0 else None

    @contextmanager
    def pinned(self, offset: int) -> Iterator[Segment]:
        """The segment holding ``offset``, its descriptor kept open until the block ends;
        ``StorageIOError`` when it is not on disk."""
        with self._lock:
            i = bisect.bisect_right(self._bases, offset) - 1
            seg = self._segments[i] if i >= 0 else None
            if seg is None or offset >= seg.end:
                raise StorageIOError(f"commitlog offset {offset} is not on local disk")
            seg.readers += 1
        try:
            yield seg
        finally:
            self._unpin(seg)

    @contextmanager
    def pinned_for_reading(self, offset: int) -> Iterator[tuple[int, Segment]]:
        """Where a reader at ``offset`` goes on, pinned: the oldest data when retention
        removed ``offset``, the next segment's start when ``offset`` is at the end of one."""
        with self._lock:
            i = bisect.bisect_right(self._bases, offset) - 1
            if i < 0:
                i, offset = 0, self._bases[0]
            seg = self._segments[i]
            if offset >= seg.end and i + 1 < len(self._segments):
                seg = self._segments[i + 1]
                offset = seg.base_offset
            seg.readers += 1
        try:
            yield offset, seg
        finally:
            self._unpin(seg)

    def _unpin(self, seg: Segment) -> None:
        with self._lock:
            seg.readers -= 1
            close = seg.deleted and seg.readers == 0
        if close:
            os.close(seg.fd)

    def sealed(self) -> list[Segment]:
        with self._lock:
            return self._segments[:-1]

    def delete_oldest(self) -> int:
        """Delete the oldest sealed segment; its size in bytes (0: none is sealed)."""
        with self._lock:
            if len(self._segments) < 2:
                return 0
            seg = self._segments.pop(0)
            self._bases.pop(0)
            seg.deleted = True
            close = seg.readers == 0  # else the last reader closes it
        os.unlink(seg.path)
        if close:
            os.close(seg.fd)
        return seg.size

    def close(self) -> None:
        with self._lock:
            for seg in self._segments:
                os.close(seg.fd)
            self._segments.clear()
            self._bases.clear()
