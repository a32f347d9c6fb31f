"""PopCheckpoint: the durable record of one lease of consecutive queue entries.

RocksDB keys and values (``<data>/pop``, raw bytes)::

    b"c" + group + b"\\0" + topic + b"\\0" + queue_id u16 + ck_start u64  -> checkpoint value
    b"o" + group + b"\\0" + topic + b"\\0" + queue_id u16               -> ack offset u64

Checkpoint value (big-endian)::

    0   1   version      1
    1   8   pop_at_ms
    9   8   expire_at_ms
    17  2   attempt      delivery attempt of this lease, from 1
    19  2   count        entries covered: ck_start .. ck_start + count - 1
    21  n   acked bitmap ceil(count / 8) bytes, bit i = entry ck_start + i is done

An entry is "done" when acked or when the group's tag filter skipped it.  The ack offset
is the first queue offset not yet done by the group; it only moves forward.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_VERSION = 1
_VALUE = struct.Struct(">BQQHH")
_QID = struct.Struct(">H")
_U64 = struct.Struct(">Q")


@dataclass(slots=True)
class PopCheckpoint:
    ck_start: int
    pop_at_ms: int
    expire_at_ms: int
    attempt: int
    count: int
    acked: bytearray
    done: int = -1  # entries marked; derived from the bitmap (not stored)

    def __post_init__(self) -> None:
        if self.done < 0:
            self.done = sum(bin(b).count("1") for b in self.acked)

    def is_acked(self, i: int) -> bool:
        return bool(self.acked[i >> 3] & (1 << (i & 7)))

    def mark(self, i: int) -> None:
        if not self.is_acked(i):
            self.acked[i >> 3] |= 1 << (i & 7)
            self.done += 1

    def all_acked(self) -> bool:
        return self.done == self.count

    @property
    def end(self) -> int:
        return self.ck_start + self.count


def queue_prefix(kind: bytes, group: str, topic: str, queue_id: int) -> bytes:
    return kind + group.encode() + b"\0" + topic.encode() + b"\0" + _QID.pack(queue_id)


def checkpoint_key(group: str, topic: str, queue_id: int, ck_start: int) -> bytes:
    return queue_prefix(b"c", group, topic, queue_id) + _U64.pack(ck_start)


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return queue_prefix(b"o", group, topic, queue_id)


def ck_start_of_key(key: bytes) -> int:
    return int(_U64.unpack_from(key, len(key) - 8)[0])


def encode_checkpoint(ck: PopCheckpoint) -> bytes:
    return _VALUE.pack(_VERSION, ck.pop_at_ms, ck.expire_at_ms, ck.attempt, ck.count) + bytes(
        ck.acked
    )


def decode_checkpoint(ck_start: int, data: bytes) -> PopCheckpoint:
    version, pop_at, expire, attempt, count = _VALUE.unpack_from(data)
    if version != _VERSION:
        raise ValueError(f"unknown PopCheckpoint version {version}")
    acked = bytearray(data[_VALUE.size :])
    if len(acked) != (count + 7) // 8:
        raise ValueError("PopCheckpoint bitmap length does not match its count")
    return PopCheckpoint(ck_start, pop_at, expire, attempt, count, acked)


def encode_offset(offset: int) -> bytes:
    return _U64.pack(offset)


def decode_offset(data: bytes) -> int:
    return int(_U64.unpack(data)[0])
