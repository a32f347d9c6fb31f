"""Timer snapshots: the timer's live state in the tier, so that a takeover reads what a
broker holds now (its pending delayed messages), not every delayed message it ever took.

The delayed stream holds every delayed record as sent, the timer stream a record per
delivery batch, Cancel and Reschedule (``store.journal``): both grow with the broker's
history.  Every ``tier.journal_snapshot_records`` records (or half as many as the latest
snapshot holds, if more: a snapshot costs at most twice what it saves, and the streams
past it stay under half its size), and every ``tier.journal_snapshot_s`` once
``BY_TIME_RECORDS`` and that half came (with durable-ack the streams are many small
objects, about one per commit, and a takeover read them one request each: 572 timer
records of two minutes took 2 s of one in the failover chaos) the broker that owns
them folds what its tier committed since the last snapshot into a new one, from the tier
alone (``TimerCompactor.step``, the server's scheduler, one thread):

    pending(C1) = [r in parts(C0) + delayed[C0:C1] if r not done] with moved due times

where ``C`` is a delayed-stream queue offset and ``done``/``moved`` come from the
residual of the previous snapshot and the timer stream ``[T0:T1)``.  What those name at
or past ``C1`` is kept as the new residual: the queues commit apart, so the timer stream
may already name records the delayed stream's snapshot does not cover yet.

**Folds.**  The delayed messages this broker adopted in a finished takeover (``Fold``:
``cluster.compaction``) go into the next snapshot's parts too, under their adopted
offsets (``tiered.timerflatfile``: bit 63 set, never a delayed-stream offset), and the
pointer names the adoption's manifest digest (``folded``) and the brokers it names
(``folded_brokers``; of those, ``flat_brokers``: the ones whose TimerFlatFiles this
broker still reads, for a takeover to adopt them in place); a takeover of this broker
then reads them here, not from those brokers' tiers (``cluster.adoption``).  The
residual keeps an adopted offset only while no record of the parts has it (an adoption
not folded yet).

Objects (under the broker's prefix):

=========================================  ====================================================
``timer-snapshot/<C>-<T>-<F>/part-<n>``    ``MAGIC``, then per pending record: u64 delayed
                                           offset, u64 due ms, u32 length, the record as sent;
                                           u32 CRC-32 of all before it; ascending offsets
``timer-snapshot/<C>-<T>-<F>/residual``    ``MAGIC``, u32 count done, u64 each, u32 count
                                           moved, (u64 offset, u64 due) each, u32 CRC-32
``state/timer-snapshot.json``              the pointer: version, ``delayed_from`` C,
                                           ``timer_from`` T, the parts, the residual, records;
                                           version 2: ``folded``, ``folded_brokers``,
                                           ``flat_brokers`` (absent: all folded ones)
=========================================  ====================================================

``F`` is the count of adoptions the snapshot has folded in (``folded``): a snapshot
that folds one in while the streams stand still gets a prefix of its own, so writing
it never replaces or deletes an object the current pointer names.

Order of durable steps: the parts and the residual are written, then the pointer; only
then are the previous snapshot's objects deleted (after the lease is confirmed: a
broker taken over deletes nothing), and the delayed and timer streams' segments wholly
below ``C`` and ``T`` become deletable by tier retention (``TieredDispatcher``; the
floors are read back from the pointer in the tier).  A crash before the pointer leaves
orphans of the unfinished snapshot (deleted at the next step); a pointer always names a
snapshot written whole.  A takeover (``cluster.replay``) reads the parts, the residual,
the timer stream from ``T`` and the delayed stream from ``C``.

Not thread-safe: one compactor per broker, on one thread.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from store.crashpoint import crashpoint
from store.errors import ChronomqError
from store.journal import SNAPSHOT_POINTER, JournalState, read_snapshot_pointer
from store.message import FLAG_DELAYED, decode_dispatch_infos, decode_record
from store.names import DELAYED_STREAM, STATE_STREAM, TIMER_STREAM
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider
from tiered.queue import TieredEntry
from tiered.timerflatfile import is_adopted

log = logging.getLogger(__name__)

MAGIC = b"CMQTSNP1"
POINTER = "state/timer-snapshot.json"  # under the broker's prefix
PART_BYTES = 32 << 20  # a part object is closed at this size
READ_BATCH = 5_000
BY_TIME_RECORDS = 100  # a snapshot by time needs at least this many stream records since
_ENTRY = struct.Struct(">QQI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")


class PendingRecord(NamedTuple):
    queue_offset: int  # in the delayed stream; or adopted (``is_adopted``): folded
    due_ms: int  # rescheduled, when it was
    record: bytes  # as sent


class Fold(NamedTuple):
    """A finished adoption whose pending messages go into the next snapshot."""
    digest: str  # of its manifest (``cluster.adoption.manifest_digest``)
    brokers: list[str]  # every broker its manifest names
    rows: Callable[[], Iterator[list[PendingRecord]]]  # offsets adopted, dues as adopted


@dataclass
class Pointer:
    delayed_from: int = 0
    timer_from: int = 0
    parts: list[str] = field(default_factory=list)
    residual: str = ""
    records: int = 0
    folded: list[str] = field(default_factory=list)  # adoption manifests in the parts
    folded_brokers: list[str] = field(default_factory=list)  # the brokers they name
    # of those, the ones whose TimerFlatFiles still hold objects the owner reads: a
    # takeover of it adopts these in place (None: every folded broker, as before)
    flat_brokers: list[str] | None = None

    def flat(self) -> list[str]:
        return self.folded_brokers if self.flat_brokers is None else self.flat_brokers

    def encode(self) -> bytes:
        d: dict[str, object] = {
            "version": 2 if self.folded else 1, "delayed_from": self.delayed_from,
            "timer_from": self.timer_from, "parts": self.parts, "residual": self.residual,
            "records": self.records}
        if self.folded:  # (version 2: a release that cannot read adopted offsets refuses)
            d.update(folded=self.folded, folded_brokers=self.folded_brokers)
            if self.flat_brokers is not None:
                d.update(flat_brokers=self.flat_brokers)
        return json.dumps(d).encode()


def decode_pointer(raw: bytes) -> Pointer | None:
    """The pointer's content; None when it is not one."""
    try:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("version") not in (1, 2):
            return None
        p = Pointer(int(d["delayed_from"]), int(d["timer_from"]),
                    [str(x) for x in d["parts"]], str(d["residual"]), int(d["records"]),
                    [str(x) for x in d.get("folded", [])],
                    [str(x) for x in d.get("folded_brokers", [])],
                    [str(x) for x in d["flat_brokers"]] if "flat_brokers" in d else None)
    except (ValueError, KeyError, TypeError):
        return None
    return p if min(p.delayed_from, p.timer_from, p.records) >= 0 else None


