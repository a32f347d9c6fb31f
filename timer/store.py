"""TimerStore: pending delayed messages in RocksDB (``<data>/timer``, raw bytes).

Keys and values::

    b"t" + deliver_at_ms u64 + commit_offset u64   -> the message's whole CommitLog record
    b"i" + message_id                              -> deliver_at_ms u64 + commit_offset u64
    b"!position"                                   -> dispatch position u64

``t`` keys sort by due time, so "everything due before T" is one range scan; the value is
the whole record, so a pending timer never depends on CommitLog retention.  ``i`` finds a
message for Cancel/Reschedule.  Entries and the dispatch position they bring the store to
are written in one atomic batch.  Thread-safe (RocksDB is; no state here).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from store.kv import KV

_KEY = struct.Struct(">cQQ")
_LOC = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_POSITION = b"!position"


def timer_key(deliver_at_ms: int, commit_offset: int) -> bytes:
    return _KEY.pack(b"t", deliver_at_ms, commit_offset)


def parse_timer_key(key: bytes) -> tuple[int, int]:
    _, due, offset = _KEY.unpack(key)
    return int(due), int(offset)


def id_key(message_id: str) -> bytes:
    return b"i" + message_id.encode()


class TimerStore:
    def __init__(self, path: str) -> None:
        self.kv = KV(path)

    def close(self) -> None:
        self.kv.close()

    def position(self) -> int:
        raw = self.kv.get(_POSITION)
        return int(_U64.unpack(raw)[0]) if raw else 0

    def add(self, entries: list[tuple[str, int, int, bytes]], position: int | None) -> None:
        """``(message_id, deliver_at_ms, commit_offset, record)`` plus, optionally, the
        dispatch position, in one atomic write."""
        puts: list[tuple[bytes, bytes]] = []
        for message_id, due, offset, record in entries:
            puts.append((timer_key(due, offset), record))
            puts.append((id_key(message_id), _LOC.pack(due, offset)))
        if position is not None:
            puts.append((_POSITION, _U64.pack(position)))
        self.kv.write(puts)

    def locate(self, message_id: str) -> tuple[int, int] | None:
        raw = self.kv.get(id_key(message_id))
        if raw is None:
            return None
        due, offset = _LOC.unpack(raw)
        return int(due), int(offset)

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return self.kv.get_many(keys)

    def keys_between(self, start_key: bytes, end_key: bytes) -> Iterator[bytes]:
        """Timer keys in ``[start_key, end_key)``, in due order."""
        for key, _ in self.kv.scan(b"t", start=start_key):
            if key >= end_key:
                return
            yield key

    def remove(self, keys_and_ids: list[tuple[bytes, str]]) -> None:
        deletes: list[bytes] = []
        for key, message_id in keys_and_ids:
            deletes += (key, id_key(message_id))
        self.kv.write(deletes=deletes)

    def move(self, message_id: str, old_key: bytes, new_due_ms: int, offset: int,
             record: bytes) -> bytes:
        """Reschedule atomically; returns the new timer key."""
        new_key = timer_key(new_due_ms, offset)
        self.kv.write([(new_key, record), (id_key(message_id), _LOC.pack(new_due_ms, offset))],
                      deletes=[old_key] if old_key != new_key else [])
        return new_key

    def pending_estimate(self) -> int:
        return max(self.kv.estimate_keys() - 1, 0) // 2
