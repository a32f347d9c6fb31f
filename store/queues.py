"""All ConsumeQueues of the broker, and the dispatch handler that fills them.

Position checkpoint: ``<data>/checkpoint/consumequeue`` (``store.checkpoint`` layout),
written after the queue files it covers are fsynced.

Queues are loaded lazily: start-up reads no queue folder, and a queue is loaded (its
folder listed, its newest file's size read; ``ConsumeQueue``) the first time it is read or
written.  What start-up used to do to every queue is done to each one as it loads:

* retention: entries below the CommitLog's low mark (``expire(min_commit_offset, ...)``)
  and older than their topic's ``retention_ms`` are expired, the same as
  ``MessageStore.run_retention`` does to the queues already loaded;
* the next queue offset a send takes is the loaded queue's end (``next_offset``).

Only turning entries past a lost CommitLog tail into holes (``clear_beyond``) walks every
queue on disk, and the store asks for it only when the CommitLog may have lost something
a dispatcher had seen (``store.tailcheck``).

Every queue file is read and written through one ``FileCache`` of ``max_open_files``
descriptors, so the number of queues never decides the number of open files.  A flush
that finds many queues written since the last one syncs the volume once (``syncfs``)
instead of every file (``flush``).

Thread-safety: ``dispatch``/``flush`` run on the dispatcher thread; lookups and loads from
any thread.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from store.checkpoint import OffsetCheckpoint
from store.consumequeue import ENTRY, ConsumeQueue, CqEntry
from store.crashpoint import crashpoint
from store.filecache import FileCache, FileCacheStats
from store.files import fsync_dir
from store.message import FLAG_DELAYED, DispatchInfo
from store.names import DELAYED_STREAM, inside
from store.topics import TopicCatalogue

Key = tuple[str, int]  # (topic, queue id)
SYNCFS_MIN_FILES = 64
WALK_THREADS = 8  # clear_beyond: queue files are listed and read by this many threads


def tag_hash(tag: str) -> int:
    """The ConsumeQueue's tag code: CRC32 of the UTF-8 tag, 0 for no tag."""
    return zlib.crc32(tag.encode()) if tag else 0