def read_pointer(tier: Provider, broker: str) -> Pointer | None:
    """``broker``'s timer snapshot pointer in the tier (None: none, or unreadable)."""
    try:
        raw = tier.read(f"{broker}/{POINTER}")
    except TierNotFound:
        return None
    except TierError as exc:
        log.warning("cannot read the timer snapshot pointer of %s: %s", broker, exc)
        return None
    pointer = decode_pointer(raw)
    if pointer is None:
        log.error("the timer snapshot pointer of %s is damaged: %r", broker, raw[:100])
    return pointer


def stream_floors(tier: Provider, broker: str) -> dict[str, int]:
    """Per system stream, the queue offset below which no takeover reads it any more, as
    the tier's pointers say (what tier retention may delete: ``TieredDispatcher``)."""
    floors: dict[str, int] = {}
    pointer = read_pointer(tier, broker)
    if pointer is not None:
        floors[DELAYED_STREAM], floors[TIMER_STREAM] = pointer.delayed_from, pointer.timer_from
    try:
        at = read_snapshot_pointer(tier.read(f"{broker}/{SNAPSHOT_POINTER}"))
    except TierError:  # none yet, or unreadable: nothing of the state stream goes
        at = None
    if at is not None:
        floors[STATE_STREAM] = at
    return floors


