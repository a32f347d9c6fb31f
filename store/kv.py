"""A thin wrapper over RocksDB (rocksdict, raw bytes mode) shared by the index, the POP
checkpoints and the timer store.  RocksDB errors are wrapped in ``StoreError`` here.

``GroupCommit`` makes many writers' unsynced writes durable with one WAL fsync (the same
group commit the CommitLog does for sends): a writer writes without a sync, takes a
ticket, and waits; whoever finds no sync running syncs the WAL for everyone whose write
finished before that sync began.

Thread-safe: RocksDB itself is; ``KV`` keeps no mutable state of its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice, starmap
from typing import Any, cast

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from store.errors import ChronomqError, ResourceExhausted, StoreError

# RocksDB keeps every table file open by default (max_open_files = -1): a database that
# grows to thousands of SST files would hold as many descriptors.  Capped, RocksDB's
# table cache closes the least recently used one (store.openfiles budgets for it).
ROCKSDB_MAX_OPEN_FILES = 64


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


class KV:
    """One RocksDB database in raw mode."""

    def __init__(self, path: str, write_buffer_bytes: int = 64 << 20,
                 max_open_files: int = ROCKSDB_MAX_OPEN_FILES) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(write_buffer_bytes)
        opts.set_max_open_files(max_open_files)
        opts.set_keep_log_file_num(4)  # old LOG files are not held open, only kept
        try:
            self._db = Rdict(path, opts)
        except Exception as exc:
            raise StoreError(f"cannot open RocksDB at {path}: {exc}") from exc
        self.path = path
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()

    def close(self) -> None:
        self._db.close()

    def get(self, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self._db.get(key)
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {exc}") from exc
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        try:
            values = cast(list[bytes | None], self._db.get(list[Any](keys)))
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {exc}") from exc
        return values

    def property_int(self, name: str) -> int:
        """A RocksDB integer property (``rocksdb.cur-size-all-mem-tables``...), 0 if none."""
        return int(self._db.property_int_value(name) or 0)

    def estimate_keys(self) -> int:
        """RocksDB's estimate of the number of keys (cheap; not exact)."""
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    def write(
        self,
        puts: Iterable[tuple[bytes, bytes]] = (),
        deletes: Iterable[bytes] = (),
        sync: bool = False,
    ) -> None:
        """Apply puts and deletes atomically; ``sync`` fsyncs the WAL before returning."""
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.delete, deletes), 0)  # the loops in C: ~35 ns an item less
        deque(starmap(wb.put, puts), 0)
        try:
            self._db.write(wb, self._sync if sync else self._nosync)
        except Exception as exc:
            raise self._write_error("write", exc) from exc

    def sync_wal(self) -> None:
        """fsync RocksDB's write-ahead log: every write made before this is durable."""
        try:
            self._db.flush_wal(True)
        except Exception as exc:
            raise self._write_error("WAL sync", exc) from exc

    def _write_error(self, what: str, exc: Exception) -> ChronomqError:
        """``ResourceExhausted`` when the volume was full (RocksDB then refuses writes
        until it is opened again: free space and restart), else ``StoreError``."""
        if "No space left" in str(exc):
            return ResourceExhausted(
                f"RocksDB {what} at {self.path} failed: the volume is full ({exc}); free "
                "space and restart the broker")
        return StoreError(f"RocksDB {what} failed: {exc}")

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Items whose key starts with ``prefix``, from ``start`` (default: the prefix)."""
        ro = ReadOptions()
        end = prefix_end(prefix)
        if end is not None:
            ro.set_iterate_upper_bound(end)
        it = self._db.iter(ro)
        it.seek(start if start is not None else prefix)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def span(self, start: bytes, end: bytes, limit: int) -> tuple[dict[bytes, bytes], bytes]:
        """Items with ``start <= key < end``, at most ``limit`` of them, and the last key
        read (``end`` when the span was read to its end)."""
        ro = ReadOptions()
        ro.set_iterate_upper_bound(end)
        try:  # one call a pair (the items iterator), the loop in C
            items = cast(Iterable[tuple[bytes, bytes]],
                         self._db.items(from_key=start, read_opt=ro))
            out = dict(islice(items, limit))
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {exc}") from exc
        return out, (next(reversed(out)) if len(out) == limit else end)


class GroupCommit:
    """One WAL fsync for a batch of writers (see the module docstring).  Thread-safe."""

    def __init__(self, kv: KV) -> None:
        self._kv = kv
        self._cond = threading.Condition()
        self._issued = 0  # tickets handed out: writes that have reached RocksDB
        self._synced = 0  # every ticket up to this one is durable
        self._syncing = False
        self.syncs = 0

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (),
              deletes: Iterable[bytes] = ()) -> int:
        """Apply a write without syncing; returns the ticket to ``wait`` for."""
        self._kv.write(puts, deletes)
        with self._cond:
            self._issued += 1
            return self._issued

    def wait(self, ticket: int) -> None:
        """Return once the write behind ``ticket`` is durable (raises ``StoreError`` if the
        sync fails)."""
        with self._cond:
            while self._synced < ticket:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                target = self._issued  # every write behind these tickets has finished
                self._cond.release()
                synced = False
                try:
                    self._kv.sync_wal()
                    synced = True
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    if synced:
                        self._synced = max(self._synced, target)
                        self.syncs += 1
                    self._cond.notify_all()
