"""TimerService: delayed delivery on top of the CommitLog.

Flow (docs/DESIGN.md, "Data flow: one write path"):

1. A Send due in the future is appended to the CommitLog like any message, flagged
   ``FLAG_DELAYED`` (the ConsumeQueue dispatcher skips it).
2. This service is a dispatch handler: it copies each delayed record into the TimerStore
   (RocksDB, keyed by due time) together with its dispatch position, atomically; one due
   beyond ``rocks_horizon_ms`` is parked for its hour's TimerFlatFile instead
   (``timer.parking``), in the same write.
3. ``load_due`` moves entries due within ``wheel_window_ms`` from RocksDB into the
   in-memory timing wheel, so memory holds only the near future (``timer.loader``).
4. ``deliver_due`` fires the wheel: the due messages are appended to the CommitLog again,
   under their own topic, id and due time (``FLAG_TIMER_DELIVERY``), in batches (a
   slice's batches queued together, then awaited in order).  The delivered copy deletes
   its timer entries when the dispatcher reaches it, in the same write as the position,
   so a crash in between never delivers a message twice: by the key registered for it
   before the append (``timer.delivery``), or, for a copy replayed after a restart, found by
   its id.  From firing until then the entry is ``_delivering``: never loaded again, and
   a Cancel or Reschedule is told it is delivered (one RocksDB write a message, not two:
   the timer thread deletes nothing itself).

``Cancel``/``Reschedule`` and the lookups of pending messages by id are
``timer.pending`` (``PendingMessages``), composed here: it shares this service's lock,
wheel and set of delivering entries.

A takeover schedules the departed broker's pending messages with ``ParkingLot.adopt``
instead of appending them (``cluster.adoption``): they are not in this broker's
CommitLog, and their entries carry an adopted offset (bit 63 set,
``tiered.timerflatfile``) where others carry a CommitLog offset.  They are delivered,
cancelled and moved as any other; the journal names them by that offset.

One named thread (``timer``) drives loading and delivery; tests drive ``load_due`` and
``deliver_due`` with a manual clock instead.  Thread-safe.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from collections.abc import Container
from concurrent.futures import Future
from typing import NamedTuple

from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import ChronomqError, InvalidArgument
from store.journal import StateJournal
from store.message import (
    FLAG_DELAYED,
    FLAG_TIMER_DELIVERY,
    DispatchInfo,
    Draft,
    Message,
    draft_of_record,
)
from store.store import MessageStore
from tiered.timerflatfile import TimerFlatFiles
from timer.delivery import NAME_OF_DRAFT, CopyRegistry
from timer.loader import WheelLoader
from timer.lookup import PendingLookup
from timer.model import (
    LATENESS_BOUNDS_MS,
    TimerChange,
    TimerConfig,
    TimerStats,
)
from timer.parking import ParkingLot
from timer.pending import PendingMessages, stream_offsets
from timer.pins import Pins
from timer.schedule import Schedule, due_schedule
from timer.store import TimerStore, parse_timer_key, timer_key
from timer.wheel import TimingWheel

log = logging.getLogger(__name__)


class _Appending(NamedTuple):
    """One delivery batch on its way into the CommitLog (``TimerService._submit``)."""

    future: Future[list[DispatchInfo]] | None  # None: refused before it was queued
    sent: list[tuple[str, str, int]]  # (id, topic, due) of each copy
    done: list[tuple[bytes, str]]  # (timer key, id) of each copy
    marked: bool  # the journal's record of the deliveries is the batch's last draft


class TimerService:
    """Delayed delivery.  Thread-safe."""

    name = "timer"

    def __init__(self, store: MessageStore, timers: TimerStore, flat: TimerFlatFiles,
                 config: TimerConfig, clock: Clock) -> None:
        self._store = store
        self._timers = timers
        self._flat = flat
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._wheel: TimingWheel[bytes] = TimingWheel(tick_ms=1, slots=64, levels=4,
                                                      start_ms=clock.now_ms())
        # fired and not yet reaped: from the wheel until the dispatcher deletes the entry
        # of its copy (``dispatch``), or until it goes back (a failed append) or is dropped
        self._delivering: set[bytes] = set()
        # the entry each copy on its way into the log stands for (``timer.delivery``)
        self._copies = CopyRegistry(timers)
        self._due_now: list[tuple[bytes, int]] = []  # loaded entries already due
        self._position = self._pending_position = 0  # read by ``open``
        self._wake = threading.Event()
        # which entries are in the wheel: its load cursor (``timer.loader``)
        self._loader = WheelLoader(timers, config, self._lock, self._wheel, self._due_now,
                                   self._delivering, self._wake)
        self._lot = ParkingLot(timers, flat, config, clock, self._lock, self._loader.admit)
        # ids a debounce's replace is deciding about, their due entries held back
        self._pins = Pins(self._lock, self._due_now, self._delivering, self._wake)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._delivered = 0
        self._last_delivery_ms = 0
        self._lateness = [0] * (len(LATENESS_BOUNDS_MS) + 1)
        self._schedule_lock = threading.Lock()
        self._schedule: tuple[float, Schedule] | None = None  # (made at, monotonic ms)
        self._journal: StateJournal | None = None  # set_journal
        # Cancel, Reschedule and the lookups by id, under this lock
        self._pending = PendingMessages(store, timers, self._lot, self._lock, self._wheel,
                                        self._due_now, self._delivering,
                                        self._loader.stored, self._wake)
        self._lookup = PendingLookup(timers, self._lot, flat, self._lock)  # reads by id

    def open(self) -> None:
        """Read what the timer store and the tier hold: the dispatch position, the parked
        messages not yet written to a TimerFlatFile, the table of TimerFlatFile objects.
        Before the store opens (it rewinds this reader from the position)."""
        self._flat.recover(self._timers.adopted_prefixes())
        self._position = self._pending_position = self._timers.position()
        self._lot.open()

    # ------------------------------------------------------------------ rules

    def check_delay(self, deliver_at_ms: int, now_ms: int) -> None:
        """Raise ``InvalidArgument`` for a due time beyond the maximum delay."""
        if deliver_at_ms - now_ms > self.config.max_delay_ms:
            raise InvalidArgument(
                f"delivery time is {deliver_at_ms - now_ms} ms ahead, beyond the maximum "
                f"delay of {self.config.max_delay_ms} ms (setting timer.max_delay_ms)")

    # ------------------------------------------------------------------ DispatchHandler

    def position(self) -> int:
        return self._position

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        delayed = [r for r in records if r.flags & FLAG_DELAYED]
        delivered = [r for r in records if r.flags & FLAG_TIMER_DELIVERY]
        done: list[bytes] = []
        reaped: list[bytes] = []
        if delivered:  # their entries go in the same write as the position
            with self._lock:
                done, reaped, replayed = self._copies.take(delivered)
            if replayed:
                done += self._copies.replayed_keys(replayed)
        entries: list[tuple[str, int, int, bytes]] = []
        parked: list[tuple[int, tuple[str, int, int, bytes]]] = []
        span, first = b"", 0
        if delayed:
            first = delayed[0].commit_offset
            last = delayed[-1]
            span = self._store.commitlog.read(first, last.commit_offset + last.record_size - first)
        horizon = self._clock.now_ms() + self.config.rocks_horizon_ms
        # one lock from routing to the mirror of parked records: an unpark (Cancel,
        # Reschedule) sees a parked record in RocksDB and in the mirror, or in neither
        with self._lock:
            for r in delayed:
                at = r.commit_offset - first
                entry = (r.message_id, r.deliver_at_ms, r.commit_offset,
                         span[at : at + r.record_size])
                bucket = self._lot.parks(r.deliver_at_ms, horizon)
                if bucket is not None:
                    parked.append((bucket, entry))
                else:
                    entries.append(entry)
            self._pending_position = end_offset
            if entries or parked or done or end_offset - self._position > (1 << 20):
                self._timers.add(entries, end_offset, parked, deletes=done)
                self._position = end_offset
                crashpoint("timer.after_add")
            if reaped:  # gone from RocksDB: delivered
                self._delivering.difference_update(reaped)
                crashpoint("timer.after_deliver_remove")
            if parked:
                self._lot.mirror(parked)
        if entries:
            self._loader.admit([(timer_key(due, off), due) for _, due, off, _ in entries])

    def write_parked(self, force: bool = False) -> int:
        """Write parked far-future records to their TimerFlatFiles (``ParkingLot.write``);
        returns how many."""
        return self._lot.write(force)

    def flush(self) -> None:
        position = self._pending_position
        if position != self._position:
            self._timers.add([], position)
            self._position = position

    def rewind(self, offset: int) -> None:
        """Move the dispatch position back to ``offset`` (recovery after a torn tail)."""
        if self._position > offset:
            self._timers.add([], offset, sync=True)
            self._position = self._pending_position = offset

    # ------------------------------------------------------------------ preload

    def preload_due(self, now_ms: int) -> int:
        """Move every TimerFlatFile bucket that starts within ``preload_ahead_ms`` into the
        timer store (``ParkingLot.preload``); returns the entries moved."""
        return self._lot.preload(now_ms)

    @property
    def parking(self) -> ParkingLot:
        """The parking lot: a takeover schedules adopted messages through it."""
        return self._lot

    # ------------------------------------------------------------------ loading

    def load_due(self, now_ms: int) -> bool:
        """``WheelLoader.load_due``: entries due within the wheel's window into it."""
        return self._loader.load_due(now_ms)

    # ------------------------------------------------------------------ delivery

    def deliver_due(self, now_ms: int) -> int:
        """Append every message due by ``now_ms`` to its topic; return how many."""
        total = 0
        limit = self.config.delivery_batch * 4  # a hot instant goes out in slices
        with self._lock:
            fired = self._due_now[:limit]
            del self._due_now[:limit]
            if len(fired) < limit:
                fired += self._wheel.advance(now_ms, limit - len(fired))
            # by due time, then offset; each once, and none already on its way (an entry
            # stays in RocksDB until the dispatcher reaches its copy: a key admitted again
            # meanwhile must not make a second copy)
            due_of = dict(fired)
            keys = sorted(due_of.keys() - self._delivering)
            self._delivering.update(keys)
        try:
            # every batch is queued before the first is waited for: the CommitLog writes
            # those queued together with one fsync while the next ones are prepared
            batch = self.config.delivery_batch
            queued = [self._submit(keys[i : i + batch], due_of)
                      for i in range(0, len(keys), batch)]
            for appending in queued:
                if appending is not None:
                    total += self._settle(appending)
        except BaseException:  # what is not on its way into the log is not delivering
            with self._lock:
                sent = self._copies.registered()
                self._delivering.difference_update(k for k in keys if k not in sent)
            raise
        return total

    def _submit(self, keys: list[bytes], due_of: dict[bytes, int]) -> _Appending | None:
        """Queue the copies of these due entries (``due_of``: each key's due time) for the
        CommitLog; None if none is left to deliver (cancelled, rescheduled, or their topic
        deleted)."""
        records = self._timers.records_run(keys)  # ascending: one span of the store
        drafts: list[Draft] = []
        done: list[tuple[bytes, str]] = []
        orphans: list[tuple[bytes, str]] = []
        dropped: list[bytes] = []
        topics: dict[str, bool] = {}  # topic -> it exists
        for key, raw in zip(keys, records, strict=True):
            if raw is None:
                dropped.append(key)  # removed meanwhile (a copy replayed after a restart)
                continue
            draft = draft_of_record(raw, due_of[key], FLAG_TIMER_DELIVERY)
            exists = topics.get(draft.topic)
            if exists is None:  # looked up once a batch per topic
                exists = topics[draft.topic] = self._store.topics.get(draft.topic) is not None
            if not exists:
                log.warning("dropping delayed message %s: topic %r was deleted",
                            draft.message_id, draft.topic)
                orphans.append((key, draft.message_id))
                dropped.append(key)
                continue
            drafts.append(draft)
            done.append((key, draft.message_id))
        if orphans:
            self._timers.remove(orphans)
        held: set[bytes] = set()
        with self._lock:
            if dropped:
                self._delivering.difference_update(dropped)
            if self._pins:  # before the journal's record names them delivered
                drafts, done, held = self._pins.hold(drafts, done)
        if not drafts:
            return None
        if held:
            kept = [(k, r) for k, r in zip(keys, records, strict=True) if k not in held]
            keys, records = [k for k, _ in kept], [r for _, r in kept]
        journal = self._journal  # off (no tier upload): no record of the deliveries
        marker = journal.done_draft(stream_offsets(journal, keys, records)) \
            if journal is not None and journal.enabled else None
        sent = list(map(NAME_OF_DRAFT, drafts))
        with self._lock:
            self._copies.register(sent, [key for key, _ in done])
        future: Future[list[DispatchInfo]] | None = None
        try:
            future = self._store.put_drafts(drafts + ([marker] if marker else []))
        except ChronomqError:
            log.exception("timer delivery failed; the entries stay and are retried")
            self._retry(sent, done)
        return _Appending(future, sent, done, marker is not None)

    def _settle(self, appending: _Appending) -> int:
        """Wait for one batch's copies to be durable and count them (the dispatcher
        deletes their timer entries when it reaches them: ``dispatch``)."""
        if appending.future is None:
            return 0
        try:
            stored = appending.future.result()
            if appending.marked:  # the journal's record of these deliveries, same write
                stored = stored[:-1]
            crashpoint("timer.after_deliver_append")
        except ChronomqError:
            log.exception("timer delivery failed; the entries stay and are retried")
            self._retry(appending.sent, appending.done)
            return 0
        with self._lock:
            self._delivered += len(stored)
            self._last_delivery_ms = max(self._last_delivery_ms, stored[-1].store_at_ms)
            for info in stored:
                late = info.store_at_ms - info.deliver_at_ms
                self._lateness[bisect.bisect_left(LATENESS_BOUNDS_MS, late)] += 1
        return len(stored)

    def _retry(self, sent: list[tuple[str, str, int]], done: list[tuple[bytes, str]]) -> None:
        with self._lock:
            for name, (key, _) in zip(sent, done, strict=True):
                self._copies.unregister(name, key)  # a copy found later is looked up
                self._delivering.discard(key)
                self._due_now.append((key, parse_timer_key(key)[0]))  # the next round

    # ------------------------------------------------------------------ by id

    def pinned(self, message_id: str) -> contextlib.AbstractContextManager[None]:
        """``Pins.pinned``: while inside, no entry with this id starts its delivery (what
        a debounce's replace decides under, ``chronomq.debounce``)."""
        return self._pins.pinned(message_id)

    def pending_topics(self, message_id: str) -> list[tuple[str, bool]]:
        """``PendingMessages.topics``."""
        return self._pending.topics(message_id)

    def set_journal(self, journal: StateJournal) -> None:
        """Journal deliveries, cancels and reschedules (``store.journal``)."""
        self._journal = journal
        self._pending.journal = journal

    def cancel(self, message_id: str, topic: str = "", keep: int = -1) -> TimerChange:
        """``PendingMessages.cancel``."""
        return self._pending.cancel(message_id, topic, keep)

    def reschedule(self, message_id: str, deliver_at_ms: int, topic: str = "") -> TimerChange:
        """``PendingMessages.reschedule``, once the delay is checked (``check_delay``)."""
        self.check_delay(deliver_at_ms, self._clock.now_ms())
        return self._pending.reschedule(message_id, deliver_at_ms, topic)

    def holds(self, message_id: str, commit_offset: int) -> bool:
        """``PendingMessages.holds``: the delayed record at ``commit_offset`` is pending
        here with this id (``store.lookup``).  No lock."""
        return self._pending.holds(message_id, commit_offset)

    def pending_messages(self, message_id: str, unpark: bool = False,
                         known: Container[int] = ()) -> list[Message]:
        """The messages pending with this id, read where they wait
        (``PendingLookup.messages``, none at an offset in ``known``); ``unpark``: first
        moved into RocksDB (``PendingMessages.unpark``)."""
        if unpark:
            self._pending.unpark(message_id)
        return self._lookup.messages(message_id, known)

    def pending_due(self, message_id: str) -> int | None:
        """``PendingMessages.first_due``.  No lock."""
        return self._pending.first_due(message_id)

    def schedule(self, max_age_ms: int = 5_000) -> Schedule:
        """What is due when (``timer.schedule``), at most ``max_age_ms`` old."""
        with self._schedule_lock:
            if self._schedule is None or \
                    self._clock.monotonic_ms() - self._schedule[0] >= max_age_ms:
                self._schedule = (self._clock.monotonic_ms(),
                                  due_schedule(self._timers, self._clock.now_ms()))
            return self._schedule[1]

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="timer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        next_load = 0.0
        while not self._stop.is_set():
            try:
                self._wake.clear()  # anything admitted from here on wakes the wait below
                now = self._clock.now_ms()
                if now >= next_load:
                    # a backlog (restart, hot second) loads in slices between deliveries
                    complete = self.load_due(now)
                    next_load = now + self.config.load_interval_ms if complete else now
                if self._journal is not None and not self._journal.may_change():
                    self._stop.wait(1.0)  # fenced (cluster.lease): a broker taking over
                    continue  # delivers these
                self.deliver_due(self._clock.now_ms())
                with self._lock:
                    nxt = self._wheel.next_expiry_ms()
                    pending_now = bool(self._due_now)
                wait_ms = 0.0 if pending_now else next_load - self._clock.now_ms()
                if nxt is not None:
                    wait_ms = min(wait_ms, nxt - self._clock.now_ms())
                if wait_ms > 0:
                    self._wake.wait(wait_ms / 1000)
            except Exception:
                log.exception("timer loop failed; retrying in 1 s")
                self._stop.wait(1.0)

    # ------------------------------------------------------------------ stats

    def statistics(self) -> TimerStats:
        flat = self._flat.statistics()
        with self._lock:
            nxt = self._wheel.next_expiry_ms()
            return TimerStats(
                pending_wheel=len(self._wheel) + len(self._due_now),
                pending_rocksdb=self._timers.pending_estimate(),
                next_due_ms=nxt if nxt is not None else 0,
                delivered=self._delivered, cancelled=self._pending.cancelled,
                rescheduled=self._pending.rescheduled, last_delivery_ms=self._last_delivery_ms,
                flat_buckets=flat.buckets, flat_objects=flat.objects,
                flat_damaged_objects=flat.damaged_objects,
                parked_unwritten=self._lot.unwritten,
                lateness_bounds_ms=LATENESS_BOUNDS_MS,
                lateness_counts=tuple(self._lateness),
            )
