"""ScheduleEngine: sends each schedule's ticks when they come due.

At each step (the ``schedules`` thread wakes ``AHEAD_MS`` before the earliest tick;
tests call ``fire_due`` with a manual clock) every schedule whose next tick is due within
``AHEAD_MS`` has its ticks sent as messages through the broker's normal write path
(``send``), all schedules' in one batch: id ``<name>@<tick ms>``, due at the tick, so
the timer delivers each at its tick, never before (a pause or delete takes effect from
the first tick not yet sent).  Only once they are durable does the
book move past them (one synced write).  A crash in between sends the same ticks again
at the next start, and the broker's dedupe window of client-chosen ids
(``store.dedupe_window_ms``) stores each id once: one message per tick, never two,
never none.

Ticks more than ``MISFIRE_GRACE_MS`` old when their step comes (the broker was down, or
stopped) follow the schedule's misfire policy: ``skip`` sends none of them, ``once`` the
latest, ``all`` each, up to ``misfire_bound`` (the latest ones).  Ticks within the grace
are sent as they are, a little late.  Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from recurring.book import ScheduleBook, ScheduleState
from recurring.model import next_fire
from store.clock import Clock
from store.crashpoint import crashpoint
from store.message import Draft, encode_properties

log = logging.getLogger(__name__)

MISFIRE_GRACE_MS = 60_000
AHEAD_MS = 1_000  # a tick is sent this much before it, due at it (the timer delivers it
#                   on time, never early): lateness is the timer's, not the send's
MAX_TICKS_PER_STEP = 10_000  # a schedule's ticks sent in one step (the rest: next step)

# drafts -> one error text per draft ("" = stored, or a duplicate of a tick sent before)
Send = Callable[[list[Draft]], list[str]]


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

    def ticks_due(self, state: ScheduleState, now_ms: int) -> tuple[list[int], int | None]:
        """The ticks of ``state`` to send now, those up to ``AHEAD_MS`` ahead included
        (misfire policy applied), and the next tick after them."""
        spec = state.spec
        trigger = state.trigger()
        ticks: list[int] = []
        nxt = state.next_ms
        while nxt is not None and nxt <= now_ms + AHEAD_MS and \
                len(ticks) < MAX_TICKS_PER_STEP:
            ticks.append(nxt)
            nxt = next_fire(trigger, nxt)
        missed = [t for t in ticks if t < now_ms - MISFIRE_GRACE_MS]
        if missed:
            keep = {"skip": [], "once": missed[-1:],
                    "all": missed[-spec.misfire_bound:]}[spec.misfire]
            ticks = keep + ticks[len(missed):]
        return ticks, nxt

    def fire_due(self, now_ms: int | None = None) -> int:
        """Send every tick due by ``now_ms``; returns how many were sent."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        began = time.monotonic()
        plan: list[tuple[ScheduleState, list[int], int | None]] = []
        for state in self.book.states(by_name=False):
            if state.paused or state.next_ms is None or state.next_ms > now + AHEAD_MS:
                continue
            ticks, nxt = self.ticks_due(state, now)
            plan.append((state, ticks, nxt))
        if not plan:
            return 0
        drafts: list[Draft] = []
        owners: list[int] = []
        for n, (state, ticks, _) in enumerate(plan):
            s = state.spec
            props = encode_properties(s.properties)
            for tick in ticks:
                drafts.append(Draft(s.message_id(tick), s.topic, s.key, s.tag, s.body, props,
                                    now, tick))
                owners.append(n)
        errors = self._send(drafts) if drafts else []
        crashpoint("schedule.after_send")
        failed: dict[int, str] = {}
        for n, error in zip(owners, errors, strict=True):
            if error:
                failed.setdefault(n, error)
        self.book.advance([(state.spec.name, nxt, len(ticks) - (1 if n in failed else 0),
                            failed.get(n, "")) for n, (state, ticks, nxt) in enumerate(plan)])
        for n, error in failed.items():
            log.warning("schedule %s: a tick could not be sent: %s", plan[n][0].spec.name,
                        error)
        self.sent += len(drafts) - len(failed)
        self.last_step_s = time.monotonic() - began
        return len(drafts) - len(failed)

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
