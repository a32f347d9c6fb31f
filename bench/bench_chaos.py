"""kill -9 chaos, long mode: the scenario of ``tests/chronomq/test_chaos.py`` with more
cycles, 3-10 s of work between kills and far delays of 5-20 s, once per seed.

Prints per seed what the ledger checker counted (sends answered OK, deliveries, acks,
and each kind of violation of the durability contract) and the restart times (process
start until it listens), then the first violations as evidence.

    .venv/bin/python bench/bench_chaos.py --cycles 20 --seeds 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chronomq.test_chaos import ChaosPlan, ChaosResult, run_chaos


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(seed: int, result: ChaosResult, seconds: float) -> str:
    r, restarts = result.report, result.restart_s
    return (f"seed {seed}: sends OK {r.sends_ok:,}, deliveries {r.deliveries:,}, acks "
            f"{r.acks:,}; lost {r.count('LOST')}, redelivered-after-ack "
            f"{r.count('REDELIVERED_AFTER_ACK')}, leases broken {r.count('LEASE_BROKEN')}, "
            f"early {r.count('EARLY')}, unexpected {r.count('UNEXPECTED')}, corrupt "
            f"{r.count('CORRUPT')}; restart p50 {statistics.median(restarts):.2f} s, p99 "
            f"{_quantile(restarts, 0.99):.2f} s, max {max(restarts):.2f} s "
            f"({len(restarts)} restarts); SIGTERM exit {result.exit_code}; {seconds:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N, one run each")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep each run's data and ledgers")
    args = ap.parse_args()
    clean = True
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        workdir = Path(tempfile.mkdtemp(prefix=f"chronomq-chaos-{seed}-"))
        t0 = time.monotonic()
        result = run_chaos(workdir, ChaosPlan.long(seed, args.cycles),
                           say=lambda text: print(f"  {text}", file=sys.stderr))
        print(_line(seed, result, time.monotonic() - t0), flush=True)
        if (not result.report.ok or result.exit_code or result.worker_errors
                or result.rpc_errors):
            clean = False
            print("  " + result.evidence(20).replace("\n", "\n  "), flush=True)
        if args.keep or not result.report.ok:
            print(f"  data and ledgers kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
