"""MetaFiles: the tiered dispatcher's local files, its truth about what the tier holds.

Files under ``<meta_dir>`` (``<data>/tiered``)::

    queues/<topic>/<queue>.json   an uploaded queue's metadata (``TieredQueue.to_json``)
    checkpoint                    CommitLog offset, decimal: every record below it is
                                  durable in the tier, and named by the files above

Each is replaced whole (``store.files.write_atomic``: temporary file, fsync, rename),
so a crash leaves the old content or the new; a checkpoint moved back (``rewind``)
has its directory synced too before the dispatcher reads from there.  The order of
the writes (a queue's metadata before the checkpoint that counts on it) is the
dispatcher's (``tiered.dispatcher``); the copies for mounts are ``tiered.uploads``'.
The queue files are read at start only.

Not thread-safe: the dispatcher's ``_save_lock`` orders every write.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator

from store.files import fsync_dir, write_atomic


class MetaFiles:
    """The files of one ``<meta_dir>``; see the module docstring."""

    def __init__(self, meta_dir: str) -> None:
        self._dir = meta_dir
        self._queues = os.path.join(meta_dir, "queues")
        self._checkpoint = os.path.join(meta_dir, "checkpoint")

    def open(self) -> None:
        os.makedirs(self._queues, exist_ok=True)

    def saved_queues(self) -> Iterator[tuple[str, int, str]]:
        """``(topic, queue id, metadata)`` of every queue file."""
        for topic in os.listdir(self._queues):
            tdir = os.path.join(self._queues, topic)
            if not os.path.isdir(tdir):
                continue
            for name in fnmatch.filter(os.listdir(tdir), "*.json"):
                with open(os.path.join(tdir, name), encoding="utf-8") as f:
                    yield topic, int(name[:-5]), f.read()

    def save_queue(self, topic: str, qid: int, meta: bytes) -> None:
        tdir = os.path.join(self._queues, topic)
        os.makedirs(tdir, exist_ok=True)
        write_atomic(os.path.join(tdir, f"{qid}.json"), meta)

    def checkpoint(self) -> int | None:
        """The saved checkpoint (None: none saved yet)."""
        try:
            with open(self._checkpoint, encoding="utf-8") as f:
                return int(f.read().strip())
        except FileNotFoundError:
            return None

    def save_checkpoint(self, offset: int, sync_dir: bool = False) -> None:
        write_atomic(self._checkpoint, str(offset).encode())
        if sync_dir:
            fsync_dir(self._dir)
