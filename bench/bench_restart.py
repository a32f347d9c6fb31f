"""Restart time and memory with many pending timers.

Schedules N messages 1-30 days ahead, reports the broker's RSS and data size, then stops
it (SIGTERM) and measures how long a restart takes until it serves again, and the RSS
after the restart.

    .venv/bin/python bench/bench_restart.py --messages 1000000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess

DAY_MS = 86_400_000


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or at its peak so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return -1.0


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    args = ap.parse_args()
    rnd = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        data = Path(tmp) / "data"
        tier = Path(tmp) / "chronomq-tier"  # the default: beside the data directory
        srv = ServerProcess(data)
        with ChronomqClient(srv.target) as c:
            c.create_topic("far", queue_count=4)
            now = time.time_ns() // 1_000_000
            t0 = time.monotonic()
            batches = ([message("far", b"x" * 100,
                                deliver_at_ms=now + DAY_MS + rnd.randrange(29 * DAY_MS))
                        for _ in range(min(100, args.messages - b))]
                       for b in range(0, args.messages, 100))
            failed = sum(not o.ok for out in c.send_stream(batches) for o in out)
            sent_s = time.monotonic() - t0
            while True:  # until dispatched and every parked record is on the tier
                stats = c.stats()
                if not stats["store.dispatch_lag_bytes"] and not stats["timer.parked_unwritten"]:
                    break
                time.sleep(0.2)
            settled_s = time.monotonic() - t0
        print(f"scheduled {args.messages:,} messages 1-30 days ahead in {sent_s:.1f} s, all "
              f"on the tier after {settled_s:.1f} s ({failed} failed); TimerFlatFile objects "
              f"{stats['timer.flat_objects']:,.0f} "
              f"in {stats['timer.flat_buckets']:,.0f} hourly buckets")
        print(f"broker RSS {_rss_mb(srv.proc.pid):.0f} MB "
              f"(peak {_rss_mb(srv.proc.pid, 'VmHWM'):.0f} MB); local data dir "
              f"{_du_mb(data):.0f} MB; tier (local directory) {_du_mb(tier):.0f} MB")
        srv.terminate()
        t0 = time.monotonic()
        srv = ServerProcess(data)
        restart_s = time.monotonic() - t0
        with ChronomqClient(srv.target) as c:
            buckets = c.stats()["timer.flat_buckets"]
        print(f"restart until serving: {restart_s:.2f} s (process start included); "
              f"RSS after restart {_rss_mb(srv.proc.pid):.0f} MB; buckets {buckets:,.0f}")
        srv.terminate()


if __name__ == "__main__":
    main()
