"""Broker leases in the shared tier: who is alive, who takes a lost broker over, and the
fencing that keeps a broker that lost its lease from answering OK.

Each broker with ``tier.failover`` holds ``brokers/<broker_name>.json`` (JSON: broker,
address, RocketMQ address, epoch, renewal count, wall time of the last renewal (for
people: never used to judge expiry), load, lease length, ``taken_by``) and
renews it every ``tier.lease_s`` / 3 with a conditional put on the version it last wrote
(``Provider.swap``: S3's ``If-Match``).  The bucket is the coordination point: every
change has one winner, no other service is needed.

**Expiry is judged by the watcher's own clock, never by a time written in the object**:
a watcher (``LeaseWatch``, every ``lease_s`` / 10) remembers, per lease, the version it
saw and when it first saw it (monotonic).  A lease whose version has not changed for
``lease_s`` of the watcher's time is expired.  So wall clocks may disagree; only clock
*rates* are assumed close (within ``margin`` over one lease).

**One winner.**  A watcher that finds an expired lease writes ``taken_by: <itself>`` into
it with a conditional put on the version it saw: of several survivors exactly one wins
and runs the takeover (``chronomq.takeover``); the others see the change and do nothing.
The least loaded survivor tries first: survivors rank themselves by the load in their
own leases (topics owned, then name) and the n-th waits n x ``lease_s`` / 3 more.  With
no survivor left nothing happens until a broker with failover starts: its first watch
takes the expired leases over.

**Fencing** (``BrokerLease.check``): a renewal that succeeds extends validity to its
*start* (monotonic) + ``lease_s`` - ``margin``.  A watcher can declare the lease expired
only ``lease_s`` after it first saw that version, which is after the renewal started, so
the holder stops answering OK (UNAVAILABLE) ``margin`` before anyone can take it over
(the margin covers clock rates and a GC or scheduling pause between a check and its
answer).  Callers check after the change is durable (with durable-ack: after the upload
completed), just before they answer.  A holder whose renewal finds ``taken_by`` set stops
for good: every state change is refused with FAILED_PRECONDITION naming the new owner.

Thread-safe.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from store.errors import FailedPrecondition, Unavailable
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider

log = logging.getLogger(__name__)

PREFIX = "brokers/"


def lease_path(broker: str) -> str:
    return f"{PREFIX}{broker}.json"


def margin_s(lease_s: float) -> float:
    """The fencing margin: a fifth of the lease (2 s of the default 10 s)."""
    return lease_s / 5


@dataclass(frozen=True, slots=True)
class LeaseView:
    broker: str
    address: str
    rocketmq_address: str
    epoch: int
    load: int
    taken_by: str


def _parse(raw: bytes) -> LeaseView:
    d = json.loads(raw)
    return LeaseView(str(d["broker"]), str(d.get("address", "")),
                     str(d.get("rocketmq_address", "")), int(d.get("epoch", 0)),
                     int(d.get("load", 0)), str(d.get("taken_by", "")))


def successor(provider: Provider, broker: str, hops: int = 8) -> LeaseView | None:
    """The lease of the broker that serves ``broker``'s topics now: follows ``taken_by``
    from ``broker``'s lease (a chain of takeovers) to a lease not taken over; None when
    ``broker`` was not taken over, or a lease on the way is missing or unreadable."""
    name = broker
    for _ in range(hops):
        try:
            view = _parse(provider.read_versioned(lease_path(name))[0])
        except (TierError, ValueError, KeyError, TypeError):
            return None
        if not view.taken_by:
            return view if name != broker else None
        name = view.taken_by
    return None


class TakenOver(FailedPrecondition):
    """Raised when this broker's lease was taken over by another broker."""


