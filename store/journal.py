"""StateJournal: the broker's state changes as records of its state stream, so that they
reach the tier with the messages and another broker can take over from them.

What a broker promises besides its messages (where each consumer group stands, the
leases in flight, the delayed messages cancelled, rescheduled or delivered) lives in
local RocksDB views (``pop.leasebook``, ``timer.store``).  Each change to them is also
appended to the CommitLog as a record of a journal stream (one queue, flagged
``FLAG_STATE``): the groups' changes to the state stream (``store.names.STATE_STREAM``),
the timer's to the timer stream (``TIMER_STREAM``).  The tiered dispatcher uploads them
like any queue, in CommitLog order with the messages, so the tier has every change
within the upload lag.  The pending delayed records themselves go up in the delayed stream
(``store.names.DELAYED_STREAM``; ``tiered.dispatcher``).  With ``tier.durable_ack`` the
caller waits (``wait_tier``) until the tier has the change before it answers OK.

Records (the record's tag names the kind; the body):

==============  ==========  ================================================================
tag             stream      body
==============  ==========  ================================================================
``pop``         state       writes of the POP RocksDB, repeated: ``b"P"``, u16 key length,
                            key, u32 value length, value; or ``b"D"``, u16 key length, key
``pop-reset``   state       the same, applied after clearing the book: the first chunk of a
                            snapshot of the whole book (``pop.leasejournal``)
``timer-done``  timer       u64 delayed-stream queue offsets: delivered or cancelled
``timer-move``  timer       (u64 delayed-stream queue offset, u64 new due time in ms) pairs
==============  ==========  ================================================================

**Snapshots bound a takeover's replay.**  The state stream gets a record per Pop and per
Ack: it grows with the broker's history.  A snapshot of the whole book is written into
it at every start (so a change a crash kept from the journal is in it again) and after
every ``tier.journal_snapshot_records`` records; once the tier holds a snapshot, the
tier's ``<broker>/state/snapshot.json`` points at its first record, and a takeover
replays the state stream from there: its time follows the book's size, not the
history.  The timer stream is read whole: one record per delivery batch, Cancel or
Reschedule, as the delayed stream it refers to is.

Order: a view's write and its journal record are made under one lock (``ordered``), so
the journal holds the writes of a key in the order the view got them, and replaying it
(``JournalState``) gives the view's state.  Without durable-ack the record is not waited
for: a crash between the view's write and the record loses the record, and the snapshot
at the next start puts the state back in the journal (timer records lost so lose only
a removal: at worst a message delivered once more after a takeover).
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

from store.message import FLAG_DELAYED, FLAG_STATE, DispatchInfo, Draft
from store.names import DELAYED_STREAM, STATE_STREAM, TIMER_STREAM
from store.store import MessageStore

POP, POP_RESET, TIMER_DONE, TIMER_MOVE = "pop", "pop-reset", "timer-done", "timer-move"
SNAPSHOT_POINTER = "state/snapshot.json"  # under the broker's prefix in the tier
SNAPSHOT_CHUNK = 1 << 20  # bytes of one pop-reset/pop record of the start snapshot
_KEY_LEN, _VALUE_LEN, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_QUEUE_OFFSET = struct.Struct(">Q")  # a record's queue offset, bytes 16-24


class DurableTier(Protocol):
    def wait_durable(self, end_offset: int, timeout_s: float | None = None) -> None: ...


def snapshot_pointer(queue_offset: int) -> bytes:
    """The content of ``<broker>/state/snapshot.json``: the state stream's queue offset of
    the first record of a snapshot the tier holds."""
    return json.dumps({"version": 1, "queue_offset": queue_offset}).encode()


def read_snapshot_pointer(raw: bytes) -> int | None:
    """The queue offset in a snapshot pointer; None when it is not one."""
    try:
        d = json.loads(raw)
        offset = d["queue_offset"] if isinstance(d, dict) else None
    except (ValueError, KeyError):
        return None
    return offset if isinstance(offset, int) and offset >= 0 else None


def encode_ops(puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes] = ()) -> bytes:
    out: list[bytes] = []
    for k, v in puts:
        out += (b"P", _KEY_LEN.pack(len(k)), k, _VALUE_LEN.pack(len(v)), v)
    for k in deletes:
        out += (b"D", _KEY_LEN.pack(len(k)), k)
    return b"".join(out)


def decode_ops(body: bytes) -> Iterator[tuple[bytes, bytes | None]]:
    """(key, value) in order; value None: a delete.  Raises ValueError on a bad body."""
    pos, n = 0, len(body)
    while pos < n:
        op = body[pos:pos + 1]
        (klen,) = _KEY_LEN.unpack_from(body, pos + 1)
        key = body[pos + 3:pos + 3 + klen]
        pos += 3 + klen
        if op == b"P":
            (vlen,) = _VALUE_LEN.unpack_from(body, pos)
            yield key, body[pos + 4:pos + 4 + vlen]
            pos += 4 + vlen
        elif op == b"D":
            yield key, None
        else:
            raise ValueError(f"unknown journal op {op!r}")
        if pos > n:
            raise ValueError("a journal record ends inside an op")


class Gate(Protocol):
    """What an OK passes once its change is durable (``cluster.fence.Fence``)."""

    def check(self) -> None: ...

    def may_change(self) -> bool: ...


class StateJournal:
    """Appends state records and waits for them (see the module docstring).  Off (every
    call a no-op) unless the store has the state stream.  Thread-safe."""

    def __init__(self, store: MessageStore, tier: DurableTier | None = None,
                 durable_ack: bool = False, gate: Gate | None = None) -> None:
        self._store = store
        self._tier = tier
        self.durable_ack = durable_ack and tier is not None
        self.ordered = threading.Lock()  # a view's write and its record, in one order
        self._gate = gate  # raises while no OK may be given

    @property
    def enabled(self) -> bool:
        return self._store.topics.get(STATE_STREAM) is not None and \
            self._store.topics.get(TIMER_STREAM) is not None

    def empty(self) -> bool:
        """Whether the state stream holds no record yet."""
        return self._store.queue_bounds(STATE_STREAM, 0)[1] == 0

    def append(self, tag: str, body: bytes, stream: str = STATE_STREAM
               ) -> Future[Any] | None:
        """Queue a journal record; the future resolves once it is in the CommitLog (to
        the records' ``DispatchInfo``)."""
        if not body or not self.enabled:
            return None
        now = self._store.clock.now_ms()
        return self._store.put_drafts([Draft("", stream, "", tag, body, b"", now, now,
                                             FLAG_STATE)])

    def records(self) -> int:
        """The state stream's length in records (its next queue offset)."""
        return self._store.queue_bounds(STATE_STREAM, 0)[1] if self.enabled else 0

    def settle(self, future: Future[Any] | None) -> None:
        """Wait for a record of ``append``: in the CommitLog, and with durable-ack in the
        tier."""
        if future is None:
            return
        infos: list[DispatchInfo] = future.result()
        self.wait_tier(infos)

    def wait_tier(self, infos: list[DispatchInfo]) -> None:
        """With durable-ack, return once the tier holds these stored records (raises
        ``TierUnavailable`` when it does not in time); then the fencing check."""
        if self.durable_ack and infos and self._tier is not None:
            self._tier.wait_durable(max(i.commit_offset + i.record_size for i in infos))
        self.check()

    def check(self) -> None:
        """Raise unless this broker may answer OK to a change now (the gate,
        ``cluster.fence``: checked after the change is durable, just before the answer)."""
        if self._gate is not None:
            self._gate.check()

    def may_change(self) -> bool:
        """Whether background work that changes state (timer deliveries, revives) may
        run now: not while fenced."""
        return self._gate is None or self._gate.may_change()

    # ------------------------------------------------------------------ the timer's

    def stream_offset(self, record: bytes, commit_offset: int) -> int | None:
        """The delayed-stream queue offset of a pending delayed ``record`` (None: it was
        written before the stream existed, or the journal is off)."""
        stream = self._store.topics.get(DELAYED_STREAM)
        if stream is None or commit_offset < stream.since_offset or not self.enabled:
            return None
        return int(_QUEUE_OFFSET.unpack_from(record, 16)[0])

    def done_draft(self, offsets: list[int]) -> Draft | None:
        """The ``timer-done`` record of deliveries, to append with their copies."""
        if not offsets or not self.enabled:
            return None
        now = self._store.clock.now_ms()
        return Draft("", TIMER_STREAM, "", TIMER_DONE, b"".join(_U64.pack(o) for o in offsets),
                     b"", now, now, FLAG_STATE)

    def timer_done(self, offsets: list[int]) -> Future[Any] | None:
        return self.append(TIMER_DONE, b"".join(_U64.pack(o) for o in offsets), TIMER_STREAM)

    def timer_moved(self, moves: list[tuple[int, int]]) -> Future[Any] | None:
        return self.append(TIMER_MOVE, b"".join(_PAIR.pack(o, d) for o, d in moves),
                           TIMER_STREAM)


class JournalState:
    """A departed broker's state rebuilt from its state stream (``apply`` each record in
    order): the POP RocksDB's contents, the delayed-stream offsets done, the moves."""

    def __init__(self) -> None:
        self.pop: dict[bytes, bytes] = {}
        self.done: set[int] = set()
        self.moved: dict[int, int] = {}
        self.records = self.bad = 0
        self.seconds = 0.0  # set by the reader: how long reading and replaying took
        self.timer_snapshot: Any = None  # the timer snapshot it started from (the reader's)

    def apply(self, tag: str, body: bytes) -> None:
        self.records += 1
        try:
            if tag in (POP, POP_RESET):
                if tag == POP_RESET:
                    self.pop.clear()
                for k, v in decode_ops(body):
                    if v is None:
                        self.pop.pop(k, None)
                    else:
                        self.pop[k] = v
            elif tag == TIMER_DONE:
                self.done.update(o for (o,) in _U64.iter_unpack(body))
            elif tag == TIMER_MOVE:
                self.moved.update(_PAIR.iter_unpack(body))
            else:
                self.bad += 1
        except (ValueError, struct.error):
            self.bad += 1

    def pending_due(self, queue_offset: int, flags: int, due_ms: int) -> int | None:
        """The due time of the delayed stream's record at ``queue_offset`` if it is still
        pending, else None."""
        if not flags & FLAG_DELAYED or queue_offset in self.done:
            return None
        return self.moved.get(queue_offset, due_ms)
