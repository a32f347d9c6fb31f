"""Messages and the CommitLog record codec.

Record layout (big-endian; ``HEADER.size == 67`` bytes, then the variable fields)::

    offset  size  field
    0       4     magic            RECORD_MAGIC (0xC4A0_0001: record format version 1)
    4       4     total_size       the whole record, header included
    8       4     crc32            zlib.crc32 of bytes [12, total_size)
    12      2     flags            FLAG_* bits
    14      2     queue_id
    16      8     queue_offset     index of the record in its ConsumeQueue
    24      8     born_at_ms       when the producer's request reached the broker
    32      8     store_at_ms      when the record was appended
    40      8     deliver_at_ms    due time (== born_at_ms for immediate messages)
    48      4     delivery_attempt 0 for a fresh send; the POP layer counts redeliveries
    52      1     id_len           message id (ASCII), at most 128 bytes
    53      2     topic_len        UTF-8, at most 255 bytes
    55      2     key_len          UTF-8
    57      2     tag_len          UTF-8
    59      4     props_len        encoded properties (see ``encode_properties``)
    63      4     body_len
    67      ...   id, topic, key, tag, props, body

The CRC covers everything after itself, so a torn write or a flipped bit anywhere in the
record is caught.  The queue offset is fixed at append time, which makes every
ConsumeQueue write idempotent (position = queue_offset * entry size): a dispatcher that
replays after a crash rewrites the same bytes.

Trade-off: ids and strings are stored in each record instead of a dictionary, so a record
is self-describing and can be shipped to the tier or replayed without any side table.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from store.errors import InvalidArgument

RECORD_MAGIC = 0xC4A00001
HEADER = struct.Struct(">IIIHHQQQQIBHHHII")
assert HEADER.size == 67
_PROP_KEY = struct.Struct(">H")
_PROP_VAL = struct.Struct(">I")

FLAG_DELAYED = 0x0001  # deliver_at_ms was in the future when the record was written
FLAG_TIMER_DELIVERY = 0x0002  # re-appended by the timer when its time came
FLAG_RETRY = 0x0004  # re-appended by the POP layer for a redelivery
FLAG_FOREIGN_ID = 0x0008  # the id was not assigned for this record: index it by id
FLAG_STATE = 0x0010  # a state change of the broker (``store.journal``), not a message
FLAG_ASSIGNED_ID = 0x0020  # a timer copy keeping a broker-assigned id: no client chose it,
#                             so indexed by id but with no dedupe entry (``store.index``)

MAX_ID_BYTES = 128
MAX_TOPIC_BYTES = 255
MAX_KEY_BYTES = 1024
MAX_TAG_BYTES = 255
MAX_PROPERTIES_BYTES = 64 << 10  # a producer's properties, encoded
MAX_TIME_MS = 1 << 63  # times are u64 ms in a record; every time must be below this


@dataclass(slots=True)
class Message:
    """One message as stored.  ``commit_offset`` is where its record starts in the CommitLog."""

    message_id: str
    topic: str
    body: bytes
    key: str = ""
    tag: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    born_at_ms: int = 0
    store_at_ms: int = 0
    deliver_at_ms: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    delivery_attempt: int = 0
    flags: int = 0
    commit_offset: int = -1
    record_size: int = 0


def encode_properties(props: dict[str, str], max_bytes: int | None = None) -> bytes:
    """``(u16 key_len, key, u32 value_len, value)*``, UTF-8; empty dict -> empty bytes.
    Raises ``InvalidArgument`` past ``max_bytes`` (a producer's properties: at intake,
    ``MAX_PROPERTIES_BYTES``) or for a key longer than 65,535 bytes."""
    if not props:
        return b""
    parts: list[bytes] = []
    for k, v in props.items():
        kb = k.encode()
        vb = v.encode()
        if len(kb) > 0xFFFF:
            raise InvalidArgument(f"a property key is {len(kb)} bytes, over 65,535")
        parts += (_PROP_KEY.pack(len(kb)), kb, _PROP_VAL.pack(len(vb)), vb)
    out = b"".join(parts)
    if max_bytes is not None and len(out) > max_bytes:
        raise InvalidArgument(f"the properties take {len(out)} bytes, over the maximum of "
                              f"{max_bytes}")
    return out


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    props: dict[str, str] = {}
    pos, end = 0, len(data)
    while pos < end:
        (klen,) = _PROP_KEY.unpack_from(data, pos)
        pos += 2
        k = str(data[pos : pos + klen], "utf-8")
        pos += klen
        (vlen,) = _PROP_VAL.unpack_from(data, pos)
        pos += 4
        props[k] = str(data[pos : pos + vlen], "utf-8")
        pos += vlen
    if pos != end:
        raise ValueError("properties overrun their length")
    return props


HEADER_PREFIX = struct.Struct(">III")  # magic, total_size, crc32
HEADER_AFTER_CRC = struct.Struct(">HHQQQQIBHHHII")  # header fields from offset 12
assert HEADER_PREFIX.size + HEADER_AFTER_CRC.size == HEADER.size
HEADER_FIXED = struct.Struct(">HHQQQQI")  # bytes 12-52: flags .. delivery_attempt


def encode_fields(
    flags: int, queue_id: int, queue_offset: int, born_at_ms: int, store_at_ms: int,
    deliver_at_ms: int, delivery_attempt: int, message_id: bytes, topic: bytes, key: bytes,
    tag: bytes, props: bytes, body: bytes,
) -> bytes:
    """Encode one CommitLog record from already-encoded fields (the hot path)."""
    tail = b"".join((
        HEADER_AFTER_CRC.pack(flags, queue_id, queue_offset, born_at_ms, store_at_ms, deliver_at_ms,
                        delivery_attempt, len(message_id), len(topic), len(key), len(tag),
                        len(props), len(body)),
        message_id, topic, key, tag, props, body,
    ))
    return HEADER_PREFIX.pack(RECORD_MAGIC, len(tail) + 12, zlib.crc32(tail)) + tail


def encode_record(m: Message) -> bytes:
    """Encode ``m`` as one CommitLog record (fields as in the module table)."""
    return encode_fields(
        m.flags, m.queue_id, m.queue_offset, m.born_at_ms, m.store_at_ms, m.deliver_at_ms,
        m.delivery_attempt, m.message_id.encode("ascii"), m.topic.encode(), m.key.encode(),
        m.tag.encode(), encode_properties(m.properties), m.body,
    )


class Draft(NamedTuple):
    """A message on its way into the CommitLog; the writer assigns queue, offsets, time and
    (when empty) the id.  ``props`` is already encoded (``encode_properties``)."""

    message_id: str
    topic: str
    key: str
    tag: str
    body: bytes
    props: bytes
    born_at_ms: int
    deliver_at_ms: int
    flags: int = 0
    delivery_attempt: int = 0
    # A stored record to append again (a timer delivery): its id, strings, properties and
    # body are reused as they are; ``body`` and ``props`` above are then unused.
    record: bytes = b""


def draft_of_record(record: bytes, deliver_at_ms: int, flags: int) -> Draft:
    """A draft that appends ``record`` again with new flags and due time (a timer
    delivery: a hot loop, so the header is unpacked once and the tuple built directly);
    ``FLAG_ASSIGNED_ID`` added when the record's id was assigned by a broker, not chosen
    by a client."""
    (_, _, _, was, _, _, born_at_ms, _, _, attempt, id_len, topic_len, key_len, tag_len, _,
     _) = HEADER.unpack_from(record, 0)
    if not was & FLAG_FOREIGN_ID:
        flags |= FLAG_ASSIGNED_ID
    p = HEADER.size
    message_id = record[p : p + id_len].decode("ascii")
    p += id_len
    topic = record[p : p + topic_len].decode()
    p += topic_len
    key = record[p : p + key_len].decode() if key_len else ""
    p += key_len
    tag = record[p : p + tag_len].decode() if tag_len else ""
    return tuple.__new__(Draft, (message_id, topic, key, tag, b"", b"", born_at_ms,
                                 deliver_at_ms, flags, attempt, record))


def reframe_record(record: bytes, flags: int, queue_id: int, queue_offset: int,
                   born_at_ms: int, store_at_ms: int, deliver_at_ms: int,
                   delivery_attempt: int) -> bytes:
    """``record`` with new header fields (bytes 12-52) and a new CRC; the lengths and the
    variable fields (bytes 52 on) are kept as they are."""
    tail = HEADER_FIXED.pack(flags, queue_id, queue_offset, born_at_ms, store_at_ms,
                             deliver_at_ms, delivery_attempt) + record[52:]
    return HEADER_PREFIX.pack(RECORD_MAGIC, len(tail) + 12, zlib.crc32(tail)) + tail


def draft_of(m: Message) -> Draft:
    return Draft(m.message_id, m.topic, m.key, m.tag, m.body, encode_properties(m.properties),
                 m.born_at_ms, m.deliver_at_ms or m.born_at_ms, m.flags, m.delivery_attempt)


class RecordError(ValueError):
    """Raised by the decoder for a record that is truncated or fails its magic/CRC check."""


def check_record(buf: bytes | memoryview, pos: int) -> int:
    """Validate the record at ``pos`` (magic, size, CRC); return its total size."""
    if len(buf) - pos < HEADER.size:
        raise RecordError("truncated header")
    magic, total, crc = struct.unpack_from(">III", buf, pos)
    if magic != RECORD_MAGIC:
        raise RecordError(f"bad magic {magic:#x}")
    if total < HEADER.size or pos + total > len(buf):
        raise RecordError(f"record size {total} runs past the data")
    if zlib.crc32(buf[pos + 12 : pos + total]) != crc:
        raise RecordError("CRC mismatch")
    return int(total)


def decode_record(buf: bytes | memoryview, pos: int = 0, commit_offset: int = -1) -> Message:
    """Decode (and CRC-check) the record at ``pos``."""
    view = memoryview(buf)  # slices of it copy nothing (the CRC reads it in place)
    check_record(view, pos)
    (_, total, _, flags, queue_id, queue_offset, born, store, deliver, attempt,
     id_len, topic_len, key_len, tag_len, props_len, body_len) = HEADER.unpack_from(buf, pos)
    p = pos + HEADER.size
    message_id = str(view[p : p + id_len], "ascii")
    p += id_len
    topic = str(view[p : p + topic_len], "utf-8")
    p += topic_len
    key = str(view[p : p + key_len], "utf-8") if key_len else ""
    p += key_len
    tag = str(view[p : p + tag_len], "utf-8") if tag_len else ""
    p += tag_len
    props = decode_properties(view[p : p + props_len]) if props_len else {}
    p += props_len
    body = bytes(view[p : p + body_len])
    return Message(
        message_id=message_id, topic=topic, body=body, key=key, tag=tag, properties=props,
        born_at_ms=born, store_at_ms=store, deliver_at_ms=deliver, queue_id=queue_id,
        queue_offset=queue_offset, delivery_attempt=attempt, flags=flags,
        commit_offset=commit_offset, record_size=total,
    )


def validate_message_fields(
    topic: str, key: str, tag: str, body: bytes, message_id: str, max_body_bytes: int
) -> None:
    """Raise ``InvalidArgument`` with a message a user can act on for any bad field."""
    if not topic:
        raise InvalidArgument("topic is empty")
    if not body:
        raise InvalidArgument("body is empty")
    if len(body) > max_body_bytes:
        raise InvalidArgument(
            f"body is {len(body)} bytes, over the maximum of {max_body_bytes} bytes "
            "(setting store.max_body_bytes)"
        )
    # a str of n characters encodes to at most 4n bytes: encode only when it could matter
    if len(topic) * 4 > MAX_TOPIC_BYTES and len(topic.encode()) > MAX_TOPIC_BYTES:
        raise InvalidArgument(f"topic name longer than {MAX_TOPIC_BYTES} bytes")
    if len(key) * 4 > MAX_KEY_BYTES and len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"key longer than {MAX_KEY_BYTES} bytes")
    if len(tag) * 4 > MAX_TAG_BYTES and len(tag.encode()) > MAX_TAG_BYTES:
        raise InvalidArgument(f"tag longer than {MAX_TAG_BYTES} bytes")
    if message_id:
        validate_message_id(message_id)


def validate_times(born_at_ms: int, deliver_at_ms: int) -> None:
    """Raise ``InvalidArgument`` for a time a record cannot hold (u64 ms since the epoch,
    below 2**63)."""
    for name, ms in (("born time", born_at_ms), ("delivery time", deliver_at_ms)):
        if not 0 <= ms < MAX_TIME_MS:
            raise InvalidArgument(f"{name} {ms} ms is out of range")


def validate_message_id(message_id: str) -> None:
    if not message_id.isascii() or not message_id.isprintable():
        raise InvalidArgument("message_id must be printable ASCII")
    if len(message_id) > MAX_ID_BYTES:
        raise InvalidArgument(f"message_id longer than {MAX_ID_BYTES} characters")


class MessageIdFormat:
    """Broker-assigned message ids: unique, time-sortable and self-locating.

    32 upper-case hex characters::

        ms timestamp (48 bits) | node id (16 bits) | CommitLog offset of the record (64 bits)

    The offset and the millisecond make an id unique on its broker (an offset is taken
    again only after a torn tail, and then ``store.idfloor`` gives a later millisecond),
    and the offset lets a lookup by id read the record directly, so the hot path writes no
    id index; ids a client chose (replay) or that a redelivery keeps are indexed instead
    (``store.index``).  A client can predict an offset and so name bytes inside a body:
    ``MessageStore.query_by_message_id`` checks the record it reads there is one the store
    wrote.  Ids sort by assignment time across brokers, then by position.  Thread-safe
    (immutable).
    """

    def __init__(self, node_id: int = 0) -> None:
        self.node_id = node_id & 0xFFFF

    def prefix(self, now_ms: int) -> str:
        """The shared first 16 characters of every id assigned at ``now_ms``."""
        return f"{now_ms & 0xFFFF_FFFF_FFFF:012X}{self.node_id:04X}"

    @staticmethod
    def make(prefix: str, commit_offset: int) -> str:
        return f"{prefix}{commit_offset:016X}"

    def locate(self, message_id: str) -> int | None:
        """The CommitLog offset a broker-assigned id of this node names, else None."""
        if len(message_id) != 32:
            return None
        try:
            value = int(message_id, 16)
        except ValueError:
            return None
        if (value >> 64) & 0xFFFF != self.node_id:
            return None
        return value & 0xFFFF_FFFF_FFFF_FFFF


class DispatchInfo(NamedTuple):
    """What a dispatcher needs of a record, decoded from its header without a CRC check
    (records were checked when they were appended or recovered)."""

    commit_offset: int
    record_size: int
    flags: int
    queue_id: int
    queue_offset: int
    store_at_ms: int
    deliver_at_ms: int
    message_id: str
    topic: str
    key: str
    tag: str


def decode_dispatch_infos(data: bytes, base_offset: int) -> tuple[list[DispatchInfo], int]:
    """Decode every complete record in ``data``; return them and the bytes they span."""
    out: list[DispatchInfo] = []
    pos, end = 0, len(data)
    unpack = HEADER.unpack_from
    while end - pos >= HEADER.size:
        (magic, total, _, flags, queue_id, queue_offset, _, store, deliver, _,
         id_len, topic_len, key_len, tag_len, _, _) = unpack(data, pos)
        if magic != RECORD_MAGIC:
            raise RecordError(f"bad magic at commitlog offset {base_offset + pos}")
        if pos + total > end:
            break
        p = pos + HEADER.size
        mid = data[p : p + id_len].decode("ascii")
        p += id_len
        topic = data[p : p + topic_len].decode()
        p += topic_len
        key = data[p : p + key_len].decode() if key_len else ""
        p += key_len
        tag = data[p : p + tag_len].decode() if tag_len else ""
        out.append(DispatchInfo(base_offset + pos, total, flags, queue_id, queue_offset,
                                store, deliver, mid, topic, key, tag))
        pos += total
    return out, pos


def record_size_at(data: bytes, pos: int = 0) -> int:
    """The total size field of the record header at ``pos`` (0 if the header is cut)."""
    if len(data) - pos < 8:
        return 0
    return int.from_bytes(data[pos + 4 : pos + 8], "big")
