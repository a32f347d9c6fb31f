"""DurablePosition: the CommitLog offset below which the tier holds everything, and the
waits of durable-ack on it (``tier.durable_ack``: an OK only once the tier has the change).

The tiered dispatcher ``publish``-es a position after each commit, once the commit's
objects are in the tier.  Before the position moves, the ``gate`` runs: with
durable-ack, the conditional write of this broker's lease
(``cluster.lease.BrokerLease.commit``), which carries the metadata naming those objects
(``tiered.carried``: what a broker taking this one over reads) and fails for good once a
successor claimed the lease.  So a position moves, and an OK depending on it is given,
only for objects in the tier before the successor's claim: the successor reads after its
claim and sees them, whatever the clocks did.  A gate that finds the lease taken over
fences this position for good: every wait raises that error, and the dispatcher writes
nothing more to the tier.  A gate that cannot write now (the tier is failing) leaves the
position where it was: waits time out (``TierUnavailable``), and the gate is tried again
50 ms later.

With a gate, the gate's writes run on a thread of their own (``durable-gate``), back to
back, each for the latest position published so far: a commit never waits for the lease
write, the next commit's uploads go on meanwhile, and one lease write confirms every
commit that finished before it started (a group commit of the lease).

Linger.  Back-to-back commits suit a lone writer (its change goes up at once), but under
load each commit carries little and costs the same requests (per queue its log and cq
objects and its metadata copy, and one lease write): the requests' CPU then takes the
broker's core from the writes themselves.  ``Linger``: after a commit that carried at
least ``BUSY_BYTES``, a queue's batch waits until it is ``tier.durable_ack_ms`` old (or
full) before the next; after a smaller one, commits run back to back again.  A writer
waiting for each answer never makes a commit that large, so it never lingers.

Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from store.errors import FailedPrecondition
from tiered.errors import TierError, TierUnavailable

BUSY_BYTES = 64 << 10  # a commit this large: the next lingers (see above)


class Linger:
    """See the module docstring: how long a batch waits to fill before its commit."""

    def __init__(self, limit_ms: int, busy_bytes: int = BUSY_BYTES) -> None:
        self._limit_ms, self._busy_bytes = limit_ms, busy_bytes
        self.ms = 0  # the batch age a commit waits for now (0: back to back)

    def committed(self, nbytes: int) -> None:
        """After a commit that uploaded ``nbytes``."""
        self.ms = self._limit_ms if nbytes >= self._busy_bytes else 0


class DurablePosition:
    """See the module docstring."""

    def __init__(self, position: int, timeout_s: float) -> None:
        self._cond = threading.Condition()
        self._position = position
        self._timeout_s = timeout_s
        self.gate: Callable[[], None] | None = None  # raises: not confirmed (see above)
        self._fenced: FailedPrecondition | None = None
        self._target = position  # the latest position published, to pass the gate
        self._thread: threading.Thread | None = None
        self._stopped = False

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
            self._position = self._target = position

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

    def publish(self, position: int) -> None:
        """Move to ``position`` (never back): at once without a gate, else once the
        gate's thread passed the gate after this call."""
        with self._cond:
            if position <= self._target or self._fenced is not None:
                return
            self._target = position
            if self.gate is None:
                self._position = position
            elif self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="durable-gate",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop the gate's thread, once it confirmed what was published (for at most
        ``drain_s``: what it had not confirmed then stays unconfirmed)."""
        limit = time.monotonic() + drain_s
        with self._cond:
            while self._thread is not None and self._fenced is None \
                    and self._position < self._target and time.monotonic() < limit:
                self._cond.wait(max(0.0, limit - time.monotonic()))
            self._stopped = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and self._fenced is None \
                        and self._target <= self._position:
                    self._cond.wait()
                if self._stopped or self._fenced is not None:
                    return
                target = self._target  # its objects are in the tier: published after
            if not self.confirm():  # (the lease logged why); fenced: the loop ends
                time.sleep(0.05)
                continue
            with self._cond:
                if target > self._position:
                    self._position = target
                    self._cond.notify_all()