# ------------------------------------------------------------------ the objects


def _sealed(body: bytes) -> bytes:
    return body + _U32.pack(zlib.crc32(body))


def _unsealed(path: str, raw: bytes) -> bytes:
    if len(raw) < len(MAGIC) + 4 or not raw.startswith(MAGIC) or \
            _U32.unpack_from(raw, len(raw) - 4)[0] != zlib.crc32(raw[:-4]):
        raise TierError(f"timer snapshot object {path} is damaged (magic or checksum)")
    return raw[len(MAGIC):-4]


def read_part(tier: Provider, path: str) -> Iterator[PendingRecord]:
    """The pending records of one part, ascending.  Raises ``TierError`` when it is
    missing or damaged."""
    body = _unsealed(path, tier.read(path))
    pos = 0
    while pos < len(body):
        offset, due, length = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        yield PendingRecord(offset, due, body[pos:pos + length])
        pos += length


def read_residual(tier: Provider, path: str) -> tuple[set[int], dict[int, int]]:
    """Done offsets and moves at or past the snapshot's ``C``.  Raises ``TierError``."""
    body = _unsealed(path, tier.read(path))
    (n,) = _U32.unpack_from(body, 0)
    done = {o for (o,) in _U64.iter_unpack(body[4:4 + 8 * n])}
    at = 4 + 8 * n
    (m,) = _U32.unpack_from(body, at)
    moved = dict(_PAIR.iter_unpack(body[at + 4:at + 4 + 16 * m]))
    return done, moved


def encode_residual(done: set[int], moved: dict[int, int]) -> bytes:
    ds = sorted(done)
    return _sealed(MAGIC + _U32.pack(len(ds)) + b"".join(_U64.pack(o) for o in ds)
                   + _U32.pack(len(moved))
                   + b"".join(_PAIR.pack(o, d) for o, d in sorted(moved.items())))


class _PartWriter:
    """Writes pending records into parts of at most ``PART_BYTES``."""

    def __init__(self, tier: Provider, prefix: str) -> None:
        self._tier, self._prefix = tier, prefix
        self._chunks: list[bytes] = [MAGIC]
        self._size = len(MAGIC)
        self.paths: list[str] = []
        self.records = 0

    def add(self, r: PendingRecord) -> None:
        self._chunks += (_ENTRY.pack(r.queue_offset, r.due_ms, len(r.record)), r.record)
        self._size += _ENTRY.size + len(r.record)
        self.records += 1
        if self._size >= PART_BYTES:
            self.flush()

    def flush(self) -> None:
        if len(self._chunks) == 1:
            return
        path = f"{self._prefix}part-{len(self.paths):05d}"
        self._tier.write(path, _sealed(b"".join(self._chunks)))
        self.paths.append(path)
        self._chunks, self._size = [MAGIC], len(MAGIC)


def _named(pointer: Pointer) -> set[str]:
    """The objects ``pointer`` names (what a takeover reading it needs)."""
    return {*pointer.parts, pointer.residual} - {""}


# ------------------------------------------------------------------ the compactor


