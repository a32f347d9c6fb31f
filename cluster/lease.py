"""Broker leases in the shared tier: who is alive, who takes a lost broker over, and the
fence that keeps a broker taken over from answering OK.

Every broker that uploads (``tier.upload``) holds ``brokers/<broker>.json`` (JSON:
broker (its tier prefix, ``cluster.layout.broker_prefix``), name (``tier.broker_name``)
and incarnation, address, RocketMQ address, epoch (one per start), renewal count, a
random nonce per process,
wall time of the last write (for people: never used to judge expiry), load, lease length
(0: not watched, the broker runs without ``tier.failover``), ``taken_by``, and with
``tier.durable_ack`` the commit record: ``meta``, the queue metadata whose copies are not
in the tier yet, ``tiered.carried``).  Every write
to it is a conditional put on the version this broker last wrote (``Provider.swap``:
S3's ``If-Match``), so the object is one chain of versions and every change of owner has
one winner: the bucket is the coordination point, no other service is needed.

**The decision is ``taken_by`` in this object, and nothing else.**  A takeover (automatic
or ``chronomq takeover``) first writes ``taken_by: <successor>`` into the departed
broker's lease by a conditional put (``claim``); only then does it read anything of the
departed broker's (``cluster.takeover``).

**The bucket fences a stale broker** (``BrokerLease.commit``): with ``tier.durable_ack``,
the tier commit that makes a change durable ends with a conditional write of this lease
(``tiered.dispatcher``: after the commit's objects are in, before the durable position
moves and any OK is given).  Once a successor wrote ``taken_by``, that write fails
whatever the clocks say, so a broker paused, partitioned or restarted for any time
answers no OK after its successor read its state; and every OK it gave before was for a
change in the tier before the successor's claim, which the successor reads after it.
The argument in full: docs/DESIGN.md,
"Failover by construction: the bucket fences, clocks only time".

**Clocks decide only when to take over.**  A watcher (``cluster.leasewatch``) judges a
lease expired when its version has not changed for ``lease_s`` of the watcher's own
monotonic clock.  Without durable-ack a broker is also fenced by time alone (``check``):
a renewal extends validity to its *start* + ``lease_s`` - ``margin``, so the holder stops
answering OK ``margin`` before any watcher can judge it expired (only clock rates are
assumed close).

**Ambiguous writes.**  A conditional put whose answer was lost (S3 retried it and then
said 412, or the connection broke) is resolved by reading the object back: the nonce and
renewal count say whether the write was ours.  Only a ``taken_by``, or another process's
nonce, fences this broker; a failed or unknown write is retried at the next renewal.

Thread-safe.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cluster.layout import lease_path
from store.clock import Clock
from store.errors import FailedPrecondition, Unavailable
from tiered.carried import FIELD as CARRIED
from tiered.carried import carried_in, entries
from tiered.errors import TierError, TierNotFound, TierUnavailable
from tiered.provider import Provider

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 50  # a claim races the departed broker's own writes this many times
START_BACKOFF_S = 0.2  # at start, a failed lease write is tried again after this, ...
START_BACKOFF_MAX_S = 5.0  # ... doubled each time up to this


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
    lease_s: float = 0.0  # 0: not watched (a broker without tier.failover)
    nonce: str = ""
    renewals: int = 0
    name: str = ""  # tier.broker_name ("" in a lease written before incarnations)
    incarnation: int = 0


def parse_lease(raw: bytes) -> LeaseView:
    d = json.loads(raw)
    return LeaseView(str(d["broker"]), str(d.get("address", "")),
                     str(d.get("rocketmq_address", "")), int(d.get("epoch", 0)),
                     int(d.get("load", 0)), str(d.get("taken_by", "")),
                     float(d.get("lease_s", 0.0)), str(d.get("nonce", "")),
                     int(d.get("renewals", 0)), str(d.get("name", "")),
                     int(d.get("incarnation", 0)))


def read_lease(provider: Provider, broker: str) -> tuple[LeaseView | None, str]:
    """``broker``'s lease and its version; (None, "") when it has none.  Raises
    ``TierError`` when it cannot be read or parsed."""
    raw, version = _read_raw(provider, broker)
    return (_parse(raw, broker), version) if raw else (None, "")


def _read_raw(provider: Provider, broker: str) -> tuple[bytes, str]:
    try:
        return provider.read_versioned(lease_path(broker))
    except TierNotFound:
        return b"", ""


def _parse(raw: bytes, broker: str) -> LeaseView:
    try:
        return parse_lease(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise TierError(f"the lease {lease_path(broker)} is damaged: {exc}") from exc


def successor(provider: Provider, broker: str, hops: int = 8) -> LeaseView | None:
    """The lease of the broker that serves ``broker``'s topics now: follows ``taken_by``
    from ``broker``'s lease (a chain of takeovers) to a lease not taken over; None when
    ``broker`` was not taken over, or a lease on the way is missing or unreadable."""
    name = broker
    for _ in range(hops):
        try:
            view, _ = read_lease(provider, name)
        except TierError:
            return None
        if view is None:
            return None
        if not view.taken_by:
            return view if name != broker else None
        name = view.taken_by
    return None


def claim(provider: Provider, departed: str, me: str, wall_ms: int) -> str:
    """Write ``taken_by: me`` into ``departed``'s lease (created when it has none) by a
    conditional put; returns the broker that holds the claim now (``me``, or whoever
    claimed it first).  Raced by the departed broker's own renewals and commits, it
    reads and tries again; ``TierError`` when the tier cannot be reached."""
    path = lease_path(departed)
    for attempt in range(CLAIM_ATTEMPTS):
        if attempt:  # a live broker writes its lease with every commit: step aside a while
            time.sleep(random.uniform(0, min(0.2, 0.01 * 2 ** attempt)))
        try:
            raw, version = provider.read_versioned(path)
        except TierNotFound:
            raw, version = b"", ""
        try:
            old = json.loads(raw) if raw else {}
        except ValueError:  # damaged: the claim replaces it
            old = {}
        if not isinstance(old, dict):
            old = {}
        old.setdefault("broker", departed)
        if old.get("taken_by"):
            return str(old["taken_by"])
        content = json.dumps({**old, "taken_by": me, "claimed_ms": wall_ms},
                             sort_keys=True).encode()
        try:
            if provider.swap(path, content, version) is not None:
                return me
        except TierUnavailable:  # the outcome may be ours: read it back
            pass
    raise TierUnavailable(f"could not claim {path}: it changed {CLAIM_ATTEMPTS} times "
                          f"while {me} tried (is {departed} running?)")


def inherit(provider: Provider, departed: str, holder: str, me: str, wall_ms: int) -> bool:
    """Move ``departed``'s claim from ``holder`` (a broker that claimed it and was itself
    taken over by ``me`` before it finished: ``cluster.takeover``) to ``me``, by a
    conditional put; True when the claim is ``me``'s now."""
    path = lease_path(departed)
    for _ in range(CLAIM_ATTEMPTS):
        try:
            raw, version = provider.read_versioned(path)
            old = json.loads(raw)
        except (TierNotFound, ValueError):
            return False
        if not isinstance(old, dict):
            return False
        if old.get("taken_by") == me:
            return True
        if old.get("taken_by") != holder:
            return False
        content = json.dumps({**old, "taken_by": me, "claimed_ms": wall_ms,
                              "inherited_from": holder}, sort_keys=True).encode()
        try:
            if provider.swap(path, content, version) is not None:
                return True
        except TierUnavailable:  # the outcome may be ours: read it back
            pass
    raise TierUnavailable(f"could not move the claim of {path} from {holder} to {me}")


