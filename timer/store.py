"""TimerStore: pending delayed messages in RocksDB (``<data>/timer``, raw bytes).

Keys and values::

    b"t" + deliver_at_ms u64 + commit_offset u64   -> the message's whole CommitLog record
    b"i" + message_id                              -> deliver_at_ms u64 + commit_offset u64
    b"f" + message_id + b"\0" + commit_offset u64  -> deliver_at_ms u64 + commit_offset u64
                                                      of a message parked for a TimerFlatFile
                                                      and not yet preloaded: the preload loads
                                                      an object's entry only while its key is
                                                      there, and deletes it in the same
                                                      synced write (older releases wrote
                                                      b"f" + message_id; still read)
    b"x" + message_id                              -> (older releases: a tombstone; no longer
                                                      read: an unparked message's f key is
                                                      gone, which is what preload checks)
    b"w" + bucket_start_ms u64 + commit_offset u64  -> the whole record of a far-future
                                                      message waiting for its TimerFlatFile
                                                      object (parked)
    b"!position"                                   -> dispatch position u64

A far-future message is parked (``w`` and ``f`` keys) in the same atomic write as the
dispatch position, so the position never waits for a TimerFlatFile write and a restart
never dispatches a record twice; the ``w`` key goes once its object is written.

``t`` keys sort by due time, so "everything due before T" is one range scan; the value is
the whole record, so a pending timer never depends on CommitLog retention.  ``i`` finds a
message for Cancel/Reschedule.  Entries and the dispatch position they bring the store to
are written in one atomic batch.  Thread-safe (RocksDB is; no state here).

Memory: RocksDB's memtables hold at most two write buffers of ``WRITE_BUFFER_BYTES``
(the active one and one being flushed).  Every delayed message passes through here
whole (~22 MB a minute at 330 delayed msgs/s); at RocksDB's 64 MiB default the
memtables swung between 0 and 64-128 MB.  At that rate 8 MiB still holds a delay of
up to ~20 s from its put to its delete, so most such entries never reach an SST file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from store.kv import KV

_KEY = struct.Struct(">cQQ")
_PARKED = struct.Struct(">cQQ")
_LOC = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_POSITION = b"!position"
WRITE_BUFFER_BYTES = 8 << 20  # per memtable (RocksDB keeps at most two)


def timer_key(deliver_at_ms: int, commit_offset: int) -> bytes:
    return _KEY.pack(b"t", deliver_at_ms, commit_offset)


def parse_timer_key(key: bytes) -> tuple[int, int]:
    _, due, offset = _KEY.unpack(key)
    return int(due), int(offset)


def _pair(raw: bytes) -> tuple[int, int]:
    due, offset = _LOC.unpack(raw)
    return int(due), int(offset)


def parked_key(bucket_start_ms: int, commit_offset: int) -> bytes:
    return _PARKED.pack(b"w", bucket_start_ms, commit_offset)


def parked_id_key(message_id: str, commit_offset: int) -> bytes:
    """The ``f`` key of one parked message (the offset tells apart two with one id)."""
    return b"f" + message_id.encode() + b"\0" + _U64.pack(commit_offset)


def id_key(message_id: str, kind: bytes = b"i") -> bytes:
    return kind + message_id.encode()


class TimerStore:
    def __init__(self, path: str) -> None:
        self.kv = KV(path, write_buffer_bytes=WRITE_BUFFER_BYTES)

    def close(self) -> None:
        self.kv.close()

    def position(self) -> int:
        raw = self.kv.get(_POSITION)
        return int(_U64.unpack(raw)[0]) if raw else 0

    def add(self, entries: list[tuple[str, int, int, bytes]], position: int | None,
            parked: Sequence[tuple[int, tuple[str, int, int, bytes]]] = (),
            deletes: Sequence[bytes] = (), sync: bool = False) -> None:
        """``(message_id, deliver_at_ms, commit_offset, record)`` entries, ``(bucket,
        entry)`` of messages ``parked`` for a TimerFlatFile, key ``deletes`` and,
        optionally, the dispatch position, in one atomic write."""
        puts: list[tuple[bytes, bytes]] = []
        for message_id, due, offset, record in entries:
            puts.append((timer_key(due, offset), record))
            puts.append((id_key(message_id), _LOC.pack(due, offset)))
        for bucket, (message_id, due, offset, record) in parked:
            puts.append((parked_id_key(message_id, offset), _LOC.pack(due, offset)))
            puts.append((parked_key(bucket, offset), record))
        if position is not None:
            puts.append((_POSITION, _U64.pack(position)))
        self.kv.write(puts, deletes, sync=sync)

    def locate(self, message_id: str, kind: bytes = b"i") -> tuple[int, int] | None:
        """``(deliver_at_ms, commit_offset)`` of a pending message in RocksDB (``i``) or
        parked in a TimerFlatFile (``f``)."""
        raw = self.kv.get(id_key(message_id, kind))
        if raw is None:
            return None
        due, offset = _LOC.unpack(raw)
        return int(due), int(offset)

    def locate_many(self, message_ids: list[str]) -> list[tuple[int, int] | None]:
        """``locate`` for several ids with one multi-get."""
        out: list[tuple[int, int] | None] = []
        for raw in self.kv.get_many([id_key(m) for m in message_ids]):
            out.append(None if raw is None else _pair(raw))
        return out

    def parked_ids(self, entries: list[tuple[str, int, int]]) -> list[bytes | None]:
        """For each ``(message_id, deliver_at_ms, commit_offset)``, the ``f`` key that says
        it is parked and not yet preloaded, or None."""
        keys = [parked_id_key(m, off) for m, _, off in entries]
        legacy = [id_key(m, b"f") for m, _, _ in entries]
        found = self.kv.get_many(keys + legacy)
        out: list[bytes | None] = []
        for n, (_, due, off) in enumerate(entries):
            if found[n] is not None:
                out.append(keys[n])
            elif (raw := found[len(entries) + n]) is not None and _pair(raw) == (due, off):
                out.append(legacy[n])
            else:
                out.append(None)
        return out

    def locate_parked(self, message_id: str) -> tuple[tuple[int, int], bytes] | None:
        """``((deliver_at_ms, commit_offset), f key)`` of a parked message with this id (the
        newest, if several)."""
        found: tuple[tuple[int, int], bytes] | None = None
        for key, value in self.kv.scan(b"f" + message_id.encode() + b"\0"):
            found = (_pair(value), key)
        legacy = self.kv.get(id_key(message_id, b"f"))
        if found is None and legacy is not None:
            found = (_pair(legacy), id_key(message_id, b"f"))
        return found

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

    def parked(self) -> Iterator[tuple[int, int, bytes]]:
        """``(bucket, commit_offset, record)`` of every parked message, by bucket (a scan:
        read once, on start)."""
        for key, record in self.kv.scan(b"w"):
            _, bucket, offset = _PARKED.unpack(key)
            yield int(bucket), int(offset), record

    def pending_due_times(self, limit: int) -> Iterator[int]:
        """The due time of every pending message, from the 16-byte ``i`` and ``f`` values
        (never a record); at most ``limit``."""
        n = 0
        for prefix in (b"i", b"f"):
            for _, value in self.kv.scan(prefix):
                if n >= limit:
                    return
                n += 1
                yield _U64.unpack_from(value)[0]

    def pending_estimate(self) -> int:
        return max(self.kv.estimate_keys() - 1, 0) // 2
