"""POP consumption figures against ``chronomq serve`` (default durable settings).

1. throughput: N messages preloaded, then two consumer processes drain them over the
   Subscribe stream (ack per response, credit 1024), and again over unary Pop(32) + Ack;
2. latency: a producer sends RATE msgs/s (BATCH per request) for SECONDS while a
   subscriber receives; send-to-receipt p50/p99 (same machine clock);
3. revive precision: M messages leased with an invisible time of 2 s and never acked;
   a subscriber of the same group receives them again; lateness = receipt time - the
   lease's deadline (read from the receipt handle), never negative.

    .venv/bin/python bench/bench_pop.py --messages 300000 --revive 20000
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing as mp
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess


def _now_ms() -> float:
    return time.time_ns() / 1e6


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else -1.0


def _fill(target: str, topic: str, n: int) -> None:
    with ChronomqClient(target) as c:
        batches = ([message(topic, b"x" * 100) for _ in range(min(100, n - b))]
                   for b in range(0, n, 100))
        failed = sum(not o.ok for out in c.send_stream(batches) for o in out)
    if failed:
        raise SystemExit(f"{failed} sends failed")


def _subscriber(target: str, topic: str, total: int, done: Any, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Consume until all processes together received ``total``."""
    got = 0
    with ChronomqClient(target) as c:
        sub = c.subscribe(topic, "bench", 300, 1024)
        t0 = time.monotonic()
        finished = threading.Event()

        def watch() -> None:  # the stream may be idle when the others finish the total
            while done.value < total and not finished.wait(0.05):
                pass
            finished.set()
            sub.close()

        threading.Thread(target=watch, daemon=True).start()
        for r in sub.responses():
            if r.messages:
                got += len(r.messages)
                sub.ack([m.receipt_handle for m in r.messages])
                with done.get_lock():
                    done.value += len(r.messages)
            if finished.is_set() or done.value >= total:
                break
        elapsed = time.monotonic() - t0
        finished.set()
        sub.close()
        out.put((got, elapsed))


def _popper(target: str, topic: str, total: int, done: Any, out: mp.Queue) -> None:  # type: ignore[type-arg]
    got = 0
    with ChronomqClient(target) as c:
        t0 = time.monotonic()
        while done.value < total:
            ms = c.pop(topic, "bench-unary", 32, 300, wait_ms=200)
            if ms:
                c.ack("bench-unary", [m.receipt_handle for m in ms])
                got += len(ms)
                with done.get_lock():
                    done.value += len(ms)
        out.put((got, time.monotonic() - t0))


def _drain(target: str, topic: str, total: int, worker: object, procs: int) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    done = ctx.Value("q", 0)
    ps = [ctx.Process(target=worker, args=(target, topic, total, done, q))
          for _ in range(procs)]
    t0 = time.monotonic()
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    wall = time.monotonic() - t0
    for p in ps:
        p.join()
    got = sum(g for g, _ in results)
    slowest = max(s for _, s in results)
    print(f"    {got:,} msgs in {slowest:.2f} s of consuming ({wall:.2f} s with process "
          f"start): {got / slowest:,.0f} msgs/s")
    return got / slowest


def throughput(target: str, n: int) -> None:
    with ChronomqClient(target) as c:
        c.create_topic("tp", queue_count=4)
    _fill(target, "tp", n)
    print(f"pop+ack of {n:,} preloaded 100 B messages, 2 consumer processes:")
    print("  Subscribe stream (credit 1024, one ack request per response):")
    _drain(target, "tp", n, _subscriber, 2)
    print("  unary Pop (32) + Ack:")
    _drain(target, "tp", n, _popper, 2)


def latency(target: str, rate: int, seconds: int, batch: int) -> None:
    with ChronomqClient(target) as c:
        c.create_topic("lat", queue_count=4)
    lat: list[float] = []
    total = rate * seconds
    done = threading.Event()

    def consume() -> None:
        with ChronomqClient(target) as c, c.subscribe("lat", "bench", 60, 1024) as sub:
            ready.set()
            for r in sub.responses():
                now = _now_ms()
                lat.extend(now - struct.unpack(">d", m.body)[0] for m in r.messages)
                sub.ack([m.receipt_handle for m in r.messages])
                if len(lat) >= total:
                    break
        done.set()

    ready = threading.Event()
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    ready.wait(10)
    time.sleep(0.5)
    with ChronomqClient(target) as c:
        def paced():  # type: ignore[no-untyped-def]
            start = time.monotonic()
            for i in range(0, total, batch):
                wait = start + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                yield [message("lat", struct.pack(">d", _now_ms())) for _ in range(batch)]
        for _ in c.send_stream(paced()):
            pass
    done.wait(60)
    lat.sort()
    print(f"send-to-receipt over Subscribe, {rate}/s in sends of {batch} for {seconds} s: "
          f"received {len(lat):,}; p50 {_pct(lat, 0.5):.1f} ms, p99 {_pct(lat, 0.99):.1f} ms, "
          f"max {lat[-1] if lat else -1:.1f} ms")


def _expire_of(handle: str) -> int:
    """The lease deadline inside a receipt handle (layout in ``pop.handle``; read here
    without checking its MAC, for measurement only)."""
    raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    return int(struct.unpack_from(">Q", raw, 19)[0])


def revive(target: str, n: int) -> None:
    with ChronomqClient(target) as c:
        c.create_topic("rv", queue_count=4)
    _fill(target, "rv", n)
    deadline: dict[str, int] = {}
    with ChronomqClient(target) as c:
        while len(deadline) < n:  # lease everything for 2 s, over about a second
            for m in c.pop("rv", "bench", 32, 2):
                deadline[m.message_id] = _expire_of(m.receipt_handle)
    late: list[float] = []
    with ChronomqClient(target) as c, c.subscribe("rv", "bench", 300, 4096) as sub:
        for r in sub.responses():
            now = _now_ms()
            late.extend(now - deadline[m.message_id] for m in r.messages)
            sub.ack([m.receipt_handle for m in r.messages])
            if len(late) >= n:
                break
    late.sort()
    print(f"revive of {n:,} leases (2 s, never acked), receipt - deadline: "
          f"p50 {_pct(late, 0.5):.0f} ms, p99 {_pct(late, 0.99):.0f} ms, max {late[-1]:.0f} ms,"
          f" early {sum(x < 0 for x in late)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1, help="messages per send request")
    ap.add_argument("--revive", type=int, default=20_000)
    ap.add_argument("--only", choices=["throughput", "latency", "revive"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data")
        try:
            if args.only in (None, "throughput"):
                throughput(srv.target, args.messages)
            if args.only in (None, "latency"):
                latency(srv.target, args.rate, args.seconds, args.batch)
            if args.only in (None, "revive"):
                revive(srv.target, args.revive)
        finally:
            srv.terminate()


if __name__ == "__main__":
    main()
