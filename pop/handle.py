"""Receipt handles: opaque to clients, signed by the broker.

Payload (big-endian), then a 16-byte MAC, all base64url without padding::

    0   1   version          1; bit 7 set: renewable (below)
    1   2   queue_id
    3   8   ck_start         queue offset where the lease's PopCheckpoint starts
    11  8   queue_offset     the message's queue offset
    19  8   expire_at_ms     when the lease ends (pop time + invisible time)
    27  2   attempt          delivery attempt, from 1
    29  1   topic_len
    30  n   topic (UTF-8)
    30+n 16 mac              HMAC-SHA256(secret, group + b"\\0" + payload)[:16]

The group is bound into the MAC but not stored, so a handle issued to one group fails
verification in any other.

A *renewable* handle (``renewable``: what the RocketMQ front gives a push consumer, whose
leases it renews while the client works) names its lease entry at whatever deadline the
entry has now: ``expire_at_ms`` is the deadline it was issued with, and a renewal, which
moves the deadline, does not supersede it.  It settles the entry while the entry is open
and before its current deadline (``LeaseBook.lease_of``), here or at a successor,
with nothing remembered beside the lease.

A broker that takes another over (``cluster.takeover``) adopts its leases under the
same keys (group, topic, queue, checkpoint start) and its secret (``adopt``): a handle
the departed broker signed verifies here too and, naming the same lease with the same
deadline, settles it; the handles this codec issues are always signed with its own
secret.  Thread-safe (the adopted secrets are replaced whole).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import struct
from typing import NamedTuple

from store.errors import InvalidArgument

_VERSION = 1
_RENEWABLE = 0x80  # bit of the version byte
_FIXED = struct.Struct(">BHQQQHB")
_MAC_BYTES = 16


class ReceiptHandle(NamedTuple):
    topic: str
    queue_id: int
    ck_start: int
    queue_offset: int
    expire_at_ms: int
    attempt: int
    renewable: bool = False  # settles its entry at the entry's current deadline


class InvalidReceiptHandle(InvalidArgument):
    """Raised when a receipt handle is malformed, altered, forged or from another group."""


def _check_secret(secret: bytes) -> bytes:
    if len(secret) < 16:
        raise ValueError("the receipt-handle secret needs at least 16 bytes")
    return secret


class HandleCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = _check_secret(secret)
        # departed brokers' secrets, each with how far its handles' deadlines move onto
        # this broker's clock (``adopt``)
        self._adopted: tuple[tuple[bytes, int], ...] = ()

    def adopt(self, secret: bytes, shift_ms: int = 0) -> None:
        """Accept handles signed with ``secret`` too: a broker taken over signed them.
        Their ``expire_at_ms`` is read ``shift_ms`` later: the deadline of the lease
        they name moved so far onto this broker's clock (``pop.leaseclock``)."""
        if secret != self._secret:
            self._adopted = (*((s, m) for s, m in self._adopted if s != secret),
                             (_check_secret(secret), shift_ms))

    def _mac(self, group: str, payload: bytes, secret: bytes | None = None) -> bytes:
        return hmac.digest(secret or self._secret, group.encode() + b"\0" + payload,
                           "sha256")[:_MAC_BYTES]

    def _verified(self, group: str, payload: bytes, mac: bytes) -> int | None:
        """The shift of the secret that signed it (0: this broker's); None: none did."""
        return next((shift for secret, shift in ((self._secret, 0), *self._adopted)
                     if hmac.compare_digest(mac, self._mac(group, payload, secret))), None)

    def encode(self, group: str, h: ReceiptHandle) -> str:
        tb = h.topic.encode()
        version = _VERSION | (_RENEWABLE if h.renewable else 0)
        payload = _FIXED.pack(version, h.queue_id, h.ck_start, h.queue_offset,
                              h.expire_at_ms, h.attempt, len(tb)) + tb
        raw = payload + self._mac(group, payload)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, group: str, text: str, verify: bool = True) -> ReceiptHandle:
        """Parse and check a handle.  ``verify=False`` skips the MAC, for a handle the
        caller knows this codec issued to ``group`` (a Subscribe stream's own)."""
        if not text:
            raise InvalidReceiptHandle("receipt handle is empty")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError) as exc:
            raise InvalidReceiptHandle("receipt handle is malformed (not base64url)") from exc
        if len(raw) < _FIXED.size + _MAC_BYTES:
            raise InvalidReceiptHandle("receipt handle is malformed (too short)")
        payload, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        shift_ms = self._verified(group, payload, mac) if verify else 0
        if shift_ms is None:
            raise InvalidReceiptHandle(
                f"receipt handle is not valid for group {group!r}: it was altered, forged, "
                "or issued to another group"
            )
        version, qid, ck_start, qo, expire, attempt, tlen = _FIXED.unpack_from(payload)
        if version & ~_RENEWABLE != _VERSION or len(payload) != _FIXED.size + tlen:
            raise InvalidReceiptHandle("receipt handle has an unknown version or layout")
        topic = payload[_FIXED.size :].decode()
        return ReceiptHandle(topic, qid, ck_start, qo, expire + shift_ms, attempt,
                             bool(version & _RENEWABLE))
