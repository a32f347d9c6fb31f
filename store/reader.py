"""RecordReader: reads records back from the CommitLog for consumers and queries, each one
verified before use (magic, CRC, decoding, and the size its location gave).

A record that fails is damaged: ``DamagedRecord`` names it (segment file, offset), the
CommitLog counts it once however often it is read, and it costs that record only:
``read_messages_skipping`` returns the error in its place and the others around it.

A location from the key index or a broker-assigned id is read quietly instead
(``read_located``): it may be stale (index entries of a lost tail stay until replay
rewrites them) or made up by a client, so a mismatch is "not found", not damage; and
what it finds still needs the proof of ``store.lookup`` that the store wrote it there.

Thread-safe (reads only).
"""

from __future__ import annotations

import struct

from store.commitlog import CommitLog
from store.errors import DamagedRecord, StorageIOError, StoreError
from store.message import HEADER, Message, decode_record

_COALESCE_BYTES = 1 << 20  # read_messages merges reads whose span stays under this


class RecordReader:
    def __init__(self, commitlog: CommitLog, max_record_bytes: int) -> None:
        self._log = commitlog
        self._max_record_bytes = max_record_bytes  # bounds a made-up size

    def read_message(self, commit_offset: int, size: int) -> Message:
        """The record at ``commit_offset`` of ``size`` bytes; raises ``DamagedRecord``
        when it fails its checks, ``StorageIOError`` when it is not on local disk."""
        _check_not_hole(commit_offset, size)
        try:
            data = self._log.read(commit_offset, size)
        except StorageIOError as exc:
            if self.on_disk(commit_offset):  # there, but not a whole record of that size
                raise self._log.damaged(commit_offset, str(exc)) from exc
            raise
        return self._decode(data, 0, commit_offset, size)

    def read_messages(self, locations: list[tuple[int, int]]) -> list[Message]:
        """The messages; raises ``DamagedRecord`` naming the first damaged one."""
        out: list[Message] = []
        for m in self.read_messages_skipping(locations):
            if isinstance(m, DamagedRecord):
                raise m
            out.append(m)
        return out

    def read_messages_skipping(self, locations: list[tuple[int, int]]
                               ) -> list[Message | DamagedRecord]:
        """Per ``(commit_offset, size)`` location (in CommitLog order; never a hole), its
        message or the ``DamagedRecord`` that stands for it.  Records close together are
        read with one ``pread`` of the span that holds them."""
        out: list[Message | DamagedRecord] = []
        i = 0
        while i < len(locations):
            start, size = locations[i]
            _check_not_hole(start, size)
            end, j = start + size, i + 1
            while j < len(locations):
                nxt, nsize = locations[j]
                if nxt < end or nxt + nsize - start > _COALESCE_BYTES:
                    break
                _check_not_hole(nxt, nsize)
                end, j = nxt + nsize, j + 1
            try:
                span = self._log.read(start, end - start) if j > i + 1 else b""
            except StorageIOError:  # spans a segment boundary: read one by one
                span = b""
            for offset, rec_size in locations[i:j]:
                try:
                    if span:
                        out.append(self._decode(span, offset - start, offset, rec_size))
                    else:
                        out.append(self.read_message(offset, rec_size))
                except DamagedRecord as exc:
                    out.append(exc)
            i = j
        return out

    def read_located(self, offset: int, size: int) -> Message | None:
        """The record an index entry or an id points at, or None when there is none
        (deleted by retention, stale, made up); the caller checks it is the one it wanted."""
        if not self.on_disk(offset) or not HEADER.size <= size <= self._max_record_bytes:
            return None
        try:
            m = decode_record(self._log.read(offset, size), 0, offset)
        except (StoreError, ValueError, struct.error):
            return None
        return m if m.record_size == size else None

    def on_disk(self, offset: int) -> bool:
        return self._log.min_offset <= offset < self._log.confirmed_offset

    def _decode(self, buf: bytes, pos: int, commit_offset: int, size: int) -> Message:
        try:
            m = decode_record(buf, pos, commit_offset)
        except (ValueError, struct.error) as exc:  # RecordError, bad UTF-8, bad properties
            raise self._log.damaged(commit_offset, str(exc)) from exc
        if m.record_size != size:
            raise self._log.damaged(
                commit_offset, f"the record is {m.record_size} bytes, its location says {size}")
        return m


def _check_not_hole(commit_offset: int, size: int) -> None:
    if size == 0:
        raise ValueError(f"(commitlog offset {commit_offset}, size 0) is a hole in its "
                         "ConsumeQueue, not a record: skip it (CqEntry.is_hole)")
