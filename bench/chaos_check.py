"""The end of the failover chaos (``bench/bench_failover.py``): drain every topic through
the client library, then check the ledger (``bench.chaos_workload``).

Violations, each named with its evidence:

* what ``tests.chronomq.checker.check`` names: LOST (a send answered OK never
  delivered), REDELIVERED_AFTER_ACK, LEASE_BROKEN (a pop's lease; a Subscribe stream's
  lease ends with its stream, so none is claimed for those), EARLY (delivered before its
  deliver-at lower bound), UNEXPECTED, CORRUPT;
* NOT_BACK: a delivery never settled on purpose (``skipped``) and its message never
  delivered again;
* OK_AFTER_TAKEOVER: a prober's OK from broker X answered after X's lease was claimed
  (``claimed_ms`` in ``brokers/X.json``, the claimer's wall clock, the same machine's:
  ``CLOCK_NOISE_MS`` allowed for this process's own delay in reading the answer), or for
  a request begun after the claim;
* the load's: TICK_MISSING, TICK_TWICE, DEBOUNCE_STALE, DELETED_BACK
  (``bench.chaos_promises``, which says what each means).  An EARLY delivery made while a
  broker ran with its clock ahead, by at most as far, is its clock's due time, and so is
  a lease it gave before its clock jumped ended early: excused (counted as ``excused``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench.chaos_promises import (
    LOAD_KINDS,
    check_load,
    missing_ticks,
    owed_debounced,
    plain,
)
from bench.chaos_workload import GROUP, Ledger
from chronomq.client import RpcError
from chronomq.client.routing import RoutedClient
from tests.chronomq.checker import VIOLATION_KINDS, check
from tests.chronomq.ledger import AckOk, Delivery, SendAttempt, SendOk, now_ms

CLOCK_NOISE_MS = 100
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
    closest_ok_to_claim_ms: int | None = None  # max over taken-over brokers of OK - claim
    drain_s: float = 0.0
    excused: int = 0  # early by a broker's clock ahead, by at most as far (checker)
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def horizon_ms(ledger: Ledger) -> int:
    """By then every message sent is due and every lease given has run out."""
    out = 0
    for e in ledger.snapshot():
        if isinstance(e, SendAttempt):
            out = max(out, e.lb_ms)
        elif isinstance(e, Delivery):
            out = max(out, e.start_ms + e.invisible_time_s * 1000)
    return out + REVIVE_SLACK_MS


def drain(routed: Callable[[], RoutedClient], topics: list[str], ledger: Ledger,
          grace_s: float, say: Callable[[str], None] = print) -> float:
    """Pop and ack every topic (ledgered, leases ``drain:<n>``) until everything is due
    and every lease ran out, every OK send was delivered, every skipped delivery came
    again and a round of pops found nothing; at most ``grace_s`` after that horizon (a
    topic whose owner does not answer yet is waited for: what it holds is not lost).
    Says every minute what is still owed.  Returns the seconds it took."""
    t0 = time.monotonic()
    until = horizon_ms(ledger)
    leases = itertools.count()
    looked, tell = 0.0, t0 + 60
    with routed() as rc:
        while True:
            got_any = False
            for topic in topics:
                got_any |= _drain_once(rc, topic, ledger, leases)
            now = now_ms()
            if now >= until and not got_any and time.monotonic() - looked > 2:
                looked, left = time.monotonic(), len(owed(ledger))  # (a scan: not always)
                if not left:
                    break
                if looked > tell:
                    say(f"draining: {left} message(s) still owed after {looked - t0:.0f} s")
                    tell += 60
            if now > until + grace_s * 1000:
                break
    return time.monotonic() - t0


def _drain_once(rc: RoutedClient, topic: str, ledger: Ledger,
                leases: Iterator[int]) -> bool:
    """One pop of ``topic`` and the ack of what came; whether anything came."""
    start = now_ms()
    try:
        got = rc.pop(topic, GROUP, 32, DRAIN_INVISIBLE_S, 200)
        leased = [(f"drain:{next(leases)}", m) for m in got]
        for lease, m in leased:
            ledger.delivered(lease, m, start, DRAIN_INVISIBLE_S)
        if leased:
            errors = rc.ack(topic, GROUP, [m.receipt_handle for _, m in leased])
            at = now_ms()
            ledger.add(*[AckOk(lease, m.message_id, GROUP, at)
                         for (lease, m), e in zip(leased, errors, strict=True) if not e])
    except RpcError:
        return False
    return bool(got)


def owed(ledger: Ledger) -> set[str]:
    """Tokens still owed: sent OK and never delivered, skipped and not seen again, the
    last OK body of a debounced id, a tick owed (``<name>@<ms>``)."""
    entries = ledger.snapshot()
    sent = {e.token for e in entries if isinstance(e, SendOk)}
    deliveries = [e for e in entries if isinstance(e, Delivery)]
    seen = {d.token for d in deliveries}
    ticks = {f"{name}@{t}" for name, ts in missing_ticks(entries).items() for t in ts}
    return ((sent - seen) | {d.token for d in _not_back(deliveries, ledger.skipped)}
            | owed_debounced(entries) | ticks)


def _not_back(deliveries: list[Delivery], skipped: set[str]) -> list[Delivery]:
    """Skipped deliveries whose message (id and body: a debounced id is used again) was
    not delivered again."""
    last: dict[tuple[str, str], int] = {}
    for d in deliveries:
        key = (d.message_id, d.token)
        last[key] = max(last.get(key, 0), d.at_ms)
    return [d for d in deliveries
            if d.lease in skipped and last[(d.message_id, d.token)] <= d.at_ms]


def check_all(ledger: Ledger, claims: dict[str, tuple[str, int]]) -> Outcome:
    """Every check of the module docstring; ``claims``: broker -> (taken_by,
    claimed_ms) of every lease claimed during the run."""
    entries = ledger.snapshot()
    report = check(plain(entries), group=GROUP)
    out = Outcome(report.sends_attempted, report.sends_ok, report.deliveries, report.acks,
                  len(ledger.skipped), len(ledger.probes))
    deliveries = [e for e in entries if isinstance(e, Delivery)]
    by_id: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_id.setdefault(d.message_id, []).append(d)
    out.excused = report.excused
    out.violations += [f"{v}" + _where(ledger, by_id.get(v.message_id, []))
                       for v in report.violations]
    out.violations += check_load(entries)
    for d in _not_back(deliveries, ledger.skipped):
        out.violations.append(f"NOT_BACK id={d.message_id}: delivered at {d.at_ms} (lease "
                              f"{d.lease}, attempt {d.attempt}, at {ledger.where.get(d.lease)})"
                              ", never settled, never delivered again")
    margins = []
    for p in ledger.probes:
        if p.broker not in claims:
            continue
        by, claimed = claims[p.broker]
        margins.append(p.at_ms - claimed)
        if p.at_ms > claimed + CLOCK_NOISE_MS or p.start_ms > claimed:
            out.violations.append(
                f"OK_AFTER_TAKEOVER id={p.message_id}: {p.broker} answered OK at {p.at_ms} "
                f"(request begun at {p.start_ms}), {p.at_ms - claimed} ms after {by} claimed "
                f"its lease (claimed_ms {claimed})")
    out.closest_ok_to_claim_ms = max(margins) if margins else None
    kinds = (*VIOLATION_KINDS, "NOT_BACK", "OK_AFTER_TAKEOVER", *LOAD_KINDS)
    out.counts = {k: sum(v.startswith(k + " ") for v in out.violations) for k in kinds}
    return out


def _where(ledger: Ledger, ds: list[Delivery]) -> str:
    """Deliveries of one message (lease, attempt, time, queue/offset): evidence."""
    return "" if not ds else " | deliveries: " + "; ".join(
        f"{d.lease} attempt {d.attempt} at {d.at_ms} queue/offset {ledger.where.get(d.lease)}"
        for d in ds[:6])
