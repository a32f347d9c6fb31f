"""CopySettler: a retry or dead-letter copy and the lease entry it replaces are settled
together, across any crash.

Revive, Nack and dead-lettering append a copy of a leased message to the group's retry
(or dead-letter) topic and then mark the lease entry done.  The two writes go to
different logs (the CommitLog, the POP RocksDB), so a crash can fall between them; the
entry would then be revived once more after the restart and the group would receive
the message twice, possibly after acking the first copy.  The copy is therefore its own
proof: each one carries the entry it replaces in the property ``chronomq.lease``, and
this class follows the CommitLog as a dispatch handler (``name = "pop"``):

- in steady state, the POP service registers each copy before appending it
  (``begin``) and ends the registration once the entry's mark is written
  (``settled``); the handler's durable position never passes a copy whose entry is
  still being marked, so a crash there replays the copy;
- a copy the handler meets without a registration (replayed after a crash) names its
  entry, which is handed to the POP service to mark done (``mark_found``); marking is
  idempotent.

Position: ``b"!position"`` in the POP RocksDB (u64, big-endian), the CommitLog offset
before which every copy's entry is marked.  Thread-safe.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import NamedTuple

from store.errors import StoreError
from store.kv import KV
from store.message import FLAG_RETRY, DispatchInfo, decode_record
from store.store import MessageStore

log = logging.getLogger(__name__)

PROP_LEASE = "chronomq.lease"
_POSITION = b"!position"
_U64 = struct.Struct(">Q")
_SETTLED_MEMORY = 65_536


class LeaseEntry(NamedTuple):
    group: str
    topic: str  # the leased topic (user or retry)
    queue_id: int
    queue_offset: int


def encode_lease(e: LeaseEntry) -> str:
    """``"<group> <leased topic> <queue id> <queue offset>"`` (names hold no spaces)."""
    return f"{e.group} {e.topic} {e.queue_id} {e.queue_offset}"


def decode_lease(text: str) -> LeaseEntry | None:
    parts = text.split(" ")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return LeaseEntry(parts[0], parts[1], int(parts[2]), int(parts[3]))


def replaced_lease(properties: Mapping[str, str]) -> LeaseEntry | None:
    """The lease entry a retry or dead-letter copy replaces (its ``PROP_LEASE``), or
    None for any other message."""
    return decode_lease(properties.get(PROP_LEASE, ""))


def lease_replaced_by(record: bytes) -> LeaseEntry | None:
    """``replaced_lease`` of a stored record (a departed broker's, read from its tier)."""
    return replaced_lease(decode_record(record, 0, 0).properties)


CopyKey = tuple[str, str]  # (copy topic, message id)


class CopySettler:
    name = "pop"

    def __init__(self, kv: KV, store: MessageStore,
                 mark_found: Callable[[list[tuple[str, LeaseEntry]]], None]) -> None:
        self._kv = kv
        self._store = store
        self._mark_found = mark_found
        self._lock = threading.Lock()
        self._settling: dict[CopyKey, LeaseEntry] = {}
        self._unsettled: dict[CopyKey, int] = {}  # dispatched while settling: -> offset
        self._settled: OrderedDict[CopyKey, None] = OrderedDict()
        raw = kv.get(_POSITION)
        self._position = int(_U64.unpack(raw)[0]) if raw else 0
        self._pending_position = self._position
        self.recovered = 0  # entries marked done from a copy found in the CommitLog

    # ------------------------------------------------------------------ POP side

    def begin(self, copies: list[tuple[CopyKey, LeaseEntry]]) -> None:
        """Copies about to be appended (their entries are not marked yet)."""
        with self._lock:
            for key, entry in copies:
                self._settling[key] = entry

    def settled(self, keys: list[CopyKey], appended: bool = True) -> None:
        """The entries of these copies are marked done (or, ``appended=False``, the
        append failed and nothing was written)."""
        with self._lock:
            for key in keys:
                self._settling.pop(key, None)
                self._unsettled.pop(key, None)
                if appended:
                    self._settled[key] = None
            while len(self._settled) > _SETTLED_MEMORY:
                self._settled.popitem(last=False)

    # ------------------------------------------------------------------ DispatchHandler

    def position(self) -> int:
        return self._position

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        self._pending_position = end_offset
        found: list[DispatchInfo] = []
        with self._lock:
            for r in records:
                if not r.flags & FLAG_RETRY:
                    continue
                key = (r.topic, r.message_id)
                if key in self._settling:
                    self._unsettled.setdefault(key, r.commit_offset)
                elif key not in self._settled:
                    found.append(r)
        if found:
            self._settle_found(found)

    def _settle_found(self, records: list[DispatchInfo]) -> None:
        entries: list[tuple[str, LeaseEntry]] = []
        for r in records:
            try:
                m = self._store.read_message(r.commit_offset, r.record_size)
            except StoreError as exc:  # a damaged copy: its entry revives once more
                log.error("cannot read retry copy at commitlog offset %d: %s",
                          r.commit_offset, exc)
                continue
            entry = replaced_lease(m.properties)
            if entry is not None:
                entries.append((r.topic, entry))
        if entries:
            self._mark_found(entries)
            self.recovered += len(entries)

    def flush(self) -> None:
        with self._lock:
            low = min(self._unsettled.values(), default=self._pending_position)
        position = min(low, self._pending_position)
        if position != self._position:
            self._kv.write([(_POSITION, _U64.pack(position))])
            self._position = position

    def rewind(self, offset: int) -> None:
        if self._position > offset:
            self._kv.write([(_POSITION, _U64.pack(offset))], sync=True)
            self._position = self._pending_position = offset
