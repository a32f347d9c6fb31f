"""ScheduleEngine: sends each schedule's ticks when they come due.

At each step (the ``schedules`` thread wakes ``AHEAD_MS`` before the earliest tick;
tests call ``fire_due`` with a manual clock) every schedule whose next tick is due within
``AHEAD_MS`` has its ticks sent as messages through the broker's normal write path
(``send``), all schedules' in one batch: id ``<name>@<tick ms>`` (with the schedule's
generation if its name was created again: ``recurring.model.tick_id``), due at the tick
plus the schedule's jitter offset (``recurring.model.jitter_offset_ms``: 0 without
``jitter_ms``, the same for a tick sent again), so the timer delivers each then, never
before (an update, pause or delete takes
effect from the first tick not yet handed to a send: ``ScheduleBook.sending``).  Only
once they are durable does the book move past them (one synced write).  A crash in
between sends the same ticks again at the next start, and the broker's dedupe window of
client-chosen ids (``store.dedupe_window_ms``) stores each id once: one message per tick,
never two, never none.

Ticks more than ``MISFIRE_GRACE_MS`` old when their step comes (the broker was down, or
stopped) follow the schedule's misfire policy, applied once to all of them, the whole
outage since the tick the book last recorded, however long: ``skip`` sends none of
them, ``once`` the latest, ``all`` the latest ``misfire_bound``, oldest first.  The
step that meets them decides and sends them with the ticks within the grace (sent as
they are, a little late), and the book moves past all of them; the ticks it skips are
never walked one by one (``latest_ticks`` looks back from the grace), so a step sends
at most ``misfire_bound`` ticks and the grace's of a schedule (62 at ``every_s = 1``).
A crash before the book moves is a longer outage: the step is taken again with a later
clock, its kept ticks are the same or later ones (those sent already are stored once),
never older ones.

``trigger`` sends one tick by hand now (id ``<name>!<now ms>``: ``trigger_id``), through
the same send, and counts and remembers it once it is stored.  Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from apscheduler.triggers.base import BaseTrigger

from recurring.book import Planned, ScheduleBook, ScheduleState
from recurring.model import jitter_offset_ms, next_fire, trigger_id
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import FailedPrecondition
from store.message import Draft, encode_properties

log = logging.getLogger(__name__)

MISFIRE_GRACE_MS = 60_000
AHEAD_MS = 1_000  # a tick is sent this much before it, due at it (the timer delivers it
#                   on time, never early): lateness is the timer's, not the send's

# drafts -> one error text per draft ("" = stored, or a duplicate of a tick sent before)
Send = Callable[[list[Draft]], list[str]]


def ticks_due(state: ScheduleState, now_ms: int) -> tuple[list[int], int | None]:
    """The ticks of ``state`` to send at ``now_ms``, those up to ``AHEAD_MS`` ahead
    included, the misfire policy applied to all it missed; and the next tick after them."""
    trigger = state.trigger()
    ticks: list[int] = []
    nxt = state.next_ms
    missed_before_ms = now_ms - MISFIRE_GRACE_MS  # ticks before it are misfires
    if nxt is not None and nxt < missed_before_ms:
        spec = state.spec
        keep = {"skip": 0, "once": 1, "all": spec.misfire_bound}[spec.misfire]
        ticks = latest_ticks(trigger, nxt, missed_before_ms, keep)
        nxt = next_fire(trigger, ticks[-1] if ticks else missed_before_ms - 1)
    while nxt is not None and nxt <= now_ms + AHEAD_MS:
        ticks.append(nxt)
        nxt = next_fire(trigger, nxt)
    return ticks, nxt


def latest_ticks(trigger: BaseTrigger, first_ms: int, before_ms: int, count: int
                 ) -> list[int]:
    """The last ``count`` ticks from ``first_ms`` (a tick) to before ``before_ms``, oldest
    first.  Found looking back from ``before_ms`` in windows that double, the first one
    ``count`` periods wide: about ``count`` ticks walked, not the outage's."""
    if count == 0:
        return []
    after = next_fire(trigger, first_ms)
    span_ms = count * max((after or before_ms) - first_ms, 1)
    found: list[int] = []
    end_ms = before_ms
    while len(found) < count and end_ms > first_ms:
        start_ms = max(end_ms - span_ms, first_ms)
        found = _ticks_between(trigger, start_ms, end_ms, first_ms) + found
        end_ms, span_ms = start_ms, span_ms * 2
    return found[-count:]


