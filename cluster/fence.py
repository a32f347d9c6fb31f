"""The Fence: the one gate every OK of a broker passes once its change is durable.

A broker answers OK to a change (a send, a lease, an ack, a cancel, a topic created or
deleted, a schedule's tick) only after the change is durable here (and, with
``tier.durable_ack``, in the tier) *and* after this gate lets it through.  What it
checks is this broker's lease (``cluster.lease``): taken over, every check raises
``TakenOver`` (FAILED_PRECONDITION naming the successor) for good; watched
(``tier.failover``) and not renewed in time, ``Unavailable`` (the timing fence).  With
``tier.durable_ack`` the bucket fences as well: the durable position of the tier moves
only past a conditional write of the lease (``gate`` of ``tiered.durable``), and a
change that is in the tier without a commit of the dispatcher (a topic's catalogue
copy) is confirmed by ``confirm``, one lease write begun after the call (a group
commit: callers at once share one write).

The Fence owns the lease's hooks: the dispatcher's gate is set here once, and
``on_taken`` listeners (the durable position stops, the health check answers
NOT_SERVING) are called once when the lease finds itself taken over.  Without a lease (no
``tier.upload``) every check passes.  docs/DESIGN.md, "Every OK and its gate", lists
each state change answered OK with the gate it passes.  Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cluster.lease import BrokerLease, TakenOver
from store.errors import ChronomqError
from tiered.durable import DurablePosition
from tiered.errors import TierUnavailable


class Fence:
    """See the module docstring."""

    def __init__(self, lease: BrokerLease | None, durable: DurablePosition | None = None,
                 durable_ack: bool = False, name: str = "") -> None:
        self._lease = lease
        self._durable = durable
        self._bucket = lease is not None and durable is not None and durable_ack
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []
        self._write_lock = threading.Lock()  # one confirming lease write at a time
        self._asked = self._confirmed = 0
        if lease is None:
            return
        lease.on_taken_over = self._taken
        if durable is not None:
            if durable_ack:  # the bucket's fence on every tier commit
                durable.gate = lease.commit
            self.on_taken(lambda by: durable.fence(TakenOver(
                f"broker {name} was taken over by {by}: its topics are served there now")))

    @property
    def taken_by(self) -> str:
        """The broker that took this one over ("": none)."""
        return self._lease.taken_by if self._lease is not None else ""

    def check(self) -> None:
        """Raise unless this broker may answer OK to a change now (after the change is
        durable, just before the answer)."""
        if self._lease is not None:
            self._lease.check()

    def may_change(self) -> bool:
        """Whether background work that changes state (timer deliveries, revives) may
        run now: not while fenced."""
        try:
            self.check()
        except ChronomqError:
            return False
        return True

    def confirm(self) -> None:
        """With the bucket's fence: a lease write begun after this call, shared by the
        callers meanwhile; raises the fence's error once taken over, ``TierUnavailable``
        when the lease cannot be written.  Then ``check``."""
        if self._bucket:
            with self._lock:
                self._asked += 1
                ticket = self._asked
            with self._write_lock:
                if self._confirmed < ticket:
                    with self._lock:
                        covers = self._asked
                    self._write()
                    self._confirmed = covers
        self.check()

    def _write(self) -> None:
        durable = self._durable
        assert durable is not None
        if durable.confirm():
            return
        if durable.fenced is not None:
            raise durable.fenced
        raise TierUnavailable("the change is stored here and in the tier, but this "
                              "broker's lease could not be written to confirm it: the "
                              "tier is slow or failing")

    def on_taken(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(successor)`` once this broker is found taken over (at once if
        it is already)."""
        with self._lock:
            self._listeners.append(listener)
            by = self.taken_by
        if by:
            listener(by)

    def _taken(self, by: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(by)
