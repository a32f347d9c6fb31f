"""Timer lateness: messages due uniformly at RATE msgs/s for SECONDS, end to end.

Starts ``chronomq serve`` (default durable settings) on 127.0.0.1, sends every message
ahead of time with ``deliver_at_ms`` spaced evenly, and has consumer processes receive
them over the Subscribe stream (or, with ``--api pop``, long-poll Pop (32 per call) and
Ack).  Lateness = consumer receive time - deliver_at_ms.  Also prints the broker's own
lateness (append time - deliver_at_ms) from Stats.

    .venv/bin/python bench/bench_timer.py --rate 2000 --seconds 10
    .venv/bin/python bench/bench_timer.py --hot 200000      # all due at one instant
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess

TOPIC = "due"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _consumer(target: str, total: int, stop_at: float, api: str, done: Any,
              out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Receive until all consumers together have ``total`` (or ``stop_at`` passes)."""
    late: list[int] = []

    def count(n: int) -> None:
        with done.get_lock():
            done.value += n

    with ChronomqClient(target) as c:
        if api == "subscribe":
            sub = c.subscribe(TOPIC, "bench", 300, 2048)
            finished = threading.Event()

            def watch() -> None:  # an idle stream is closed once the others are done
                while done.value < total and time.time() < stop_at:
                    if finished.wait(0.05):
                        break
                sub.close()

            threading.Thread(target=watch, daemon=True).start()
            for r in sub.responses():
                now = _now_ms()
                late.extend(now - m.deliver_at_ms for m in r.messages)
                if r.messages:
                    sub.ack([m.receipt_handle for m in r.messages])
                    count(len(r.messages))
            finished.set()
            out.put(late)
            return
        while time.time() < stop_at and done.value < total:
            got = c.pop(TOPIC, "bench", max_messages=32, invisible_time_s=300, wait_ms=500)
            now = _now_ms()
            late.extend(now - m.deliver_at_ms for m in got)
            if got:
                c.ack("bench", [m.receipt_handle for m in got])
                count(len(got))
    out.put(late)


def _pct(xs: list[int], p: float) -> int:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else -1


def _report_hot(target: str, total: int, due_ms: int) -> None:
    """Wait until the timer has delivered all ``total`` messages; report when the last
    one became consumable (its append) relative to their common due time."""
    marks = [0.0, 0.1, 0.5, 0.9]  # share delivered -> when first seen
    seen: list[str] = []
    with ChronomqClient(target) as c:
        while True:
            stats = c.stats()
            done = stats["timer.delivered"]
            while marks and done > marks[0] * total:
                seen.append(f"{marks.pop(0):.0%} at {_now_ms() - due_ms:+d} ms")
            if done >= total or _now_ms() > due_ms + 120_000:
                break
            time.sleep(0.05)
    last = int(stats["timer.last_delivery_ms"])
    print(f"hot second: {int(stats['timer.delivered'])} of {total} messages due at one "
          f"instant; all consumable {last - due_ms} ms after it "
          f"(first batch appended <= {_first_bound(stats)} ms late; delivered past "
          f"{', '.join(seen)})")
    print(_gc_line(stats))


def _gc_line(stats: dict[str, float]) -> str:
    """The broker's garbage collections (Stats ``gc.*``; code before them had none)."""
    if "gc.pause_seconds" not in stats:
        return "  broker gc: no figures"
    return (f"  broker gc: {int(stats['gc.collections_young'])} young, "
            f"{int(stats['gc.collections_middle'])} middle, "
            f"{int(stats['gc.collections_full'])} full collections; "
            f"{stats['gc.pause_seconds']:.2f} s paused, longest "
            f"{stats['gc.longest_pause_s'] * 1000:.1f} ms; "
            f"{int(stats['gc.collected_objects'])} objects freed by them")


def _first_bound(stats: dict[str, float]) -> int:
    bounds = sorted((int(k.split("_le_")[1][:-2]), v) for k, v in stats.items()
                    if k.startswith("timer.lateness_le_"))
    return next((b for b, v in bounds if v), -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--hot", type=int, default=0, help="N messages all due at one instant")
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--api", choices=["subscribe", "pop"], default="subscribe",
                    help="consumers use the Subscribe stream or unary Pop(32) + Ack")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting (e.g. tier.upload=true --set "
                         "tier.durable_ack=true: durable-ack on a local-directory tier)")
    args = ap.parse_args()
    total = args.hot or args.rate * args.seconds
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data", *args.set)
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=4)
                lead_ms = 5000 + total // 25  # time to send everything first
                t0 = _now_ms() + lead_ms
                step = 0.0 if args.hot else 1000 / args.rate
                batches = ([message(TOPIC, b"x" * 100, deliver_at_ms=t0 + int(i * step))
                            for i in range(b, min(b + 100, total))]
                           for b in range(0, total, 100))
                failed = sum(not o.ok for out in c.send_stream(batches) for o in out)
                if failed:
                    raise SystemExit(f"{failed} sends failed")
                if _now_ms() > t0:
                    print(f"warning: sending took longer than the lead ({lead_ms} ms)")
            if args.hot:
                _report_hot(srv.target, total, t0)
                return
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            done = ctx.Value("q", 0)
            stop_at = time.time() + lead_ms / 1000 + args.seconds + 60
            procs = [ctx.Process(target=_consumer,
                                 args=(srv.target, total, stop_at, args.api, done, q))
                     for _ in range(args.consumers)]
            for p in procs:
                p.start()
            lateness: list[int] = []
            for _ in procs:
                lateness += q.get()
            for p in procs:
                p.join()
            with ChronomqClient(srv.target) as c:
                stats = c.stats()
            lateness.sort()
            drained_ms = lateness[-1] if lateness else -1
            label = f"hot second {total}" if args.hot else f"{args.rate}/s for {args.seconds} s"
            api = "Subscribe" if args.api == "subscribe" else "Pop 32 + Ack"
            print(f"timer lateness, {label}, {args.consumers} consumers ({api}):")
            print(f"  received {len(lateness)} of {total}; early {sum(x < 0 for x in lateness)}")
            print(f"  end-to-end lateness ms: p50 {_pct(lateness, 0.5)}  "
                  f"p99 {_pct(lateness, 0.99)}  max {drained_ms}")
            bounds = sorted((int(k.split("_le_")[1][:-2]), v) for k, v in stats.items()
                            if k.startswith("timer.lateness_le_"))
            hist = "  ".join(f"<={b}ms:{int(v)}" for b, v in bounds if v)
            print(f"  broker append lateness histogram: {hist}  "
                  f">5000ms:{int(stats['timer.lateness_over_5000ms'])}")
            print(_gc_line(stats))
        finally:
            srv.terminate()


if __name__ == "__main__":
    main()
