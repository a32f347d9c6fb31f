"""The due path's own cost: a hot instant delivered in process, the timer driven by hand.

``N`` delayed messages (100 B) are stored for one instant in a 4-queue topic; the timer
loads them into its wheel, the clock steps to just before the instant (so the wheel's
cascades happen before it, as they do in a running broker), then to the instant, and
``deliver_due`` runs until every copy is appended; the figures are the wall time and the
process's CPU time (every thread: timer, CommitLog writer, dispatcher) from the instant
until the dispatcher has reached the last copy.  No gRPC, no consumer, no other process:
an A/B of the due path's Python (run the old and the new code in turn, ``--repo``) that
the machine's scheduling noise moves far less than ``bench_timer.py --hot``.  The
garbage collector is set as ``chronomq serve`` sets it (``chronomq.collector``).

    .venv/bin/python bench/bench_due_path.py --messages 500000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def run_once(n: int) -> tuple[float, float]:
    from chronomq.broker import Broker
    from chronomq.config import BrokerConfig
    from store.clock import ManualClock
    from store.message import FLAG_DELAYED, Draft
    from store.store import StoreConfig
    from store.topics import Topic

    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        clock = ManualClock(1_800_000_000_000)
        broker = Broker(BrokerConfig(store=StoreConfig(os.path.join(tmp, "data"))), clock)
        broker.open()
        broker.start(timer_thread=False)
        try:
            broker.create_topic(Topic("hot", 4))
            now = clock.now_ms()
            due = now + 50_000
            sends = [broker.sender.send([Draft("", "hot", "", "", b"x" * 100, b"", now, due,
                                               FLAG_DELAYED, 0)
                                         for _ in range(i, min(n, i + 1000))])
                     for i in range(0, n, 1000)]
            for f in sends:
                f.result(120)
            assert broker.store.wait_visible(120)
            timer = broker.timer
            for at in (due - 5_000, due - 1):  # load, then the cascades before the instant
                clock.set(at)
                while not timer.load_due(at):
                    pass
                assert timer.deliver_due(at) == 0
            clock.set(due)
            wall, cpu = time.perf_counter(), time.process_time()
            delivered = 0
            while delivered < n:
                delivered += timer.deliver_due(due)
            assert broker.store.wait_visible(120)
            return time.perf_counter() - wall, time.process_time() - cpu
        finally:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="the checkout whose code runs (default: this one)")
    args = ap.parse_args()
    sys.path.insert(0, args.repo)
    # the collector as ``chronomq serve`` sets it; code before ``chronomq.collector`` left
    # CPython's (asked of the file: the editable install would find this checkout's module)
    if os.path.exists(os.path.join(args.repo, "chronomq", "collector.py")):
        from chronomq import collector
        collector.tune()
    else:
        print("(this checkout leaves the garbage collector as CPython sets it)")
    for r in range(args.rounds):
        wall, cpu = run_once(args.messages)
        print(f"round {r + 1}: {args.messages} due at one instant, all dispatched in "
              f"{wall:.2f} s wall, {cpu:.2f} s CPU ({args.messages / wall:,.0f} msgs/s; "
              f"{cpu / args.messages * 1e6:.2f} us CPU a message)", flush=True)


if __name__ == "__main__":
    main()
