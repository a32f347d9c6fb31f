"""Recurring schedules at scale against ``chronomq serve`` (default durable settings).

SCHEDULES schedules each fire every minute (``* * * * *``) into one topic for MINUTES
minutes; one Subscribe consumer takes and acks the ticks.  Lateness of a tick = its
receipt at the consumer - its tick time (from its id ``<name>@<tick ms>``); never
negative.  Then the broker's CPU (user + system, from ``/proc/<pid>/stat``) and RSS over
the same minutes, against a broker with the same consumer and no schedules, in turn.

    .venv/bin/python bench/bench_schedules.py
    .venv/bin/python bench/bench_schedules.py --schedules 1000 --minutes 1
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient
from testkit.process import ServerProcess

TOPIC = "ticks"
TICK_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _first_late(stats: dict[str, float]) -> int:
    """The timer's lateness bucket (ms) holding its 99th percentile."""
    bounds = sorted((int(k.split("_le_")[1][:-2]), v) for k, v in stats.items()
                    if k.startswith("timer.lateness_le_"))
    total, seen = sum(v for _, v in bounds), 0.0
    for bound, count in bounds:
        seen += count
        if seen >= 0.99 * total:
            return bound
    return -1


def run(tmp: Path, schedules: int, minutes: int) -> None:
    srv = ServerProcess(tmp / f"data-{schedules}")
    try:
        with ChronomqClient(srv.target, timeout_s=30) as c:
            c.create_topic(TOPIC, queue_count=4)
            t0 = time.monotonic()
            for i in range(schedules):
                c.create_schedule(f"s{i:05d}", TOPIC, b"tick", cron="* * * * *")
            if schedules:
                print(f"  created {schedules:,} schedules in {time.monotonic() - t0:.1f} s",
                      flush=True)
            # measure whole minutes, from just after the next minute's ticks
            now = time.time()
            start_at = (int(now // 60) + 1) * 60 + 0.5
            late: list[float] = []
            stop = threading.Event()

            def consume() -> None:
                with c.subscribe(TOPIC, "bench", invisible_time_s=60,
                                 max_outstanding=4096) as sub:
                    for r in sub.responses():
                        got = time.time() * 1000
                        late.extend(got - int(m.message_id.rsplit("@", 1)[1])
                                    for m in r.messages)
                        sub.ack([m.receipt_handle for m in r.messages])
                        if stop.is_set():
                            return

            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            time.sleep(max(0.0, start_at - time.time()))
            late.clear()  # the first minute's may include the creation
            cpu0, wall0 = _cpu_s(srv.proc.pid), time.monotonic()
            rss = [_rss_mb(srv.proc.pid)]
            end_at = start_at + minutes * 60
            while time.time() < end_at:
                time.sleep(1)
                rss.append(_rss_mb(srv.proc.pid))
            cpu = (_cpu_s(srv.proc.pid) - cpu0) / (time.monotonic() - wall0)
            time.sleep(2)  # the last minute's ticks
            stop.set()
            got = sorted(late)
            if got:
                print(f"  {len(got):,} ticks received ({minutes} minute(s) of "
                      f"{schedules:,}): lateness p50 {got[len(got) // 2]:.1f} ms, p99 "
                      f"{got[int(len(got) * 0.99)]:.1f} ms, max {got[-1]:.1f} ms, early "
                      f"{sum(1 for x in got if x < 0)}", flush=True)
            print(f"  broker CPU {cpu * 100:.1f} % of a core, RSS {min(rss):.0f}-"
                  f"{max(rss):.0f} MB", flush=True)
            stats = c.stats()
            if schedules:
                print(f"  the last step sent its ticks in "
                      f"{stats['schedules.last_step_seconds'] * 1000:.0f} ms (a second "
                      f"ahead of them); the timer appended them <= {_first_late(stats)} ms "
                      f"late at p99", flush=True)
    finally:
        srv.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--minutes", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        for n in (args.schedules, 0):
            print(f"{n:,} schedules firing every minute:", flush=True)
            run(Path(tmp), n, args.minutes)


if __name__ == "__main__":
    main()
