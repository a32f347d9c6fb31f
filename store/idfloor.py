"""IdFloor: the millisecond a broker-assigned message id carries, never one an earlier run
of this store could have used.

An id is ``ms | node | CommitLog offset`` (``store.message.MessageIdFormat``).  After a
torn tail the log ends earlier than before the crash, so a new record takes a lost
record's offset; were the clock at the same millisecond (or set back), the new record
would get the lost record's id, which its sender may have been told.  So an id carries
``max(now, floor)``, and before an id carries a millisecond at or past the stored
high-water mark, the mark is moved ``LEASE_MS`` past it and made durable (file fsynced,
then its directory).  A start takes the stored mark as its floor; a clean stop stores
one past the last millisecond used, so a restart's ids are not ahead of the clock.

File ``<data>/commitlog/id-floor`` (the ``store.checkpoint`` layout, 16 bytes)::

    0   4   magic   0xC4A0C901
    4   8   ms      no id of an earlier run carries a millisecond at or past this
    12  4   crc32 of bytes [0, 12)

Missing or unreadable: the floor is 0 (a new data directory, or one from before this
file existed).  Trade-off: after a crash, ids of the first ``LEASE_MS`` may carry a
millisecond ahead of the clock (ids sort by assignment time, give or take that); the
price of never fsyncing on the hot path more than once per ``LEASE_MS``.

Not thread-safe: only the CommitLog writer thread assigns ids.
"""

from __future__ import annotations

import logging
import os

from store.checkpoint import decode_checkpoint, encode_checkpoint
from store.disk import NO_SPACE
from store.errors import ChronomqError, ResourceExhausted, StorageIOError, StoreError
from store.files import fsync_dir, write_atomic

log = logging.getLogger(__name__)

LEASE_MS = 10_000  # how far ahead of the ids issued the stored mark is moved


class IdFloor:
    def __init__(self, path: str) -> None:
        self._path = path
        self._mark = self._floor = _read(path)
        self._last = -1  # the highest millisecond an id of this run carries

    def ms(self, now_ms: int) -> int:
        """The millisecond for ids assigned at ``now_ms`` (durable before it is used)."""
        ms = max(now_ms, self._floor)
        if ms >= self._mark:
            self._store(ms + LEASE_MS)
        self._last = max(self._last, ms)
        return ms

    def close(self) -> None:
        """Store one past the last millisecond used: a restart's ids need not be ahead."""
        if self._last >= 0 and self._last + 1 < self._mark:
            try:
                self._store(self._last + 1)
            except ChronomqError as exc:  # the stored mark stays: still safe, only ahead
                log.warning("message-id floor not lowered at stop: %s", exc)

    def _store(self, mark: int) -> None:
        try:
            write_atomic(self._path, encode_checkpoint(mark))
            fsync_dir(os.path.dirname(self._path))
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise ResourceExhausted(f"the data volume of {self._path} is full "
                                        f"({exc.strerror}): not stored; retry once space "
                                        "is freed") from exc
            raise StorageIOError(f"cannot write {self._path}: {exc}") from exc
        self._mark = mark


def _read(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return decode_checkpoint(f.read())
    except (FileNotFoundError, StoreError):
        return 0
