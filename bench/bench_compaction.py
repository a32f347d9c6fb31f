"""The broker's own cost of compaction while it serves: send and Pop+Ack throughput with
its snapshots running and not, in turn.

One broker process with ``tier.upload`` on a local-directory tier holds PENDING delayed
messages due in hours (what every timer snapshot rewrites).  Then, for SECONDS, one
producer streams delayed messages due a second later (``SendStream``, batches of 100)
and CONSUMERS consumers Pop and Ack them as they fall due; then the producer stops and
the consumers take the rest: sends/s, Pop+Ack/s while sending and while draining, the
broker's CPU seconds, and the timer and journal snapshots it wrote meanwhile (counted
from its log).  Compaction on: ``tier.journal_snapshot_records = RECORDS`` (the
broker's default, 100,000: a timer snapshot every that many delayed and timer records,
or as many as it holds, if more); off: 0 (a journal snapshot at start only, never a
timer snapshot).  Pairs run in turn, each on a fresh broker; the figures that count are
the medians of the pairs.

    .venv/bin/python bench/bench_compaction.py --pending 500000 --seconds 60 --pairs 3
    .venv/bin/python bench/bench_compaction.py --quick      # 20k pending, 15 s, 1 pair
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess, wait_tier_caught_up

HOUR_MS = 3_600_000
TOPIC = "work"


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fill(c: ChronomqClient, pending: int) -> None:
    """``pending`` delayed messages due in 2-6 h (100 B bodies), the live state."""
    c.create_topic("far", queue_count=4)
    rnd = random.Random(7)
    left = pending

    def batches():  # type: ignore[no-untyped-def]
        nonlocal left
        while left > 0:
            n = min(500, left)
            left -= n
            yield [message("far", b"p" * 100, delay_ms=rnd.randrange(2 * HOUR_MS, 6 * HOUR_MS))
                   for _ in range(n)]
    sent = sum(sum(o.ok for o in out) for out in c.send_stream(batches()))
    assert sent == pending, f"{sent} of {pending} pending sends OK"


def run(root: Path, compaction: bool, records: int, pending: int, seconds: float,
        consumers: int) -> dict[str, float]:
    """One broker, filled, then served for ``seconds``: its figures."""
    data = root / ("on" if compaction else "off")
    b = ServerProcess(data, "tier.upload=true", "tier.provider=local",
                      f"tier.local_dir={data}-tier", "tier.broker_name=bench",
                      f"tier.journal_snapshot_records={records if compaction else 0}",
                      "server.retention_interval_s=5", log_level="INFO")
    try:
        with ChronomqClient(b.target, timeout_s=600) as c:
            _fill(c, pending)
            c.create_topic(TOPIC, queue_count=4)
            wait_tier_caught_up(c, timeout_s=600)
        before = len([line for line in b.output if "timer snapshot at" in line])
        stop, done = threading.Event(), threading.Event()
        sent, acked = [0], [0] * consumers

        def produce() -> None:
            with ChronomqClient(b.target, timeout_s=60) as pc:
                def batches():  # type: ignore[no-untyped-def]
                    while not stop.is_set():
                        yield [message(TOPIC, b"w" * 100, delay_ms=1000)] * 100
                for out in pc.send_stream(batches()):
                    sent[0] += sum(o.ok for o in out)

        def consume(i: int) -> None:
            with ChronomqClient(b.target, timeout_s=60) as cc:
                while not done.is_set():
                    try:
                        got = cc.pop(TOPIC, "g", 32, 60, wait_ms=500)
                    except RpcError:
                        continue
                    if got:
                        cc.ack("g", [m.receipt_handle for m in got])
                        acked[i] += len(got)
        producer = threading.Thread(target=produce)
        workers = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
        cpu0, t0 = _cpu_s(b.proc.pid), time.monotonic()
        for t in (producer, *workers):
            t.start()
        time.sleep(seconds)
        stop.set()
        producer.join(120)
        send_s = time.monotonic() - t0
        acked_then, t1 = sum(acked), time.monotonic()
        while sum(acked) < sent[0] and time.monotonic() - t1 < 600:  # the rest, due by now
            time.sleep(0.05)
        drain_s = time.monotonic() - t1
        done.set()
        for t in workers:
            t.join(120)
        cpu = _cpu_s(b.proc.pid) - cpu0
        snapshots = len([line for line in b.output if "timer snapshot at" in line]) - before
        journal = len([line for line in b.output if "journal snapshot at" in line])
        assert sum(acked) >= sent[0], f"{sum(acked)} of {sent[0]} consumed"
    finally:
        b.terminate()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(f"{data}-tier", ignore_errors=True)
    return {"sends/s": sent[0] / send_s, "pop+ack/s while sending": acked_then / send_s,
            "pop+ack/s draining": (sum(acked) - acked_then) / max(drain_s, 1e-9),
            "cpu s": cpu, "timer snapshots": snapshots, "journal snapshots": journal}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", type=int, default=500_000)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--records", type=int, default=100_000,
                   help="tier.journal_snapshot_records with compaction on")
    p.add_argument("--quick", action="store_true", help="20k pending, 15 s, 1 pair")
    args = p.parse_args()
    if args.quick:
        args.pending, args.seconds, args.pairs, args.records = 20_000, 15.0, 1, 10_000
    root = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    print(f"{args.pending:,} pending far-future delayed messages; {args.seconds:.0f} s of "
          f"delayed sends due 1 s later, {args.consumers} consumers; compaction on: "
          f"tier.journal_snapshot_records={args.records}, off: 0; {args.pairs} pair(s) "
          "in turn", flush=True)
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        for i in range(args.pairs):
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                r = run(root, on, args.records, args.pending, args.seconds, args.consumers)
                rows[on].append(r)
                print(f"pair {i + 1}, compaction {'on ' if on else 'off'}: "
                      + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("medians:")
    for key in ("sends/s", "pop+ack/s while sending", "pop+ack/s draining", "cpu s",
                "timer snapshots"):
        with_, without = (statistics.median(r[key] for r in rows[x]) for x in (True, False))
        ratio = f"  on/off {with_ / without:.2f}x" if without else ""
        print(f"  {key:24} on {with_:10,.1f}   off {without:10,.1f}{ratio}")


if __name__ == "__main__":
    main()
