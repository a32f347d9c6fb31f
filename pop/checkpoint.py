"""PopCheckpoint: the durable record of one lease of consecutive queue entries.

RocksDB keys and values (``<data>/pop``, raw bytes)::

    b"c" + group + b"\\0" + topic + b"\\0" + queue_id u16 + ck_start u64  -> checkpoint value
    b"o" + group + b"\\0" + topic + b"\\0" + queue_id u16               -> ack offset u64
    b"p" + group + b"\\0" + topic + b"\\0" + queue_id u16               -> pop offset u64
    b"R" + ...                                                      -> other broker state

``topic`` is the topic the entries were leased from: the user's topic, or the group's
retry topic (``%RETRY%<group>%<topic>``).

Checkpoint value (big-endian)::

    0   1   version      2
    1   8   pop_at_ms
    9   8   expire_at_ms deadline of every entry without an override
    17  2   count        entries covered: ck_start .. ck_start + count - 1
    19  n   done bitmap  ceil(count / 8) bytes, bit i = entry ck_start + i is done
    ..  2   overrides    number of per-entry deadlines set by ChangeInvisibleTime
    ..  10  (index u16, expire_at_ms u64) per override; 0 (``HELD``): the entry is held
                         for its key by the group's flow control, not handed out

An entry is "done" when acked, released (Nack: its retry copy is durable), revived, or
skipped by the group's tag filter.  ChangeInvisibleTime rewrites this one value (one
synced write).  The ack offset is the first queue offset not yet done by the group; it
only moves forward.  The pop offset is the first queue offset never leased; it is written
in the same write as the checkpoints of the Pop that moves it, so after a restart the
entries of a lease that was fully done and deleted (while an older one was still open)
are not leased again.

Memory: the POP RocksDB's memtables hold at most two write buffers of
``WRITE_BUFFER_BYTES`` (the active one and one being flushed).  Every Pop and Ack
writes here, so a small buffer bounds the memory (the figures that chose it:
bench/RESULTS.md, "Notes moved from docstrings").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

_VERSION = 2
_VALUE = struct.Struct(">BQQH")
_COUNT = struct.Struct(">H")
_OVERRIDE = struct.Struct(">HQ")
_QID = struct.Struct(">H")
_U64 = struct.Struct(">Q")
WRITE_BUFFER_BYTES = 4 << 20  # per memtable of the POP RocksDB (RocksDB keeps at most two)
STATE_PREFIX = b"R"  # keys of other broker state kept in the POP RocksDB and its journal
#                    (recurring schedules: ``PopService.write_state``)
HELD = 0  # an override deadline: leased to the broker for its key, not handed out (no
#           revive fires it; ``pop.flowcontrol``)


@dataclass(slots=True)
class PopCheckpoint:
    ck_start: int
    pop_at_ms: int
    expire_at_ms: int
    count: int
    acked: bytearray
    overrides: dict[int, int] = field(default_factory=dict)  # entry index -> deadline
    done: int = -1  # entries marked; derived from the bitmap (not stored)

    def __post_init__(self) -> None:
        if self.done < 0:
            self.done = sum(bin(b).count("1") for b in self.acked)

    def is_acked(self, i: int) -> bool:
        return bool(self.acked[i >> 3] & (1 << (i & 7)))

    def mark(self, i: int) -> None:
        if not self.is_acked(i):
            self.acked[i >> 3] |= 1 << (i & 7)
            self.done += 1  # an override stays: it tells a superseded handle apart

    def all_acked(self) -> bool:
        return self.done == self.count

    def expire_of(self, i: int) -> int:
        return self.overrides.get(i, self.expire_at_ms)

    def held(self) -> list[int]:
        """Indices of the entries held for their key (``pop.flowcontrol``)."""
        return [i for i, e in sorted(self.overrides.items())
                if e == HELD and not self.is_acked(i)]

    def open_at(self, expire_at_ms: int) -> list[int]:
        """Indices of the entries not done whose deadline is ``expire_at_ms``."""
        return [i for i in range(self.count)
                if not self.is_acked(i) and self.expire_of(i) == expire_at_ms]

    def deadlines(self) -> set[int]:
        """Every deadline an open entry has (a held entry has none)."""
        out = {e for i, e in self.overrides.items() if not self.is_acked(i) and e != HELD}
        if any(not self.is_acked(i) and i not in self.overrides for i in range(self.count)):
            out.add(self.expire_at_ms)
        return out

    @property
    def end(self) -> int:
        return self.ck_start + self.count


def queue_prefix(kind: bytes, group: str, topic: str, queue_id: int) -> bytes:
    return kind + group.encode() + b"\0" + topic.encode() + b"\0" + _QID.pack(queue_id)


def checkpoint_key(group: str, topic: str, queue_id: int, ck_start: int) -> bytes:
    return queue_prefix(b"c", group, topic, queue_id) + _U64.pack(ck_start)


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return queue_prefix(b"o", group, topic, queue_id)


def pop_offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return queue_prefix(b"p", group, topic, queue_id)


def parse_key(key: bytes) -> tuple[str, str, int, int | None]:
    """``(group, topic, queue_id, ck_start or None)`` of a checkpoint or offset key."""
    group, topic, rest = key[1:].split(b"\0", 2)
    qid = int(_QID.unpack_from(rest)[0])
    start = int(_U64.unpack_from(rest, 2)[0]) if key[:1] == b"c" else None
    return group.decode(), topic.decode(), qid, start


def ck_start_of_key(key: bytes) -> int:
    return int(_U64.unpack_from(key, len(key) - 8)[0])


def encode_checkpoint(ck: PopCheckpoint) -> bytes:
    head = _VALUE.pack(_VERSION, ck.pop_at_ms, ck.expire_at_ms, ck.count) + bytes(ck.acked)
    tail = b"".join(_OVERRIDE.pack(i, e) for i, e in sorted(ck.overrides.items()))
    return head + _COUNT.pack(len(ck.overrides)) + tail


def decode_checkpoint(ck_start: int, data: bytes) -> PopCheckpoint:
    if len(data) < _VALUE.size:
        raise ValueError("PopCheckpoint value is truncated")
    version, pop_at, expire, count = _VALUE.unpack_from(data)
    if version != _VERSION:
        raise ValueError(f"unknown PopCheckpoint version {version}")
    pos = _VALUE.size + (count + 7) // 8
    acked = bytearray(data[_VALUE.size : pos])
    if len(data) < pos + _COUNT.size:
        raise ValueError("PopCheckpoint value is truncated")
    (n,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    if len(data) != pos + n * _OVERRIDE.size:
        raise ValueError("PopCheckpoint overrides do not match their count")
    overrides = {}
    for _ in range(n):
        i, e = _OVERRIDE.unpack_from(data, pos)
        if i >= count:
            raise ValueError("PopCheckpoint override names an entry it does not cover")
        overrides[i] = e
        pos += _OVERRIDE.size
    return PopCheckpoint(ck_start, pop_at, expire, count, acked, overrides)


def encode_offset(offset: int) -> bytes:
    return _U64.pack(offset)


def decode_offset(data: bytes) -> int:
    return int(_U64.unpack(data)[0])
