"""Key / message-id index in RocksDB, filled by a dispatch handler.

Keys and values (``<data>/index`` RocksDB, raw bytes)::

    b"m" + message_id                                  -> commit_offset u64 | size u32
                                       (only ids that do not name their own record:
                                        client-chosen ones and redeliveries)
    b"k" + topic + b"\\0" + key + b"\\0" + commit_offset u64  -> size u32
    b"p" + topic + b"\\0" + key + b"\\0" + commit_offset u64  -> message_id
                                       (delayed records with a key, when stored: how a
                                        pending message is found by key; the timer says
                                        which of them are still pending)
    b"d" + topic + b"\\0" + message_id                  -> store time ms u64 |
                                                          commit_offset u64 | size u32
                                       (every record with a client-chosen id, delayed ones
                                        too, not a timer copy of a broker-assigned id
                                        (``FLAG_ASSIGNED_ID``): what the send-side
                                        de-duplication of
                                        ``SendDedupe.seen_recently`` looks up, per topic; the
                                        record's location lets ``MessageStore.stored_at``
                                        check it survived a torn tail.  An 8-byte value,
                                        store time only, is from before the location)
    b"!position"                                       -> commit_offset u64

The position is written in the same atomic batch as the entries it covers, so the index
and its checkpoint can never disagree; past batches with nothing to index it is written at
the dispatcher's periodic flush.  Broker-assigned ids carry their record's CommitLog
offset (``store.message.MessageIdFormat``) and need no entry.  An indexed id seen twice
points at the latest record.

Memory: RocksDB's memtables of this database hold at most two write buffers of
``WRITE_BUFFER_BYTES`` (the active one and one being flushed); a delivered delayed
message writes one key here (``m``; ``d`` too for a client-chosen id, ``k`` for a key), so a
small buffer bounds the memory (the figures that chose it: bench/RESULTS.md, "Notes
moved from docstrings").

Thread-safety: dispatch runs on the dispatcher thread; lookups from any thread.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from store.crashpoint import crashpoint
from store.kv import KV
from store.message import FLAG_ASSIGNED_ID, FLAG_DELAYED, FLAG_FOREIGN_ID, DispatchInfo

_LOC = struct.Struct(">QI")
_DEDUPE = struct.Struct(">QQI")  # store time ms, commit offset, size
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_POSITION = b"!position"
_DEDUPED = FLAG_FOREIGN_ID | FLAG_ASSIGNED_ID  # FOREIGN alone: a client-chosen id
WRITE_BUFFER_BYTES = 4 << 20  # per memtable (RocksDB keeps at most two)


class DedupeEntry(NamedTuple):
    """The last record stored with a (topic, client-chosen id): when, and where
    (``commit_offset`` -1: an entry written before entries held the location)."""

    store_at_ms: int
    commit_offset: int
    record_size: int


def encode_dedupe(entry: DedupeEntry) -> bytes:
    return _DEDUPE.pack(*entry)


def decode_dedupe(raw: bytes) -> DedupeEntry:
    if len(raw) == _U64.size:
        return DedupeEntry(_U64.unpack(raw)[0], -1, 0)
    return DedupeEntry(*_DEDUPE.unpack(raw))


def _dedupe_key(topic: str, message_id: str) -> bytes:
    return b"d" + topic.encode() + b"\0" + message_id.encode()


def _key_prefix(topic: str, key: str, kind: bytes = b"k") -> bytes:
    """``kind``: b"k" for records in their topic, b"p" for delayed records when stored."""
    return kind + topic.encode() + b"\0" + key.encode() + b"\0"


class KeyIndex:
    name = "index"

    def __init__(self, path: str) -> None:
        self.kv = KV(path, write_buffer_bytes=WRITE_BUFFER_BYTES)
        raw = self.kv.get(_POSITION)
        self._position = _U64.unpack(raw)[0] if raw else 0
        self._pending_position = self._position

    def position(self) -> int:
        return self._position

    def rewind(self, offset: int) -> None:
        """Entries of records past ``offset`` may stay: a lookup checks the record it reads
        (``store.lookup``: topic, key, id, and that the store wrote it there), and replay
        rewrites them."""
        if self._position > offset or self._pending_position > offset:
            self.kv.write([(_POSITION, _U64.pack(offset))], sync=True)
            self._position = self._pending_position = offset

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        puts: list[tuple[bytes, bytes]] = []
        dedupe, pack = _dedupe_key, _DEDUPE.pack
        for r in records:
            if r.flags & _DEDUPED == FLAG_FOREIGN_ID:  # a client-chosen id
                puts.append((dedupe(r.topic, r.message_id),
                             pack(r.store_at_ms, r.commit_offset, r.record_size)))
            if r.flags & FLAG_DELAYED:
                if r.key:
                    puts.append((_key_prefix(r.topic, r.key, b"p") + _U64.pack(r.commit_offset),
                                 r.message_id.encode()))
                continue  # indexed by location when the timer delivers it
            if r.flags & FLAG_FOREIGN_ID:  # broker-assigned ids locate themselves
                puts.append((b"m" + r.message_id.encode(),
                             _LOC.pack(r.commit_offset, r.record_size)))
            if r.key:
                puts.append((_key_prefix(r.topic, r.key) + _U64.pack(r.commit_offset),
                             _U32.pack(r.record_size)))
        self._pending_position = end_offset
        if puts:  # entries and the position they bring us to, in one atomic batch
            puts.append((_POSITION, _U64.pack(end_offset)))
            self.kv.write(puts)
            crashpoint("index.after_write")
            self._position = end_offset

    def flush(self) -> None:
        """Persist the position past batches that had nothing to index."""
        if self._pending_position != self._position:
            self.kv.write([(_POSITION, _U64.pack(self._pending_position))])
            self._position = self._pending_position

    def by_message_id(self, message_id: str) -> tuple[int, int] | None:
        raw = self.kv.get(b"m" + message_id.encode())
        if raw is None:
            return None
        offset, size = _LOC.unpack_from(raw)
        return int(offset), int(size)

    def dedupe_entries(self, messages: list[tuple[str, str]]) -> list[DedupeEntry | None]:
        """The last record stored with each (topic, client-chosen id) (None: never), as
        dispatched: it may since have been lost in a torn tail (``MessageStore.stored_at``
        checks); one RocksDB multi-get for the lot."""
        values = self.kv.get_many([_dedupe_key(t, mid) for t, mid in messages])
        return [decode_dedupe(v) if v is not None else None for v in values]

    def by_key(self, topic: str, key: str, limit: int) -> list[tuple[int, int]]:
        """Locations of the newest ``limit`` messages with ``key`` (oldest first)."""
        prefix = _key_prefix(topic, key)
        found: list[tuple[int, int]] = []
        for k, v in self.kv.scan(prefix):
            found.append((_U64.unpack_from(k, len(prefix))[0], _U32.unpack(v)[0]))
        return found[-limit:]

    def pending_by_key(self, topic: str, key: str, limit: int) -> list[tuple[int, str]]:
        """(commit offset, message id) of the newest ``limit`` delayed messages stored with
        ``key`` (oldest first), pending or not: the caller asks the timer which still are.
        Only exact matches: a longer key that starts with ``key + "\\0"`` is skipped."""
        prefix = _key_prefix(topic, key, b"p")
        found: list[tuple[int, str]] = []
        for k, v in self.kv.scan(prefix):
            if len(k) == len(prefix) + _U64.size:
                found.append((_U64.unpack_from(k, len(prefix))[0], v.decode()))
        return found[-limit:]

    def close(self) -> None:
        self.kv.close()
