"""Failover chaos: four brokers with ``tier.failover`` and ``tier.durable_ack`` on one
bucket of a real S3 server (SeaweedFS; ``--s3 moto`` for moto's), one topic created on
each of three, producers, consumers, a schedule ticking every second and debounced
sends per topic through the client library with a ledger; each cycle takes the broker
serving one topic (in turn), creates, fills, drains and deletes a topic there, then
applies a fault of one kind (in turn):

    kill9-restart-now    kill -9, started again at once with its data directory
    kill9-restart-late   kill -9, started again with it after 1-2 leases
    kill9-wipe           kill -9, data directory deleted; its old name rejoins
    sigstop              SIGSTOP for 1-3 leases, then SIGCONT
    cut-s3               its S3 stalled or reset by a proxy for 1.5-3 leases
    slow-s3-watcher      a watcher's S3 at 2-5 s a request for 2-3 leases
    kill9-taker          kill -9, and of its taker at its claim (data gone)
    clock-ahead          restarted 30 s ahead (libfaketime), then kill -9
    restart-same-name    kill -9, restarted under its name after the claim: rejoins

(``testkit/chaos/faults.py`` says what each expects.)  Prints a line per cycle with the
unavailability of the victim's topics (from the fault to the first OK of a send begun
after it), then p50/p99/max per kind and the ledger's checks: 0 sends answered OK lost,
0 delivered again after an OK ack, 0 delivered before their time, every message left
unsettled delivered again, 0 OKs from a broker after its successor claimed its lease,
no life taken over resumed, no tick of a schedule missing or delivered after its ack,
no replaced body delivered, no deleted topic back.  Exits 1 on any violation (the run's
directory keeps ledger.jsonl and every broker's log).

    .venv/bin/python bench/bench_failover.py --cycles 30 --lease-s 10
    .venv/bin/python bench/bench_failover.py --cycles 3 --lease-s 3 --kinds sigstop,cut-s3
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.chaos.faults import KINDS
from testkit.chaos.run import Plan, Result, run


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (of 20 values, p99 is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def report(plan: Plan, result: Result, took_s: float) -> list[str]:
    lines = [f"\n{len(result.faults)} faults, tier.lease_s = {plan.lease_s:g}, {plan.s3}, "
             f"{took_s / 60:.1f} min; unavailability of the victim's topics (s):",
             f"  {'kind':20s} {'n':>3s} {'p50':>7s} {'p99':>7s} {'max':>7s}"]
    for kind in plan.kinds:
        gaps = result.gaps(kind)
        if gaps:
            lines.append(f"  {kind:20s} {len(gaps):3d} {statistics.median(gaps):7.2f} "
                         f"{percentile(gaps, 0.99):7.2f} {gaps[-1]:7.2f}")
    o = result.outcome
    if o is not None:
        closest = ("none" if o.closest_ok_to_claim_ms is None
                   else f"{o.closest_ok_to_claim_ms} ms")
        lines += [
            f"ledger: sends attempted {o.sends_attempted}, answered OK {o.sends_ok} "
            f"(probes OK {o.probes_ok}); deliveries {o.deliveries}, acks OK {o.acks}, "
            f"left unsettled {o.skipped}; drain {o.drain_s:.1f} s",
            "checks: " + ", ".join(f"{k} {n}" for k, n in o.counts.items())
            + f"; excused by a broker's clock ahead: {o.excused}",
            f"latest OK of a taken-over broker relative to its claim: {closest}"]
    if result.send_s:
        lines.append(f"one unary Send (RoutedClient, durable-ack), OK ones: p50 "
                     f"{1000 * statistics.median(result.send_s):.0f} ms, p99 "
                     f"{1000 * percentile(result.send_s, 0.99):.0f} ms")
    lines.append("not OK along the way (refused, timed out; not counted): " + (", ".join(
        f"{k} {n}" for k, n in sorted(result.errors.items())) or "none"))
    lines.append(f"violations: {len(result.violations)}")
    lines += [f"  {v}" for v in result.violations[:50]]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=30)
    p.add_argument("--lease-s", type=float, default=10.0)
    p.add_argument("--s3", choices=("seaweed", "moto"), default="seaweed")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated, of: {', '.join(KINDS)}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-level", default="WARNING",
                   help="the brokers' log level (INFO: every takeover step, in logs/)")
    args = p.parse_args()
    plan = Plan(args.cycles, args.lease_s, tuple(k for k in args.kinds.split(",") if k),
                args.seed, args.s3, log_level=args.log_level)
    started = time.monotonic()
    result = run(plan, say=lambda line: print(line, flush=True))
    for line in report(plan, result, time.monotonic() - started):
        print(line)
    print(f"run directory (ledger.jsonl, logs/): {result.root}")
    sys.exit(1 if result.violations else 0)


if __name__ == "__main__":
    main()