def _ticks_between(trigger: BaseTrigger, start_ms: int, end_ms: int, first_ms: int
                   ) -> list[int]:
    """The ticks in ``[start_ms, end_ms)``, none before ``first_ms`` (a tick)."""
    out: list[int] = []
    tick = first_ms if start_ms <= first_ms else next_fire(trigger, start_ms - 1)
    while tick is not None and tick < end_ms:
        out.append(tick)
        tick = next_fire(trigger, tick)
    return out


class ScheduleEngine:
    """See the module docstring."""

    def __init__(self, book: ScheduleBook, send: Send, clock: Clock) -> None:
        self.book = book
        self._send = send
        self._clock = clock
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.last_step_s = 0.0  # how long the last step that sent something took

    def fire_due(self, now_ms: int | None = None) -> int:
        """Send every tick due by ``now_ms``; returns how many were sent."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        began = time.monotonic()
        plan: list[Planned] = []
        for state in self.book.states(by_name=False):
            if state.paused or state.next_ms is None or state.next_ms > now + AHEAD_MS:
                continue
            ticks, nxt = ticks_due(state, now)
            plan.append((state, ticks, nxt))
        plan = self.book.sending(plan) if plan else plan
        if not plan:
            return 0
        drafts: list[Draft] = []
        owners: list[tuple[int, int]] = []  # (plan entry, tick) of each draft
        for n, (state, ticks, _) in enumerate(plan):
            s = state.spec
            props = encode_properties(s.properties)
            for tick in ticks:
                due = tick + jitter_offset_ms(s.name, state.generation, tick, s.jitter_ms)
                drafts.append(Draft(state.message_id(tick), s.topic, s.key, s.tag, s.body,
                                    props, now, due))
                owners.append((n, tick))
        errors = self._send(drafts) if drafts else []
        crashpoint("schedule.after_send")
        failed: dict[int, str] = {}
        sent: list[list[tuple[int, str]]] = [[] for _ in plan]  # per plan entry
        for (n, tick), draft, error in zip(owners, drafts, errors, strict=True):
            if error:
                failed.setdefault(n, error)
            else:
                sent[n].append((tick, draft.message_id))
        self.book.advance([(state, nxt, len(ticks) - (1 if n in failed else 0),
                            failed.get(n, ""), sent[n])
                           for n, (state, ticks, nxt) in enumerate(plan)])
        for n, error in failed.items():
            log.warning("schedule %s: a tick could not be sent: %s", plan[n][0].spec.name,
                        error)
        self.sent += len(drafts) - len(failed)
        self.last_step_s = time.monotonic() - began
        return len(drafts) - len(failed)

    def trigger(self, name: str, now_ms: int | None = None) -> tuple[str, int]:
        """Send one tick of ``name`` now, whatever its rule (paused too); its
        ``(message id, tick ms)`` once stored.  A tick the broker refuses raises
        ``FailedPrecondition`` with the reason; a broker-wide failure raises as a Send's."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        state = self.book.get(name)
        s = state.spec
        mid = trigger_id(s.name, state.generation, now)
        draft = Draft(mid, s.topic, s.key, s.tag, s.body, encode_properties(s.properties),
                      now, now)
        error = self._send([draft])[0]
        if error:
            raise FailedPrecondition(f"schedule {name!r}: the tick was not stored: {error}")
        self.book.triggered(s.name, state.generation, now, mid)
        self.sent += 1
        return mid, now

    # ------------------------------------------------------------------ thread

    def wake(self) -> None:
        """A schedule was created or resumed: look at the next tick again."""
        with self._wake:
            self._wake.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="schedules", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopped:
                    return
                nexts = [s.next_ms for s in self.book.states(by_name=False)
                         if not s.paused and s.next_ms is not None]
                wait_ms = (min(nexts) - AHEAD_MS - self._clock.now_ms()) if nexts \
                    else 60_000
                if wait_ms > 0:
                    self._wake.wait(min(wait_ms, 60_000) / 1000)
                    continue
            try:
                self.fire_due()
            except Exception:  # keep firing; the cause is logged
                log.exception("sending schedule ticks failed; retrying in 1 s")
                with self._wake:
                    self._wake.wait(1.0)
