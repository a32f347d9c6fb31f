"""Lease renewal for the RocketMQ front's push consumers (``auto_renew`` receives).

A push consumer hands a message to its listener and acks when the listener returns, which
may be long after the receive's invisible duration.  Its messages carry renewable
receipt handles (``PopService.renewable``, ``pop.handle``): a handle settles its lease
entry at whatever deadline the entry has now, and a broker taking this one over adopts
the handles' secret and the leases, so the client's acks are accepted there.

``LeaseRenewer`` keeps the messages renewing: shortly before a lease runs out
(``RENEW_AHEAD_MS``) it is extended by the receive's invisible duration through the POP
service's ChangeInvisibleTime, for at most ``MAX_RENEW_MS`` after the receive and while
the client is alive (heard of within the front's ``CLIENT_GONE_MS``; one not heard of is
retried until its lease has run out, so a client that reconnects after a failover keeps
its messages).  Settling calls end the renewing.

What to renew is durable (``pop.renewals``): a mark a message, written with the receive
before it answers and deleted when the message is settled or its renewing ends.  The
renewer reads the marks again every ``RELOAD_MS``: after a restart, and after a takeover
(the departed broker's marks come with its leases), it renews what was renewing there,
at once for a mark it did not know (its deadline is not in the mark).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pop.renewals import KEY_PREFIX, RenewMark, decode_mark, encode_mark, mark_key
from pop.service import PoppedMessage, PopService
from store.errors import ChronomqError

RENEW_AHEAD_MS = 10_000  # an auto_renew lease is renewed when it has this little left ...
MAX_RENEW_MS = 3_600_000  # ... for at most this long after its receive
RELOAD_MS = 5_000  # the marks are read again this often (a restart, a takeover)


@dataclass(slots=True)
class _Lease:
    mark: RenewMark
    expire_ms: int  # as far as this broker knows; 0: unknown (renew at the first chance)


class LeaseRenewer:
    """Keeps the messages of ``auto_renew`` receives (push consumers) invisible while the
    client works on them (see the module doc).  The client keeps the (renewable) handle it
    was given; Ack, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue with it
    end the renewing.  Thread-safe: settling and renewing a handle are serialised."""

    def __init__(self, pop: PopService, alive: Callable[[str], bool]) -> None:
        self._pop = pop
        self._alive = alive
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}  # handle as issued -> its lease
        self._ended: set[str] = set()  # settled since the last reload began
        self._reloaded_ms: int | None = None

    def count(self) -> int:
        with self._lock:
            return len(self._leases)

    def track(self, group: str, client: str, got: list[PoppedMessage], now_ms: int,
              invisible_s: int) -> None:
        """Renew these messages from now on; returns once their marks are durable (the
        receive answers after that), or raises (fenced, the store failed)."""
        marks = [RenewMark(p.receipt_handle, group, client, invisible_s, now_ms)
                 for p in got]
        self._pop.write_state([encode_mark(m) for m in marks], [])
        expire = now_ms + invisible_s * 1000
        with self._lock:
            for m in marks:
                self._leases[m.handle] = _Lease(m, expire)

    @contextmanager
    def settling(self, handles: list[str]) -> Iterator[list[str]]:
        """``handles`` while they are settled; they stop being renewed."""
        with self._lock:
            known = [h for h in handles if self._leases.pop(h, None) is not None]
            self._ended.update(handles)
            yield handles
        self._forget(known)

    def renew_due(self, now_ms: int) -> int:
        """Renew the leases within ``RENEW_AHEAD_MS`` of their deadline; returns how many."""
        if self._reloaded_ms is None or now_ms - self._reloaded_ms >= RELOAD_MS:
            self._reload(now_ms)
        renewed = 0
        ended: list[str] = []
        with self._lock:
            for issued, lease in list(self._leases.items()):
                mark = lease.mark
                if lease.expire_ms and lease.expire_ms - now_ms > RENEW_AHEAD_MS:
                    continue
                if now_ms - mark.received_ms >= MAX_RENEW_MS or \
                        (lease.expire_ms and lease.expire_ms <= now_ms):
                    ended.append(issued)  # left to run out: revive redelivers it
                    continue
                if not self._alive(mark.client):
                    if not lease.expire_ms:  # not heard of yet here: until it could last
                        lease.expire_ms = now_ms + mark.invisible_s * 1000
                    continue
                try:  # (the handle stays valid: renewable)
                    self._pop.change_invisible_time(mark.group, mark.handle,
                                                    mark.invisible_s)
                except ChronomqError:  # acknowledged, revived or dead-lettered meanwhile
                    ended.append(issued)
                    continue
                lease.expire_ms = now_ms + mark.invisible_s * 1000
                renewed += 1
            for issued in ended:
                del self._leases[issued]
        self._forget(ended)
        return renewed

    def _reload(self, now_ms: int) -> None:
        """Track the marks this renewer does not know (a restart, a takeover)."""
        with self._lock:
            self._ended.clear()
        found = [m for k, v in self._pop.state_items(KEY_PREFIX)
                 if (m := decode_mark(k, v)) is not None]
        with self._lock:
            for m in found:
                if m.handle not in self._leases and m.handle not in self._ended:
                    self._leases[m.handle] = _Lease(m, 0)
            self._reloaded_ms = now_ms

    def _forget(self, handles: list[str]) -> None:
        """Delete the marks of leases no longer renewed (not waited for: a mark left by a
        crash is found again and ends at its first renewal, refused)."""
        if handles:  # fenced or failing: the mark ends at its next renewal instead
            with contextlib.suppress(ChronomqError):
                self._pop.write_state([], [mark_key(h) for h in handles], wait=False)
