"""Renewal marks: which leases a RocketMQ push consumer's front keeps renewing, kept
with the leases so that a restart or a takeover goes on renewing them.

A push consumer (an ``auto_renew`` receive) works on a message for as long as its
listener takes; the front extends the lease while the client lives
(``chronomq.rocketmq.renewal``).  Were that list in memory only, a failover would end
the renewing: each lease would run out at its last renewal's deadline and the message
come again while the listener still works on it.  So the front writes one mark a
message, in the POP RocksDB among the other broker state (``STATE_PREFIX`` keys:
journaled, snapshotted and replayed by a takeover with the groups' leases), before the
receive answers; a settle deletes it::

    key                              value
    b"Rr" | receipt handle (ASCII)   version u8 (1) | invisible_s u32 | received_ms i64
                                     | group length u16 | group | client id (UTF-8)

A takeover adopts the departed broker's marks with its leases, in the same write, their
``received_ms`` moved onto this broker's clock by the leases' shift (``pop.leaseclock``):
the handle, signed by the departed broker, is accepted here as the client's Ack is.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from pop.checkpoint import STATE_PREFIX

KEY_PREFIX = STATE_PREFIX + b"r"
_HEAD = struct.Struct(">BIqH")
_VERSION = 1
MAX_HANDLE_BYTES = 1024  # a handle is ~100 bytes; a longer key is not a mark of ours


@dataclass(frozen=True, slots=True)
class RenewMark:
    """One message a push consumer holds: renew its lease by ``invisible_s`` while the
    client ``client`` lives, for at most a bound after ``received_ms``."""

    handle: str
    group: str
    client: str
    invisible_s: int
    received_ms: int


def mark_key(handle: str) -> bytes:
    return KEY_PREFIX + handle.encode("ascii")


def encode_mark(mark: RenewMark) -> tuple[bytes, bytes]:
    """The mark's key and value."""
    group = mark.group.encode()
    value = _HEAD.pack(_VERSION, mark.invisible_s, mark.received_ms, len(group)) + group \
        + mark.client.encode()
    return mark_key(mark.handle), value


def decode_mark(key: bytes, value: bytes) -> RenewMark | None:
    """The mark a key and value hold; None when they are not one (another version, a
    damaged value): it is left alone, never renewed."""
    if not key.startswith(KEY_PREFIX) or len(key) - len(KEY_PREFIX) > MAX_HANDLE_BYTES \
            or len(value) < _HEAD.size:
        return None
    version, invisible_s, received_ms, glen = _HEAD.unpack_from(value)
    if version != _VERSION or len(value) < _HEAD.size + glen:
        return None
    try:
        handle = key[len(KEY_PREFIX):].decode("ascii")
        group = value[_HEAD.size:_HEAD.size + glen].decode()
        client = value[_HEAD.size + glen:].decode()
    except UnicodeDecodeError:
        return None
    return RenewMark(handle, group, client, int(invisible_s), int(received_ms))


def moved_marks(items: Iterable[tuple[bytes, bytes]], shift_ms: int
                ) -> list[tuple[bytes, bytes]]:
    """The renewal marks among a departed broker's state ``items``, their receive times
    moved ``shift_ms`` onto this broker's clock (a takeover: ``pop.leaseclock``)."""
    out = []
    for key, value in items:
        if key.startswith(KEY_PREFIX):
            mark = decode_mark(key, value)
            if mark is not None:
                out.append(encode_mark(RenewMark(mark.handle, mark.group, mark.client,
                                                 mark.invisible_s,
                                                 mark.received_ms + shift_ms)))
    return out