class ConsumeQueueTable:
    """ConsumeQueues by (topic, queue_id), loaded on first use, plus their dispatch
    handler."""

    name = "consumequeue"

    def __init__(self, root: str, catalogue: TopicCatalogue, entries_per_file: int,
                 max_open_files: int, now_ms: Callable[[], int]) -> None:
        self._root = os.path.join(root, "consumequeue")
        self._catalogue = catalogue
        self._per_file = entries_per_file
        self._now_ms = now_ms
        self.files = FileCache(max_open_files)
        self._queues: dict[Key, ConsumeQueue] = {}
        self._lock = threading.Lock()  # the dicts below
        self._lock_free = threading.Condition(self._lock)
        self._busy: set[Key] = set()  # being loaded now
        self._dirty: set[Key] = set()  # written since the last flush (dispatcher thread)
        self._min_commit_offset = 0  # entries below it are expired (the CommitLog's low mark)
        self._floors: dict[Key, int] = {}  # the low mark each loaded queue was expired to
        os.makedirs(self._root, exist_ok=True)
        os.makedirs(os.path.join(root, "checkpoint"), exist_ok=True)
        self._checkpoint = OffsetCheckpoint(os.path.join(root, "checkpoint", "consumequeue"))
        self._position = self._checkpoint.read() or 0
        self._pending_position = self._position

    def _dir(self, key: Key) -> str:
        return inside(self._root, key[0], str(key[1]))

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, loaded or created."""
        cq = self._queues.get((topic, queue_id)) or self._load((topic, queue_id), create=True)
        assert cq is not None
        return cq

    def existing(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it has ever been written (its folder exists), loaded."""
        cq = self._queues.get((topic, queue_id))
        return cq if cq is not None else self._load((topic, queue_id), create=False)

    def _load(self, key: Key, create: bool) -> ConsumeQueue | None:
        with self._loading(key):
            cq = self._queues.get(key)
            if cq is not None:
                return cq
            try:
                cq = ConsumeQueue(self._dir(key), self.files, self._per_file, create)
            except FileNotFoundError:  # never written (or its topic was just deleted)
                return None
            self._expire_one(key, cq, self._now_ms())
            with self._lock:
                self._queues[key] = cq
            return cq

    @contextmanager
    def _loading(self, key: Key) -> Iterator[None]:
        """One load per queue at a time; loads of different queues run at once."""
        with self._lock:
            while key in self._busy:
                self._lock_free.wait()
            self._busy.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(key)
                self._lock_free.notify_all()

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of this queue gets (its end on disk)."""
        cq = self.existing(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def loaded(self) -> list[tuple[Key, ConsumeQueue]]:
        with self._lock:
            return list(self._queues.items())

    def drop_topic(self, topic: str) -> None:
        with self._lock:
            doomed = [k for k in self._queues if k[0] == topic]
            queues = [self._queues.pop(k) for k in doomed]
            self._dirty.difference_update(doomed)
            for k in doomed:
                self._floors.pop(k, None)
        for q in queues:
            q.destroy()
        shutil.rmtree(inside(self._root, topic), ignore_errors=True)

    def clear_beyond(self, commit_end: int) -> int:
        """Turn entries past a lost CommitLog tail into holes (``ConsumeQueue.clear_beyond``)
        in every queue on disk (each one loaded).  Returns the entries cleared."""
        def clear(keys: list[Key]) -> int:
            found = (self.existing(*key) for key in keys)
            return sum(cq.clear_beyond(commit_end) for cq in found if cq is not None)

        keys = [(t.name, q) for t in self._catalogue.list() for q in range(t.queue_count)]
        with ThreadPoolExecutor(WALK_THREADS, thread_name_prefix="cq-walk") as pool:
            return sum(pool.map(clear, [keys[i::WALK_THREADS] for i in range(WALK_THREADS)]))

    # ------------------------------------------------------------------ retention

    def expire(self, min_commit_offset: int) -> None:
        """Retention: expire entries below the CommitLog's low mark and past their topic's
        ``retention_ms`` in the loaded queues; the others when they load."""
        self._min_commit_offset = min_commit_offset
        now_ms = self._now_ms()
        for key, cq in self.loaded():
            self._expire_one(key, cq, now_ms)

    def _expire_one(self, key: Key, cq: ConsumeQueue, now_ms: int) -> None:
        low = self._min_commit_offset
        if self._floors.get(key, 0) < low:  # a queue already past this low mark is skipped
            cq.expire(lambda e: e.commit_offset < low)
            self._floors[key] = low
        topic = self._catalogue.get(key[0])
        if topic is not None and topic.retention_ms > 0:
            horizon = now_ms - topic.retention_ms
            cq.expire(lambda e: _stored_before(e, horizon))

    # ------------------------------------------------------------ DispatchHandler

    def position(self) -> int:
        return self._position

    def rewind(self, offset: int) -> None:
        if self._position > offset or self._pending_position > offset:
            OffsetCheckpoint(self._checkpoint.path, fsync=True).write(offset)
            # the rename too: an old position must not come back
            fsync_dir(os.path.dirname(self._checkpoint.path))
            self._position = self._pending_position = offset

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        grouped: dict[Key, list[tuple[int, bytes]]] = defaultdict(list)
        since: dict[str, int | None] = {}
        pack = ENTRY.pack
        for (commit_offset, size, flags, qid, qo, store_at_ms, _due, _mid, topic_name, _key,
             tag) in records:
            if flags & FLAG_DELAYED:  # owned by the timer until it is due; listed in the
                topic_name, qid = DELAYED_STREAM, 0  # delayed stream when there is one
            low = since.get(topic_name, -1)
            if low == -1:
                topic = self._catalogue.get(topic_name)
                low = since[topic_name] = topic.since_offset if topic is not None else None
            if low is None or commit_offset < low:
                continue  # an unknown topic, or an older topic of the same name
            grouped[(topic_name, qid)].append(
                (qo, pack(commit_offset, size, tag_hash(tag), store_at_ms)))
        for key, entries in grouped.items():
            self.queue(*key).put_many(entries)
        if grouped:
            self._dirty.update(grouped)
            crashpoint("consumequeue.after_write")
        self._pending_position = end_offset

    def flush(self) -> None:
        """Make the queues written since the last flush durable, then the position: one
        ``fdatasync`` per file, or one ``syncfs`` of the volume when more than
        ``SYNCFS_MIN_FILES`` files were written (many queues, each written a little: a
        journal commit each would cap dispatch at a few hundred queues a second)."""
        dirty, self._dirty = self._dirty, set()
        queues = [cq for cq in map(self._queues.get, dirty) if cq is not None]
        if sum(cq.dirty_files for cq in queues) > SYNCFS_MIN_FILES and _syncfs(self._root):
            for cq in queues:
                cq.flushed()
        for cq in queues:
            cq.flush()  # nothing left to do after a syncfs
        if self._pending_position != self._position:
            self._checkpoint.write(self._pending_position)
            crashpoint("consumequeue.checkpoint")
            self._position = self._pending_position

    def statistics(self) -> FileCacheStats:
        """The queue files' descriptor cache."""
        return self.files.statistics()

    def close(self) -> None:
        self.files.close()


def _syncfs(path: str) -> bool:
    """``syncfs(2)`` the volume holding ``path``: every file written on it is durable,
    new folders and files included (False: not available here, fsync each file)."""
    libc = _libc()
    if libc is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def _stored_before(entry: CqEntry, horizon_ms: int) -> bool:
    return entry.store_at_ms < horizon_ms


class NextOffsets(dict[Key, int]):
    """The next queue offset per (topic, queue) (``store.append``): a queue not
    sent to since the start takes its end on disk, read (the queue loaded) the first time
    it is needed."""

    def __init__(self, queues: ConsumeQueueTable) -> None:
        super().__init__()
        self._queues = queues

    def __missing__(self, key: Key) -> int:
        return self._queues.next_offset(*key)
