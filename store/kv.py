"""A thin wrapper over RocksDB (rocksdict, raw bytes mode) shared by the index, the POP
checkpoints and the timer store.  RocksDB errors are wrapped in ``StoreError`` here.

Thread-safe: RocksDB itself is; this class keeps no mutable state of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, cast

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from store.errors import StoreError


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

    def __init__(self, path: str, write_buffer_bytes: int = 64 << 20) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(write_buffer_bytes)
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
        for k in deletes:
            wb.delete(k)
        for k, v in puts:
            wb.put(k, v)
        try:
            self._db.write(wb, self._sync if sync else self._nosync)
        except Exception as exc:
            raise StoreError(f"RocksDB write failed: {exc}") from exc

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
