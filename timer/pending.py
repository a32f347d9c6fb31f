"""PendingMessages: the pending delayed messages of one id, found, cancelled and moved.

``Cancel``/``Reschedule`` reach every pending message with an id (a client-chosen id sent
to several topics, the retry copies of one message nacked by several groups), or those of
one topic, wherever they are (RocksDB, wheel, parked, a TimerFlatFile), and say how many
they changed.  Parked ones are first moved into RocksDB (``ParkingLot.unpark``); one the
timer has fired and whose copy the dispatcher has not reached yet (``delivering``) is not
changed: the caller is told it is delivered.  The lookups (``holds``, ``first_due``)
serve a client-chosen id's pending message, which is in no index until delivered
(``store.lookup``); its record is read by ``timer.lookup``.

Cancels and reschedules are journaled by delayed-stream queue offset
(``stream_offsets``, as ``TimerService`` journals its deliveries), and with durable-ack
the call returns once the journal's record is in the tier.

Composed by ``TimerService``, which owns the wheel, the entries due now, the set of
delivering entries and the load cursor (``timer.loader``); it hands them in and this
class changes them only under its lock (``lock``, the TimerService's), taken after
``ParkingLot.flat_lock`` as there.  ``holds`` and ``first_due`` take no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from store.errors import Unavailable
from store.journal import StateJournal
from store.message import FLAG_DELAYED, decode_dispatch_infos
from store.store import MessageStore
from tiered.timerflatfile import is_adopted
from timer.model import TimerChange, TimerOutcome
from timer.parking import ParkingLot
from timer.store import TimerStore, parse_timer_key, timer_key
from timer.wheel import TimingWheel


def stream_offsets(journal: StateJournal, keys: list[bytes],
                   records: Sequence[bytes | None]) -> list[int]:
    """The delayed-stream queue offsets of these pending records (those in it)."""
    out = []
    for key, raw in zip(keys, records, strict=True):
        offset = parse_timer_key(key)[1]
        # an adopted message is named by its adopted offset (``cluster.adoption``)
        qo = offset if is_adopted(offset) else \
            journal.stream_offset(raw, offset) if raw else None
        if qo is not None:
            out.append(qo)
    return out


class PendingMessages:
    def __init__(self, store: MessageStore, timers: TimerStore, lot: ParkingLot,
                 lock: threading.Lock, wheel: TimingWheel[bytes],
                 due_now: list[tuple[bytes, int]], delivering: set[bytes],
                 stored: Callable[[bytes, int], bool], wake: threading.Event) -> None:
        self._store = store
        self._timers = timers
        self._lot = lot
        self._lock = lock  # the TimerService's: guards the wheel, due_now and delivering
        self._wheel = wheel
        self._due_now = due_now  # loaded entries already due
        self._delivering = delivering  # fired, their copy not yet reached by the dispatcher
        self._stored = stored  # a new entry to the wheel or the loader (``timer.loader``)
        self._wake = wake  # wakes the timer thread
        self.journal: StateJournal | None = None  # TimerService.set_journal
        self.cancelled = 0  # under the lock
        self.rescheduled = 0

    def _find_pending(self, message_id: str, topic: str, keep: int = -1
                      ) -> tuple[list[tuple[bytes, bytes]], bool]:
        """``(timer key, record)`` of every pending message with this id (of ``topic``,
        if given), and whether one is being delivered right now (then not listed).  Parked
        ones are first moved into RocksDB (all of this id: a parked record's topic is
        known only once it is read).  The caller holds ``flat_lock`` and the lock."""
        self._lot.unpark(message_id)
        keys = [timer_key(*loc) for loc in self._timers.locate(message_id) if loc[1] != keep]
        found: list[tuple[bytes, bytes]] = []
        delivering = False
        for key, record in zip(keys, self._timers.records(keys), strict=True):
            if record is None or (topic and decode_dispatch_infos(record, 0)[0][0].topic
                                  != topic):
                continue
            if key in self._delivering:
                delivering = True
            else:
                found.append((key, record))
        if found and self._store.holds.active():  # a topic a takeover still adopts
            for _, record in found:  # answers no Cancel or Reschedule (``store.holds``)
                self._store.holds.check(decode_dispatch_infos(record, 0)[0][0].topic)
        return found, delivering

    def _none_reached(self, message_id: str, topic: str, delivering: bool,
                      again: bool) -> TimerChange | None:
        """The answer when nothing pending was found; None: look again (``again``): a
        message sent just before may not have been handed to the timer when it looked,
        and the store's lookup (``_not_pending``) waits for the dispatcher that hands it."""
        if delivering:
            return TimerChange(TimerOutcome.ALREADY_DELIVERED, 0)
        outcome = self._not_pending(message_id, topic)
        if outcome is TimerOutcome.NOT_FOUND and again:
            return None
        if outcome is TimerOutcome.NOT_FOUND and self._store.holds.active():
            # a takeover is adopting pending messages: this one may be among them
            if topic:
                self._store.holds.check(topic)
            else:
                raise Unavailable("a takeover is adopting another broker's pending messages "
                                  f"here: {message_id!r} may be one of them; retry in a "
                                  "moment")
        return TimerChange(outcome, 0)

    def _not_pending(self, message_id: str, topic: str = "") -> TimerOutcome:
        for m in self._store.query_by_message_id(message_id):
            if not m.flags & FLAG_DELAYED and (not topic or m.topic == topic):
                return TimerOutcome.ALREADY_DELIVERED  # delivered copy, or sent as due
        return TimerOutcome.NOT_FOUND

    def topics(self, message_id: str) -> list[tuple[str, bool]]:
        """``(topic, delivering)`` of each message with this id pending here, or fired
        and on its way into its topic (parked ones first moved into RocksDB), by offset."""
        with self._lot.flat_lock, self._lock:
            self._lot.unpark(message_id)
            keys = [timer_key(*loc) for loc in self._timers.locate(message_id)]
            return [(decode_dispatch_infos(record, 0)[0][0].topic, key in self._delivering)
                    for key, record in zip(keys, self._timers.records(keys), strict=True)
                    if record is not None]

    def cancel(self, message_id: str, topic: str = "", keep: int = -1) -> TimerChange:
        """Cancel every pending message with this id (only those of ``topic``, if given;
        not the one stored at CommitLog offset ``keep``: a debounce's new message)."""
        return self._cancel(message_id, topic, keep, again=True)

    def _cancel(self, message_id: str, topic: str, keep: int, again: bool) -> TimerChange:
        with self._lot.flat_lock, self._lock:
            found, delivering = self._find_pending(message_id, topic, keep)
            if found:
                self._timers.remove([(key, message_id) for key, _ in found], sync=True)
                for key, _ in found:
                    self._wheel.remove(key)
                self.cancelled += len(found)
                journaled = self.journal.timer_done(stream_offsets(
                    self.journal, [k for k, _ in found], [r for _, r in found])
                ) if self.journal else None
        if not found:  # asked without the lock: the store's lookup waits for the dispatcher
            change = self._none_reached(message_id, topic, delivering, again)
            return change or self._cancel(message_id, topic, keep, again=False)
        if self.journal is not None:  # with durable-ack in the tier; then fencing
            self.journal.settle(journaled if self.journal.durable_ack else None)
            self.journal.check()
        return TimerChange(TimerOutcome.CANCELLED, len(found))

    def reschedule(self, message_id: str, deliver_at_ms: int, topic: str = "") -> TimerChange:
        """Move every pending message with this id (only those of ``topic``, if given) to
        ``deliver_at_ms``; the caller has checked the delay (``TimerService.check_delay``)."""
        return self._reschedule(message_id, deliver_at_ms, topic, again=True)

    def _reschedule(self, message_id: str, deliver_at_ms: int, topic: str,
                    again: bool) -> TimerChange:
        with self._lot.flat_lock, self._lock:
            found, delivering = self._find_pending(message_id, topic)
            if found:
                new_keys = self._timers.move(message_id, found, deliver_at_ms)
                for (old_key, _), new_key in zip(found, new_keys, strict=True):
                    self._wheel.remove(old_key)
                    self._stored(new_key, deliver_at_ms)
                self.rescheduled += len(found)
                journaled = self.journal.timer_moved([(qo, deliver_at_ms) for qo in (
                    stream_offsets(self.journal, [k for k, _ in found], [r for _, r in found]))]
                ) if self.journal else None
        if not found:  # asked without the lock: the store's lookup waits for the dispatcher
            change = self._none_reached(message_id, topic, delivering, again)
            return change or self._reschedule(message_id, deliver_at_ms, topic, again=False)
        self._wake.set()
        if self.journal is not None:  # with durable-ack in the tier; then fencing
            self.journal.settle(journaled if self.journal.durable_ack else None)
            self.journal.check()
        return TimerChange(TimerOutcome.RESCHEDULED, len(found))

    def holds(self, message_id: str, commit_offset: int) -> bool:
        """Whether the delayed record at ``commit_offset`` is pending here with this id
        (in RocksDB or parked): the proof the store asks for before a delayed record found
        by its id is served (``store.lookup``).  Two short prefix scans; no lock."""
        return any(off == commit_offset for _, off in self._timers.locate(message_id)) or \
            any(off == commit_offset for (_, off), _ in self._timers.locate_parked(message_id))

    def unpark(self, message_id: str) -> None:
        """Move the parked messages with this id out of their TimerFlatFiles into RocksDB
        (``ParkingLot.unpark``, as a Cancel does)."""
        with self._lot.flat_lock, self._lock:
            self._lot.unpark(message_id)

    def first_due(self, message_id: str) -> int | None:
        """When the first pending message with this id is due (in RocksDB, the wheel, or
        parked for a TimerFlatFile), or None if none is pending.  Two short scans; no
        lock."""
        locs = self._timers.locate(message_id)
        locs += [loc for loc, _ in self._timers.locate_parked(message_id)]
        due = [loc[0] for loc in locs if timer_key(*loc) not in self._delivering]
        return min(due) if due else None
