"""The end of the failover chaos (``testkit.chaos.run``): drain every topic through the
client library, then check the ledger (``testkit.chaos.workload``) with the one checker,
``testkit.checker.check``, which names every violation: LOST, REDELIVERED_AFTER_ACK,
LEASE_BROKEN (a pop's lease; a Subscribe stream's lease ends with its stream, so none is
claimed for those), EARLY, UNEXPECTED, CORRUPT, NOT_BACK, OK_AFTER_TAKEOVER, TICK_MISSING,
TICK_TWICE, DEBOUNCE_STALE, DELETED_BACK; an EARLY delivery or a lease ended early by a
broker's clock jumped ahead, within its window, is counted as ``excused``.  Each
violation is given with the evidence of its deliveries (queue/offset, the broker
address that answered).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from chronomq.client import RpcError
from chronomq.client.routing import RoutedClient
from testkit.chaos.workload import GROUP, Workload
from testkit.checker import ALL_KINDS, check, not_back
from testkit.ledger import AckOk, Delivery, SendAttempt, SendOk, Skip, delivery, now_ms
from testkit.promises import missing_ticks, owed_debounced

DRAIN_INVISIBLE_S = 60
REVIVE_SLACK_MS = 3000  # a lease revives within about a second of its deadline


@dataclass
class Outcome:
    """What the checks found: counts for the report, and every violation."""

    sends_attempted: int = 0
    sends_ok: int = 0
    deliveries: int = 0
    acks: int = 0
    skipped: int = 0
    probes_ok: int = 0
    closest_ok_to_claim_ms: int | None = None  # max over taken-over lives of OK - claim
    drain_s: float = 0.0
    excused: int = 0  # early by a broker's clock ahead, by at most as far (checker)
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def horizon_ms(workload: Workload) -> int:
    """By then every message sent is due and every lease given has run out."""
    out = 0
    for e in workload.ledger.snapshot():
        if isinstance(e, SendAttempt):
            out = max(out, e.lb_ms)
        elif isinstance(e, Delivery):
            out = max(out, e.start_ms + e.invisible_time_s * 1000)
    return out + REVIVE_SLACK_MS


def drain(routed: Callable[[], RoutedClient], topics: list[str], workload: Workload,
          grace_s: float, say: Callable[[str], None] = print) -> float:
    """Pop and ack every topic (ledgered, leases ``drain:<n>``) until everything is due
    and every lease ran out, every OK send was delivered, every skipped delivery came
    again, every owed tick and last debounced body came, and a round of pops found
    nothing; it gives up once past that horizon nothing came for ``grace_s`` (a topic
    whose owner does not answer yet is waited for: what it holds is not lost; a long
    run's backlog is drained however long that takes, as long as messages come).  Says
    every minute how many came and what is still owed.  Returns the seconds it took."""
    t0 = time.monotonic()
    until = horizon_ms(workload)
    leases = itertools.count()
    looked, tell, came_at, came = 0.0, t0 + 60, t0, 0
    with routed() as rc:
        while True:
            got = sum(_drain_once(rc, topic, workload, leases) for topic in topics)
            came += got
            got_any = got > 0
            now, mono = now_ms(), time.monotonic()
            if got_any:
                came_at = mono
            if now >= until and not got_any and mono - looked > 2:
                looked, left = mono, len(owed(workload))  # (a scan: not always)
                if not left:
                    break
                if looked > tell:
                    say(f"draining: {left} message(s) still owed after {looked - t0:.0f} s")
                    tell = looked + 60
            elif mono > tell:
                say(f"draining: {came} delivered in {mono - t0:.0f} s, still coming")
                tell = mono + 60
            if now > until and mono - came_at > grace_s:
                break
    return time.monotonic() - t0


def _drain_once(rc: RoutedClient, topic: str, workload: Workload,
                leases: Iterator[int]) -> int:
    """One pop of ``topic`` and the ack of what came; how many came."""
    start = now_ms()
    try:
        got = rc.pop(topic, GROUP, 32, DRAIN_INVISIBLE_S, 200)
        leased = [(f"drain:{next(leases)}", m) for m in got]
        workload.ledger.append(*[delivery(lease, m, GROUP, start, DRAIN_INVISIBLE_S)
                                 for lease, m in leased])
        if leased:
            errors = rc.ack(topic, GROUP, [m.receipt_handle for _, m in leased])
            at = now_ms()
            workload.ledger.append(*[AckOk(lease, m.message_id, GROUP, at)
                                     for (lease, m), e in zip(leased, errors, strict=True)
                                     if not e])
    except RpcError:
        return 0
    return len(got)


def owed(workload: Workload) -> set[str]:
    """Tokens still owed: sent OK and never delivered, skipped and not seen again, the
    last OK body of a debounced id, a tick owed (``<name>@<ms>``)."""
    entries = workload.ledger.snapshot()
    sent = {e.token for e in entries if isinstance(e, SendOk)}
    deliveries = [e for e in entries if isinstance(e, Delivery)]
    seen = {d.token for d in deliveries}
    skipped = {e.lease for e in entries if isinstance(e, Skip)}
    ticks = {f"{name}@{t}" for name, ts in missing_ticks(entries).items() for t in ts}
    return ((sent - seen) | {d.token for d in not_back(deliveries, skipped)}
            | owed_debounced(entries) | ticks)


def check_all(workload: Workload, claims: dict[str, tuple[str, int]]) -> Outcome:
    """``testkit.checker.check`` of the whole ledger; ``claims``: broker life ->
    (taken_by, claimed_ms) of every lease claimed during the run."""
    entries = workload.ledger.snapshot()
    report = check(entries, group=GROUP, claims=claims)
    out = Outcome(report.sends_attempted, report.sends_ok, report.deliveries, report.acks,
                  report.skipped, report.probes_ok, report.closest_ok_to_claim_ms,
                  excused=report.excused)
    by_id: dict[str, list[Delivery]] = {}
    for e in entries:
        if isinstance(e, Delivery):
            by_id.setdefault(e.message_id, []).append(e)
    out.violations = [f"{v}" + _where(workload, by_id.get(v.message_id, []))
                      for v in report.violations]
    out.counts = {k: report.count(k) for k in ALL_KINDS}
    return out


def _where(workload: Workload, ds: list[Delivery]) -> str:
    """Deliveries of one message (lease, attempt, time, queue/offset): evidence."""
    return "" if not ds else " | deliveries: " + "; ".join(
        f"{d.lease} attempt {d.attempt} at {d.at_ms} queue/offset {workload.where.get(d.lease)}"
        for d in ds[:6])
