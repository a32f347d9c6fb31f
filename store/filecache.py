"""FileCache: a bounded set of open file descriptors, by path; the least recently used
one is closed when the set is full (RocksDB's table cache and its ``max_open_files``).

The ConsumeQueue files go through one cache, so a broker with tens of thousands of
queues holds at most ``max_open`` of their descriptors (``store.openfiles`` sizes it from
RLIMIT_NOFILE).  A file is opened on first use and stays open until it is evicted,
``forget``-ten (deleted) or the cache is closed.

A descriptor is used inside ``with cache.use(path) as fd:`` only: while any thread is
inside that block the descriptor is *pinned* and never closed, so its number cannot be
reused for another file under the caller's feet.  When every open descriptor is pinned
the cache holds more than ``max_open`` for a moment (at most one per thread in a
``use`` block) and closes the extra ones as they are released.

Closing an evicted file does not sync it.  Its writes stay in the page cache, and a
later ``fdatasync`` through a new descriptor of the same file makes them durable: Linux
syncs the file (the inode), not the descriptor, and since 4.16 reports a writeback error
that no one has seen yet to the next fsync of the file, even through a descriptor opened
after it; PostgreSQL relies on the same when it closes and reopens files between a write
and its checkpoint's fsync.

Thread-safe.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FileCacheStats:
    open_files: int  # descriptors open now
    max_open: int
    opens: int  # files opened (a miss)
    hits: int  # uses that found the file open
    evictions: int  # descriptors closed to stay within max_open


class FileCache:
    """Open descriptors by path, at most ``max_open`` of them (see the module docstring)."""

    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError("a file cache holds at least one file")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._fds: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._pins: dict[int, int] = {}  # fd -> uses in progress
        self._closing: set[int] = set()  # forgotten while pinned: closed at release
        self._opens = self._hits = self._evictions = 0

    @contextmanager
    def use(self, path: str, create: bool = False) -> Iterator[int]:
        """The open descriptor of ``path`` (read-write), pinned for the block.  Raises
        ``FileNotFoundError`` if the file does not exist and ``create`` is false."""
        fd = self._acquire(path, create)
        try:
            yield fd
        finally:
            self._release(fd)

    def _acquire(self, path: str, create: bool) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is not None:
                self._fds.move_to_end(path)
                self._hits += 1
            else:
                flags = os.O_RDWR | (os.O_CREAT if create else 0)
                fd = os.open(path, flags, 0o644)
                self._fds[path] = fd
                self._opens += 1
            self._pins[fd] = self._pins.get(fd, 0) + 1
            if len(self._fds) > self.max_open:
                self._evict()
            return fd

    def _release(self, fd: int) -> None:
        with self._lock:
            left = self._pins[fd] - 1
            if left:
                self._pins[fd] = left
                return
            del self._pins[fd]
            if fd in self._closing:
                self._closing.discard(fd)
                os.close(fd)
            elif len(self._fds) > self.max_open:
                self._evict()

    def _evict(self) -> None:
        """Close unpinned descriptors, least recently used first, down to ``max_open``
        (called with the lock held)."""
        excess = len(self._fds) - self.max_open
        victims = []
        for path, fd in self._fds.items():
            if excess <= 0:
                break
            if fd not in self._pins:
                victims.append(path)
                excess -= 1
        for path in victims:
            os.close(self._fds.pop(path))
            self._evictions += 1

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (the file is about to be deleted or replaced); a
        descriptor in use is closed when its last user leaves."""
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is None:
                return
            if fd in self._pins:
                self._closing.add(fd)
            else:
                os.close(fd)

    def close(self) -> None:
        """Close every descriptor not in use (the store is stopping)."""
        with self._lock:
            for path in list(self._fds):
                fd = self._fds.pop(path)
                if fd in self._pins:
                    self._closing.add(fd)
                else:
                    os.close(fd)

    def statistics(self) -> FileCacheStats:
        with self._lock:
            return FileCacheStats(len(self._fds) + len(self._closing), self.max_open,
                                  self._opens, self._hits, self._evictions)
