"""ReviveSchedule: the deadlines of open leases, waiting for their time.

A Pop adds its lease's deadline, ChangeInvisibleTime adds the moved one, and a lease
that is done (acked, released, revived) takes its deadlines out again, so the schedule
holds the deadlines of open leases only (a 12-hour invisible time acked at once leaves
nothing behind).  A deadline that ChangeInvisibleTime moved stays until its old time:
it fires and the reviver finds nothing to do there.

Deadlines wait on a timing wheel (``timer.wheel``, 10 ms ticks); one already due when
added waits in a ready list and comes first.  ``take_due`` hands out at most a batch at
a time; ``wait_due`` is the revive thread's sleep (``pop.requeue``), woken by new
deadlines and by ``close``.  Time comes from the injected clock.

Thread-safe: one condition guards the wheel, the ready list and the closed flag.
"""

from __future__ import annotations

import threading

from pop.model import REVIVE_TICK_MS, Deadline
from store.clock import Clock
from timer.wheel import TimingWheel

_IDLE_WAIT_MS = 500  # the longest sleep of ``wait_due`` (it re-reads the clock after)


class ReviveSchedule:
    """Lease deadlines by due time.  Thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._wheel: TimingWheel[Deadline] = TimingWheel(REVIVE_TICK_MS, 64, 4,
                                                         clock.now_ms())
        self._ready: list[Deadline] = []  # already due when added
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._wheel) + len(self._ready)

    def add(self, deadlines: list[Deadline], at_ms: int | None = None) -> None:
        """Fire each deadline at its time (or at ``at_ms``: a revive that failed)."""
        if not deadlines:
            return
        with self._cond:
            for d in deadlines:
                if not self._wheel.add(d, at_ms or d[4]):
                    self._ready.append(d)
            self._cond.notify()

    def remove(self, deadlines: list[Deadline]) -> None:
        """Their lease is done: they need not fire (absent ones are ignored)."""
        if not deadlines:
            return
        with self._cond:
            for d in deadlines:
                self._wheel.remove(d)

    def take_due(self, now_ms: int, limit: int) -> list[Deadline]:
        """Up to ``limit`` deadlines due by ``now_ms``, ready ones first; they leave the
        schedule."""
        with self._cond:
            fired = self._ready[:limit]
            del self._ready[:limit]
            fired += [d for d, _ in self._wheel.advance(now_ms, limit - len(fired))]
        return fired

    def wait_due(self) -> bool:
        """Sleep until a deadline may be due (True) or the schedule is closed (False)."""
        with self._cond:
            while not self._closed:
                if self._ready:
                    return True
                nxt = self._wheel.next_expiry_ms()
                wait_ms = _IDLE_WAIT_MS if nxt is None else \
                    min(_IDLE_WAIT_MS, nxt - self._clock.now_ms())
                if wait_ms <= 0:
                    return True
                self._cond.wait(wait_ms / 1000)
            return False

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (after a failed revive), or until closed."""
        with self._cond:
            if not self._closed:
                self._cond.wait(seconds)

    def open(self) -> None:
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """Wake every sleeper; ``wait_due`` returns False until ``open``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