class TimerCompactor:
    """Folds the broker's committed delayed and timer streams into timer snapshots (see
    the module docstring).  ``read(stream, queue_offset, count)`` reads the broker's own
    committed entries from the tier, ``committed(stream)`` the end of what it committed;
    ``confirm()`` is True while this broker still holds its lease."""

    def __init__(self, tier: Provider, broker: str,
                 read: Callable[[str, int, int], list[TieredEntry]],
                 committed: Callable[[str], int], confirm: Callable[[], bool],
                 every: int, folds: Callable[[int], list[Fold]] = lambda _: [],
                 every_s: float = 0.0, monotonic_ms: Callable[[], float] = lambda: 0.0,
                 flat_brokers: Callable[[], set[str]] | None = None) -> None:
        """``every_s``: a snapshot also this long after the last (by ``monotonic_ms``),
        once ``BY_TIME_RECORDS`` records, and half as many as it holds, came.
        ``flat_brokers``: the brokers whose TimerFlatFiles this broker still reads as its
        own (objects left to preload); the pointer's ``flat_brokers`` names only those
        (without it: every broker a fold named, for good)."""
        self._tier, self._broker = tier, broker
        self._read, self._committed, self._confirm = read, committed, confirm
        self._folds = folds
        self._flat_brokers = flat_brokers
        self.every_s, self._monotonic_ms = every_s, monotonic_ms
        self._at_ms = monotonic_ms()  # when the latest snapshot was written (or start)
        self._unfoldable: set[str] = set()  # digests whose fold failed (till a restart)
        self.every = every
        self.pointer = read_pointer(tier, broker) or Pointer()
        self.snapshots = 0  # written since start

    def due(self) -> bool:
        p = self.pointer
        grown = (self._committed(DELAYED_STREAM) - p.delayed_from
                 + self._committed(TIMER_STREAM) - p.timer_from)
        by_time = (self.every_s > 0 and grown >= max(BY_TIME_RECORDS, p.records // 2)
                   and self._monotonic_ms() - self._at_ms >= self.every_s * 1000)
        return self.every > 0 and (grown >= max(self.every, p.records // 2) or by_time
                                   or bool(self._to_fold(self._committed(TIMER_STREAM))))

    def _to_fold(self, t1: int) -> list[Fold]:
        """The finished adoptions not in the snapshot yet (``folds``: those whose
        records in this broker's timer stream are below ``t1``)."""
        return [f for f in self._folds(t1)
                if f.digest not in self.pointer.folded and f.digest not in self._unfoldable]

    def step(self, force: bool = False) -> bool:
        """Write a new snapshot when due (``force``: now); True when one was written."""
        if not (force or self.due()) or not self._confirm():
            return False  # (a broker taken over writes no snapshot: its successor's now)
        old = self.pointer
        c1, t1 = self._committed(DELAYED_STREAM), self._committed(TIMER_STREAM)
        folds = self._to_fold(t1)
        if (c1, t1) == (old.delayed_from, old.timer_from) and not folds:
            return False
        state = JournalState()
        if old.residual:
            state.done, state.moved = read_residual(self._tier, old.residual)
        for e in self._entries(TIMER_STREAM, old.timer_from, t1):
            m = decode_record(e.record)
            state.apply(m.tag, m.body)
        folded = [*old.folded, *(f.digest for f in folds)]
        prefix = f"{self._broker}/timer-snapshot/{c1}-{t1}-{len(folded)}/"
        self._clear(prefix, old)  # what a crash left of this very snapshot
        writer = _PartWriter(self._tier, prefix)
        # the adopted offsets the journal names whose records are not in the parts (an
        # adoption not folded yet): kept in the residual; those of records are applied
        unmatched = {o for o in (*state.done, *state.moved) if is_adopted(o)}
        for r in self._pending(old, state, c1, folds, unmatched):
            writer.add(r)
        writer.flush()
        crashpoint("timer_snapshot.after_parts")
        residual = prefix + "residual"
        def keep(o: int) -> bool:
            return o in unmatched if is_adopted(o) else o >= c1
        self._tier.write(residual, encode_residual(
            {o for o in state.done if keep(o)},
            {o: d for o, d in state.moved.items() if keep(o)}))
        # every broker whose adopted offsets the parts may hold (their origin codes are
        # checked against a new adoption's), and of those the ones a takeover of this
        # broker lists for TimerFlatFiles to adopt in place: not those whose objects are
        # all preloaded (or that never had any), else a chain of takeovers lists every
        # broker it ever passed, one request each
        named = {*old.folded_brokers, *(b for f in folds for b in f.brokers)}
        flat = {*old.flat(), *(b for f in folds for b in f.brokers)}
        if self._flat_brokers is not None:
            flat &= self._flat_brokers()
        new = Pointer(c1, t1, writer.paths, residual, writer.records, folded, sorted(named),
                      sorted(flat))
        self._tier.write(f"{self._broker}/{POINTER}", new.encode())
        self.pointer = new
        self.snapshots += 1
        self._at_ms = self._monotonic_ms()
        crashpoint("timer_snapshot.after_pointer")
        log.info("timer snapshot at delayed record %d, timer record %d: %d pending in %d "
                 "parts%s", c1, t1, writer.records, len(writer.paths),
                 f" ({len(folds)} adoption(s) folded in)" if folds else "")
        self._drop_older(prefix)
        return True

    def _pending(self, old: Pointer, state: JournalState, c1: int, folds: list[Fold],
                 unmatched: set[int]) -> Iterator[PendingRecord]:
        """The old snapshot's records, the delayed stream's to ``c1``, then the folded
        adoptions', less what ``state`` says is done, due as it moved them; the adopted
        offsets met are taken out of ``unmatched``."""
        def live(records: Iterable[PendingRecord]) -> Iterator[PendingRecord]:
            for r in records:
                unmatched.discard(r.queue_offset)
                due = state.pending_due(r.queue_offset, FLAG_DELAYED, r.due_ms)
                if due is not None:
                    yield r._replace(due_ms=due)
        for path in old.parts:
            yield from live(read_part(self._tier, path))
        for e in self._entries(DELAYED_STREAM, old.delayed_from, c1):
            info = decode_dispatch_infos(e.record, 0)[0][0]
            due = state.pending_due(e.queue_offset, info.flags, info.deliver_at_ms)
            if due is not None:
                yield PendingRecord(e.queue_offset, due, e.record)
        for f in folds:
            try:
                for chunk in f.rows():
                    yield from live(chunk)
            except (TierError, ChronomqError) as exc:  # its takeover reads it, as before
                self._unfoldable.add(f.digest)
                raise TierError(f"cannot fold the adoption {f.digest} (brokers "
                                f"{', '.join(f.brokers)}) into a timer snapshot: {exc}; "
                                "left out of the next ones") from exc

    def _entries(self, stream: str, start: int, end: int) -> Iterator[TieredEntry]:
        offset = start
        while offset < end:
            entries = self._read(stream, offset, min(READ_BATCH, end - offset))
            if not entries:
                raise TierError(f"{stream} of {self._broker} is unreadable at {offset} "
                                f"(below its committed end {end}): no timer snapshot now")
            yield from (e for e in entries if e.queue_offset < end)
            offset = entries[-1].queue_offset + 1

    def _clear(self, prefix: str, current: Pointer) -> None:
        """Delete what a crash left under ``prefix``, the new snapshot's: never an object
        the ``current`` pointer names (a new prefix differs from its own by construction:
        the stream ends or the count of folds moved)."""
        named = _named(current)
        if any(p.startswith(prefix) for p in named):
            raise ChronomqError(f"timer snapshot prefix {prefix} is the current one's")
        for path in self._tier.list(prefix):
            self._tier.delete(path)

    def _drop_older(self, keep: str) -> None:
        """Delete every earlier snapshot's objects (after the lease is confirmed), never
        one the pointer names."""
        named = _named(self.pointer)
        doomed = [p for p in self._tier.list(f"{self._broker}/timer-snapshot/")
                  if not p.startswith(keep) and p not in named]
        if not doomed or not self._confirm():
            return
        crashpoint("timer_snapshot.before_delete")
        for path in doomed:
            try:
                self._tier.delete(path)
            except TierError as exc:  # an orphan: costs space, never correctness
                log.warning("could not delete %s: %s", path, exc)
