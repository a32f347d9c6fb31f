"""Small durable offset checkpoints (one file each).

Layout (16 bytes, big-endian)::

    0   4   magic   0xC4A0C901 (checkpoint format version 1)
    4   8   offset
    12  4   crc32 of bytes [0, 12)

Written to ``<path>.tmp`` then renamed over ``<path>``, so a reader sees the old or the new
value, never a mix.  A checkpoint only ever records progress that is already durable, so an
older value after a crash means "replay a little more", never "lose data".
"""

from __future__ import annotations

import os
import struct
import zlib

from store.errors import StoreError

_MAGIC = 0xC4A0C901
_LAYOUT = struct.Struct(">IQ")


def encode_checkpoint(offset: int) -> bytes:
    head = _LAYOUT.pack(_MAGIC, offset)
    return head + zlib.crc32(head).to_bytes(4, "big")


def decode_checkpoint(data: bytes) -> int:
    if len(data) != _LAYOUT.size + 4:
        raise StoreError(f"checkpoint has {len(data)} bytes, expected {_LAYOUT.size + 4}")
    magic, offset = _LAYOUT.unpack_from(data)
    if magic != _MAGIC or zlib.crc32(data[:12]) != int.from_bytes(data[12:], "big"):
        raise StoreError("checkpoint fails its magic/CRC check")
    return int(offset)


class OffsetCheckpoint:
    """One offset in one file.  Not thread-safe: one owner writes it."""

    def __init__(self, path: str, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync

    def read(self) -> int | None:
        """The stored offset, or None when there is none (or it is unreadable)."""
        try:
            with open(self.path, "rb") as f:
                return decode_checkpoint(f.read())
        except FileNotFoundError:
            return None
        except StoreError:
            # A damaged checkpoint only costs a longer replay from the start.
            return None

    def write(self, offset: int) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(encode_checkpoint(offset))
            if self._fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path)