class BrokerLease:
    """This broker's lease: acquire, renew, and the fencing check."""

    def __init__(self, provider: Provider, broker: str, address: str, rocketmq_address: str,
                 lease_s: float, monotonic: Callable[[], float]) -> None:
        self._provider = provider
        self.broker = broker
        self.address, self.rocketmq_address = address, rocketmq_address
        self.lease_s = lease_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._version = ""
        self._epoch = 0
        self._renewals = 0
        self._nonce = secrets.token_hex(8)  # every content differs: versions never repeat
        self._valid_until = 0.0
        self.taken_by = ""
        self.load: Callable[[], int] = lambda: 0
        # for people reading the object (the console, an operator); never for expiry
        self.wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)

    def _content(self, taken_by: str = "") -> bytes:
        return json.dumps({
            "broker": self.broker, "address": self.address,
            "rocketmq_address": self.rocketmq_address, "epoch": self._epoch,
            "renewals": self._renewals, "renewed_ms": self.wall_ms(), "load": self.load(),
            "lease_s": self.lease_s, "nonce": self._nonce, "taken_by": taken_by},
            sort_keys=True).encode()

    def acquire(self) -> None:
        """Hold the lease at start: create it, or take our own earlier one (a new
        epoch).  ``TakenOver`` when another broker took this one over."""
        path = lease_path(self.broker)
        start = self.monotonic()
        try:
            raw, version = self._provider.read_versioned(path)
        except TierNotFound:
            raw, version = b"", ""
        if raw:
            old = _parse(raw)
            if old.taken_by:
                raise TakenOver(
                    f"broker {self.broker} was taken over by {old.taken_by} (its lease "
                    f"{path} in the tier says so): its topics live there now; start this "
                    "broker with an empty data directory under a new tier.broker_name")
            self._epoch = old.epoch + 1
        new = self._provider.swap(path, self._content(), version)
        if new is None:
            raise FailedPrecondition(f"the lease {path} changed while this broker "
                                     "started: is another process running as "
                                     f"{self.broker}?")
        with self._lock:
            self._version = new
            self._valid_until = start + self.lease_s - margin_s(self.lease_s)

    def renew(self) -> bool:
        """One renewal (every ``lease_s`` / 3); True when it succeeded.  Finding the
        lease taken over fences this broker for good."""
        if self.taken_by:
            return False
        start = self.monotonic()
        self._renewals += 1
        path = lease_path(self.broker)
        try:
            new = self._provider.swap(path, self._content(), self._version)
            if new is None:
                current = _parse(self._provider.read_versioned(path)[0])
                self.taken_by = current.taken_by or "another broker"
                log.error("broker %s was taken over by %s: refusing every change from now on",
                          self.broker, self.taken_by)
                return False
        except (TierError, ValueError, KeyError, TypeError) as exc:
            log.warning("could not renew the lease %s: %s (valid for %.1f s more)", path, exc,
                        max(0.0, self._valid_until - self.monotonic()))
            return False
        with self._lock:
            self._version = new
            self._valid_until = start + self.lease_s - margin_s(self.lease_s)
        return True

    def valid_for_s(self) -> float:
        return 0.0 if self.taken_by else max(0.0, self._valid_until - self.monotonic())

    def check(self) -> None:
        """Raise unless this broker may answer OK to a change now: ``TakenOver``
        (FAILED_PRECONDITION) naming the new owner, or ``Unavailable`` while the lease
        cannot be renewed."""
        if self.taken_by:
            raise TakenOver(f"broker {self.broker} was taken over by {self.taken_by}: its "
                            f"topics are served there now")
        if self.monotonic() >= self._valid_until:
            raise Unavailable(f"broker {self.broker} could not renew its lease in the tier "
                              "in time: it answers no OK until it does (fencing); retry, "
                              "or at another broker")


class LeaseWatch:
    """Watches the other brokers' leases; takes over one that expired (see the module
    docstring).  ``take_over(broker)`` is called at most once per lease won."""

    def __init__(self, provider: Provider, me: BrokerLease,
                 take_over: Callable[[str], None]) -> None:
        self._provider = provider
        self._me = me
        self._take_over = take_over
        self._seen: dict[str, tuple[str, float]] = {}  # broker -> (version, first seen)

    def step(self) -> list[str]:
        """One look at every lease; returns the brokers this broker won now."""
        now = self._me.monotonic()
        lease_s = self._me.lease_s
        views: dict[str, tuple[LeaseView, str, bytes]] = {}
        for path in self._provider.list(PREFIX):
            name = path[len(PREFIX):].removesuffix(".json")
            try:
                raw, version = self._provider.read_versioned(path)
                views[name] = (_parse(raw), version, raw)
            except (TierError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping lease %s: %s", path, exc)
        expired: list[str] = []
        for name, (view, version, _) in views.items():
            seen = self._seen.get(name)
            if seen is None or seen[0] != version:
                self._seen[name] = (version, now)
                continue
            if name != self._me.broker and not view.taken_by and now - seen[1] >= lease_s:
                expired.append(name)
        if not expired or not self._me.valid_for_s():
            return []
        live = sorted((v.load, n) for n, (v, _, _) in views.items()
                      if not v.taken_by and n not in expired)
        rank = next((i for i, (_, n) in enumerate(live) if n == self._me.broker), 0)
        won = []
        for name in expired:
            _, since = self._seen[name]
            if now - since < lease_s + rank * lease_s / 3:
                continue  # a less loaded survivor tries first
            _, version, raw = views[name]
            content = json.dumps({**json.loads(raw), "taken_by": self._me.broker},
                                 sort_keys=True).encode()
            try:
                if self._provider.swap(lease_path(name), content, version) is None:
                    continue  # another survivor won
            except TierError as exc:
                log.warning("could not take the lease of %s: %s", name, exc)
                continue
            log.warning("broker %s's lease expired: %s takes it over", name, self._me.broker)
            won.append(name)
            self._take_over(name)
        return won
