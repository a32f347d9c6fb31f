"""Lease renewal for the RocketMQ front's push consumers (``auto_renew`` receives).

A push consumer hands a message to its listener and acks when the listener returns, which
may be long after the receive's invisible duration.  Its messages carry renewable
receipt handles (``PopService.renewable``, ``pop.handle``): a handle settles its lease
entry at whatever deadline the entry has now, so what an Ack needs is the handle and the
lease, both of which a broker taking this one over adopts; nothing here has to survive
a failover for the client's acks to be accepted.  ``LeaseRenewer`` remembers, in memory,
which leases to renew: shortly before one runs out (``RENEW_AHEAD_MS``) it is extended
by the receive's invisible duration through the POP service's ChangeInvisibleTime, for
at most ``MAX_RENEW_MS`` after the receive and only while the client is alive (heard of
within the front's ``CLIENT_GONE_MS``).  Settling calls end the renewing.  After a
failover the successor does not renew them: each lease then runs out at the deadline
its last renewal gave it (at most the receive's invisible duration later).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pop.service import PoppedMessage, PopService
from store.errors import ChronomqError

RENEW_AHEAD_MS = 10_000  # an auto_renew lease is renewed when it has this little left ...
MAX_RENEW_MS = 3_600_000  # ... for at most this long after its receive


@dataclass(slots=True)
class _Lease:
    group: str
    client: str
    handle: str  # renewable: the one the client holds
    received_ms: int
    expire_ms: int
    invisible_s: int


class LeaseRenewer:
    """Keeps the messages of ``auto_renew`` receives (push consumers) invisible while the
    client works on them: shortly before a lease runs out it is extended by the receive's
    invisible duration, for at most ``MAX_RENEW_MS`` and while the client is alive.  The
    client keeps the (renewable) handle it was given; Ack, ChangeInvisibleDuration and
    ForwardMessageToDeadLetterQueue with it end the renewing.  Thread-safe: settling and
    renewing a handle are serialised."""

    def __init__(self, pop: PopService, alive: Callable[[str], bool]) -> None:
        self._pop = pop
        self._alive = alive
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}  # handle as issued -> its lease

    def count(self) -> int:
        with self._lock:
            return len(self._leases)

    def track(self, group: str, client: str, got: list[PoppedMessage], now_ms: int,
              invisible_s: int) -> None:
        expire = now_ms + invisible_s * 1000
        with self._lock:
            for p in got:
                self._leases[p.receipt_handle] = _Lease(group, client, p.receipt_handle,
                                                        now_ms, expire, invisible_s)

    @contextmanager
    def settling(self, handles: list[str]) -> Iterator[list[str]]:
        """``handles`` while they are settled; they stop being renewed."""
        with self._lock:
            for h in handles:
                self._leases.pop(h, None)
            yield handles

    def renew_due(self, now_ms: int) -> int:
        """Renew the leases within ``RENEW_AHEAD_MS`` of their deadline; returns how many."""
        renewed = 0
        with self._lock:
            for issued, lease in list(self._leases.items()):
                if lease.expire_ms - now_ms > RENEW_AHEAD_MS:
                    continue
                if (lease.expire_ms <= now_ms or now_ms - lease.received_ms >= MAX_RENEW_MS
                        or not self._alive(lease.client)):
                    del self._leases[issued]  # left to run out: revive redelivers it
                    continue
                try:  # (the handle stays valid: renewable)
                    self._pop.change_invisible_time(lease.group, lease.handle,
                                                    lease.invisible_s)
                except ChronomqError:  # acknowledged or dead-lettered meanwhile
                    del self._leases[issued]
                    continue
                lease.expire_ms = now_ms + lease.invisible_s * 1000
                renewed += 1
        return renewed