class TakenOver(FailedPrecondition):
    """Raised when this broker's lease was taken over by another broker."""


class BrokerLease:
    """This broker's lease: acquire, renew, the bucket-fenced ``commit``, the timing
    ``check``.  ``watched`` (``tier.failover``): renewed every ``lease_s`` / 3 by its own
    thread (``start``), watched by the other brokers, fenced by time too.  ``broker`` is
    the tier prefix of the incarnation ``incarnation`` of the broker called ``name``
    (``cluster.rejoin``; both "" and 0 name a broker by its prefix alone)."""

    def __init__(self, provider: Provider, broker: str, address: str, rocketmq_address: str,
                 lease_s: float, clock: Clock, watched: bool = True, name: str = "",
                 incarnation: int = 0) -> None:
        self._provider = provider
        self.broker = broker
        self.name, self.incarnation = name or broker, incarnation
        self.address, self.rocketmq_address = address, rocketmq_address
        self.lease_s = lease_s
        self.watched = watched
        self._clock = clock
        self._lock = threading.Lock()  # one write at a time: versions form one chain
        self._version = ""
        self._epoch = 0
        self._renewals = 0
        self._nonce = secrets.token_hex(8)  # this process's: versions never repeat
        self._valid_until = 0.0
        self.taken_by = ""
        self.load: Callable[[], int] = lambda: 0
        self.on_taken_over: Callable[[str], None] = lambda _: None
        # the queue metadata every write carries (``tiered.carried``): at start what the
        # lease carried before (``held``), once the dispatcher is wired its commit record;
        # ``confirmed`` is told what a write that went in carried
        self.held: dict[str, bytes] = {}
        self.carried: Callable[[], dict[str, bytes]] = lambda: self.held
        self.confirmed: Callable[[dict[str, bytes]], None] = lambda _: None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def provider(self) -> Provider:
        """The tier as this lease reads and writes it."""
        return self._provider

    def monotonic(self) -> float:
        """The project clock's monotonic time, in seconds."""
        return self._clock.monotonic_ms() / 1000

    def wall_ms(self) -> int:
        """The project clock's wall time (written for people, never judged)."""
        return self._clock.now_ms()

    def _content(self, carried: dict[str, bytes]) -> bytes:
        return json.dumps({
            "broker": self.broker, "name": self.name, "incarnation": self.incarnation,
            "address": self.address,
            "rocketmq_address": self.rocketmq_address, "epoch": self._epoch,
            "renewals": self._renewals, "renewed_ms": self._clock.now_ms(),
            "load": self.load(), "lease_s": self.lease_s if self.watched else 0,
            "nonce": self._nonce, "taken_by": "",
            CARRIED: entries(carried, self.broker)}, sort_keys=True).encode()

    def acquire(self, timeout_s: float = 0.0,
                sleep: Callable[[float], None] = time.sleep) -> None:
        """Hold the lease at start: create it, or take our own earlier one (a new
        epoch).  ``TakenOver`` when another broker took this one over.  A tier that
        fails or does not answer (a slow S3 making its first volume) is asked again
        with back-off for ``timeout_s`` (``tier.start_timeout_s``), then ``Unavailable``."""
        deadline = self.monotonic() + timeout_s
        delay_s = START_BACKOFF_S
        while True:
            try:
                if self._acquire_once():
                    return
                why = "it changed while this broker wrote it"
            except TierError as exc:
                why = str(exc)
            if self.monotonic() + delay_s > deadline:
                raise Unavailable(f"could not write the lease {lease_path(self.broker)} "
                                  f"within tier.start_timeout_s ({timeout_s:g} s): {why}")
            log.warning("writing the lease %s at start: %s; again in %.1f s",
                        lease_path(self.broker), why, delay_s)
            sleep(delay_s)
            delay_s = min(delay_s * 2, START_BACKOFF_MAX_S)

    def _acquire_once(self) -> bool:
        """One read and conditional write of the lease at start; False when it changed
        meanwhile (or the answer was lost and it is not ours): read it again."""
        with self._lock:
            start = self.monotonic()
            raw, version = _read_raw(self._provider, self.broker)
            view = _parse(raw, self.broker) if raw else None
            if view is not None and view.taken_by:
                raise TakenOver(
                    f"broker {self.broker} was taken over by {view.taken_by} (its lease "
                    f"{lease_path(self.broker)} in the tier says so): its topics live "
                    "there now")
            self._epoch = view.epoch + 1 if view is not None else 0
            self.held = carried_in(raw, self.broker) if raw else {}  # carried on
            self._renewals += 1
            content = self._content(self.held)
            path = lease_path(self.broker)
            try:
                new = self._provider.swap(path, content, version)
            except TierError as exc:
                new = None
                log.warning("writing the lease %s failed (%s): reading it back", path, exc)
            if new is None:  # refused, or its answer lost: ours if it reads back ours
                raw, new = self._provider.read_versioned(path)
                if raw != content:
                    return False
            self._version = new
            self._valid_until = start + self.lease_s - margin_s(self.lease_s)
            return True

    def _write(self, start: float) -> str:
        """One conditional write of the lease (the caller holds ``_lock``): "ok",
        "fenced" (``taken_by`` is set) or "failed" (retry later)."""
        self._renewals += 1
        carried = self.carried()
        content = self._content(carried)
        path = lease_path(self.broker)
        try:
            new = self._provider.swap(path, content, self._version)
        except TierError as exc:
            new = None
            log.warning("writing the lease %s failed (%s): reading it back", path, exc)
        if new is None:
            outcome, new = self._resolve(content)
            if outcome != "ok":
                return outcome
        assert new is not None
        self._version = new
        self._valid_until = start + self.lease_s - margin_s(self.lease_s)
        if carried:
            self.confirmed(carried)
        return "ok"

    def _resolve(self, content: bytes) -> tuple[str, str | None]:
        """After a conditional write that failed or whose answer was lost: read the lease
        back and tell whose it is."""
        try:
            raw, version = self._provider.read_versioned(lease_path(self.broker))
            current = parse_lease(raw)
        except (TierError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read the lease %s back: %s", lease_path(self.broker), exc)
            return "failed", None
        if current.taken_by:
            return self._fence(current.taken_by), None
        if current.nonce != self._nonce:
            return self._fence(f"another process running as {self.broker}"), None
        if raw == content:  # ours went in: the answer was lost
            return "ok", version
        # ours did not go in, but the lease is this process's: at our last version, or
        # at one of an earlier write of ours whose answer and read-back were both lost;
        # the next write goes on from it (else every one is refused, for good)
        self._version = version
        return "failed", None

    def _fence(self, by: str) -> str:
        first = not self.taken_by
        self.taken_by = by
        if first:
            log.error("broker %s was taken over by %s: refusing every change from now on",
                      self.broker, by)
            self.on_taken_over(by)
        return "fenced"

    def renew(self) -> bool:
        """One renewal (every ``lease_s`` / 3); True when it succeeded.  Finding the
        lease taken over fences this broker for good."""
        if self.taken_by:
            return False
        with self._lock:
            start = self.monotonic()
            outcome = self._write(start)
        if outcome == "failed":
            log.warning("could not renew the lease %s (valid for %.1f s more)",
                        lease_path(self.broker), self.valid_for_s())
        return outcome == "ok"

    def commit(self) -> None:
        """The bucket's fence on a tier commit (``tier.durable_ack``): one conditional
        write of the lease, after the commit's objects are in the tier and before any OK
        that depends on them.  Raises ``TakenOver`` once a successor claimed this
        broker's lease, ``TierUnavailable`` when the write could not be made now."""
        self.check_taken()
        with self._lock:
            outcome = self._write(self.monotonic())
        if outcome == "fenced":
            self.check_taken()
        if outcome != "ok":
            raise TierUnavailable(f"the lease {lease_path(self.broker)} could not be "
                                  "written: the commit is not confirmed")

    def valid_for_s(self) -> float:
        if self.taken_by:
            return 0.0
        if not self.watched:
            return float("inf")
        return max(0.0, self._valid_until - self.monotonic())

    def check_taken(self) -> None:
        if self.taken_by:
            raise TakenOver(f"broker {self.broker} was taken over by {self.taken_by}: its "
                            f"topics are served there now")

    def check(self) -> None:
        """Raise unless this broker may answer OK to a change now: ``TakenOver``
        (FAILED_PRECONDITION) naming the new owner, or, when watched, ``Unavailable``
        while the lease cannot be renewed (the timing fence)."""
        self.check_taken()
        if self.watched and self.monotonic() >= self._valid_until:
            raise Unavailable(f"broker {self.broker} could not renew its lease in the tier "
                              "in time: it answers no OK until it does (fencing); retry, "
                              "or at another broker")

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Renew every ``lease_s`` / 3 on a thread of its own (watched leases only), from
        right after ``acquire``: a long recovery at start does not let the lease lapse."""
        if not self.watched or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lease-renew", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.lease_s)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3) and not self.taken_by:
            try:
                self.renew()
            except Exception:  # the next renewal tries again
                log.exception("renewing the lease %s failed", lease_path(self.broker))
