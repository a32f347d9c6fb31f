"""All ConsumeQueues of the broker, and the dispatch handler that fills them.

Position checkpoint: ``<data>/checkpoint/consumequeue`` (``store.checkpoint`` layout),
written after the queue files it covers are fsynced.

Thread-safety: ``dispatch``/``flush`` run on the dispatcher thread; lookups from any thread.
"""

from __future__ import annotations

import os
import shutil
import threading
import zlib
from collections import defaultdict

from store.checkpoint import OffsetCheckpoint
from store.consumequeue import ENTRY, ConsumeQueue
from store.crashpoint import crashpoint
from store.files import fsync_dir
from store.message import FLAG_DELAYED, DispatchInfo
from store.topics import TopicCatalogue


def tag_hash(tag: str) -> int:
    """The ConsumeQueue's tag code: CRC32 of the UTF-8 tag, 0 for no tag."""
    return zlib.crc32(tag.encode()) if tag else 0


class ConsumeQueueTable:
    """ConsumeQueues by (topic, queue_id), plus their dispatch handler."""

    name = "consumequeue"

    def __init__(self, root: str, catalogue: TopicCatalogue, entries_per_file: int) -> None:
        self._root = os.path.join(root, "consumequeue")
        self._catalogue = catalogue
        self._per_file = entries_per_file
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        os.makedirs(os.path.join(root, "checkpoint"), exist_ok=True)
        self._checkpoint = OffsetCheckpoint(os.path.join(root, "checkpoint", "consumequeue"))
        self._position = self._checkpoint.read() or 0
        self._pending_position = self._position
        self._load()

    def _load(self) -> None:
        if not os.path.isdir(self._root):
            return
        for topic in os.listdir(self._root):
            if self._catalogue.get(topic) is None:
                continue  # deleted while the broker was down; removed by retention
            for qid in os.listdir(os.path.join(self._root, topic)):
                if qid.isdigit():
                    self.queue(topic, int(qid))

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            with self._lock:
                cq = self._queues.get(key)
                if cq is None:
                    cq = ConsumeQueue(os.path.join(self._root, topic, str(queue_id)),
                                      self._per_file)
                    self._queues[key] = cq
        return cq

    def existing(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def max_offsets(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return {k: q.max_offset for k, q in self._queues.items()}

    def all_queues(self) -> list[tuple[tuple[str, int], ConsumeQueue]]:
        with self._lock:
            return list(self._queues.items())

    def drop_topic(self, topic: str) -> None:
        with self._lock:
            doomed = [k for k in self._queues if k[0] == topic]
            queues = [self._queues.pop(k) for k in doomed]
        for q in queues:
            q.destroy()
        shutil.rmtree(os.path.join(self._root, topic), ignore_errors=True)

    def clear_beyond(self, commit_end: int) -> int:
        """Turn entries past a lost CommitLog tail into holes (``ConsumeQueue.clear_beyond``)."""
        return sum(q.clear_beyond(commit_end) for _, q in self.all_queues())

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
        grouped: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)
        since: dict[str, int | None] = {}
        pack = ENTRY.pack
        for (commit_offset, size, flags, qid, qo, store_at_ms, _due, _mid, topic_name, _key,
             tag) in records:
            if flags & FLAG_DELAYED:
                continue  # owned by the timer until it is due
            low = since.get(topic_name, -1)
            if low == -1:
                topic = self._catalogue.get(topic_name)
                low = since[topic_name] = topic.since_offset if topic is not None else None
            if low is None or commit_offset < low:
                continue  # an unknown topic, or an older topic of the same name
            grouped[(topic_name, qid)].append(
                (qo, pack(commit_offset, size, tag_hash(tag), store_at_ms)))
        for (topic_name, qid), entries in grouped.items():
            self.queue(topic_name, qid).put_many(entries)
        if grouped:
            crashpoint("consumequeue.after_write")
        self._pending_position = end_offset

    def flush(self) -> None:
        for _, q in self.all_queues():
            q.flush()
        if self._pending_position != self._position:
            self._checkpoint.write(self._pending_position)
            crashpoint("consumequeue.checkpoint")
            self._position = self._pending_position

    def close(self) -> None:
        for _, q in self.all_queues():
            q.close()
