"""DurablePosition: the CommitLog offset below which the tier holds everything, and the
waits of durable-ack on it (``tier.durable_ack``: an OK only once the tier has the change).

The tiered dispatcher ``publish``-es a position after each commit, once the commit's
objects and metadata copies are in the tier (what a broker taking this one over reads).
Before the position moves, the ``gate`` runs: with durable-ack, the conditional write of
this broker's lease (``cluster.lease.BrokerLease.commit``), which fails for good once a
successor claimed the lease.  So a position moves, and an OK depending on it is given,
only for objects in the tier before the successor's claim: the successor reads after
its claim and sees them, whatever the clocks did.  A gate that finds the lease taken
over fences this position for good: every wait raises that error, and the dispatcher
writes nothing more to the tier.  A gate that cannot write now (the tier is failing)
leaves the position where it was: waits time out (``TierUnavailable``), the next
commit tries again.

Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from store.errors import FailedPrecondition
from tiered.errors import TierError, TierUnavailable


class DurablePosition:
    """See the module docstring."""

    def __init__(self, position: int, timeout_s: float) -> None:
        self._cond = threading.Condition()
        self._position = position
        self._timeout_s = timeout_s
        self.gate: Callable[[], None] | None = None  # raises: not confirmed (see above)
        self._fenced: FailedPrecondition | None = None

    @property
    def fenced(self) -> FailedPrecondition | None:
        """The error every wait raises once this broker was taken over (None: not)."""
        return self._fenced

    def fence(self, error: FailedPrecondition) -> None:
        """Taken over: no position moves again, every wait raises ``error``."""
        with self._cond:
            if self._fenced is None:
                self._fenced = error
            self._cond.notify_all()

    def start_at(self, position: int) -> None:
        """At open: what the tier held when this broker last stopped."""
        with self._cond:
            self._position = position

    def position(self) -> int:
        with self._cond:
            return self._position

    def wait(self, end_offset: int, timeout_s: float | None = None) -> None:
        """Return once everything below CommitLog offset ``end_offset`` is in the tier.
        Raises the fence's error once taken over, ``TierUnavailable`` after
        ``timeout_s`` (default ``tier.upload_timeout_s``)."""
        limit = time.monotonic() + (timeout_s if timeout_s is not None else self._timeout_s)
        with self._cond:
            while True:
                if self._fenced is not None:
                    raise self._fenced
                if self._position >= end_offset:
                    return
                left = limit - time.monotonic()
                if left <= 0:
                    raise TierUnavailable(
                        "the change is stored on this broker but did not reach the tier "
                        f"within {self._timeout_s:g} s (tier.durable_ack): the tier is slow "
                        "or failing")
                self._cond.wait(left)

    def confirm(self) -> bool:
        """Run the gate alone (before a step that destroys what a successor may read,
        such as tier retention's deletes): True when this broker still holds its lease
        (or there is no gate)."""
        if self._fenced is not None:
            return False
        if self.gate is None:
            return True
        try:
            self.gate()
        except FailedPrecondition as exc:
            self.fence(exc)
            return False
        except TierError:
            return False
        return True

    def publish(self, position: int) -> bool:
        """Move to ``position`` (never back) once the gate passes; False when it did not
        move now (nothing new, the gate failed, or fenced)."""
        with self._cond:
            if position <= self._position or self._fenced is not None:
                return False
        if not self.confirm():  # (the lease logged why)
            return False
        with self._cond:
            if self._fenced is not None or position <= self._position:
                return False
            self._position = position
            self._cond.notify_all()
        return True
