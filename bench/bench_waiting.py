"""Short calls while the broker holds many waiting calls (issue 17, "no starvation").

A broker subprocess (default settings) gets STREAMS idle Subscribe streams and POLLS
parked long polls (Pop with wait_ms 30 s, re-issued as they answer) from a helper process
over CONNECTIONS connections; then this process times PROBES calls each of Send (one
message), Stats and health Check, one at a time, and prints p50 / p99 / max per kind,
with the same figures measured before the waiting calls were opened.

    .venv/bin/python bench/bench_waiting.py                       # 1,000 + 1,000
    .venv/bin/python bench/bench_waiting.py --streams 100 --polls 100 --probes 200
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronomq.client import ChronomqClient, message
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from testkit.process import ServerProcess

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _waiters(target: str, streams: int, polls: int, connections: int, ready: Any,
             stop: Any) -> None:
    """Open the idle streams and parked long polls, keep them open until ``stop``."""
    channels = [grpc.insecure_channel(target, options=OWN_CONNECTION)
                for _ in range(connections)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]  # type: ignore[no-untyped-call]
    done = threading.Event()

    def idle() -> Iterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(topic="idle", group="g", invisible_time_s=30)
        done.wait()

    calls: list[Any] = [stubs[i % connections].Subscribe(idle()) for i in range(streams)]
    lock = threading.Lock()

    def park(i: int) -> None:
        if done.is_set():
            return
        f = stubs[i % connections].Pop.future(pb.PopRequest(
            topic="idle", group="p", max_messages=1, invisible_time_s=30, wait_ms=30_000),
            timeout=60)
        f.add_done_callback(lambda _f: park(i))
        with lock:
            calls.append(f)

    for i in range(polls):
        park(i)
    ready.set()
    stop.wait()
    done.set()
    for c in calls:
        c.cancel()
    for ch in channels:
        ch.close()


def _timed(n: int, call: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _line(kind: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"  {kind:<8} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   "
            f"max {ms[-1]:7.2f} ms")


def _probe(target: str, probes: int) -> list[str]:
    with ChronomqClient(target, timeout_s=30) as client, \
            grpc.insecure_channel(target, options=OWN_CONNECTION) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        return [
            _line("Send", _timed(probes, lambda: client.send([message("work", b"x")]))),
            _line("Stats", _timed(probes, client.stats)),
            _line("health", _timed(probes, lambda: health.Check(
                health_pb2.HealthCheckRequest(), timeout=30))),
        ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--polls", type=int, default=1000)
    ap.add_argument("--connections", type=int, default=12)
    ap.add_argument("--probes", type=int, default=500)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-waiting-") as tmp:
        server = ServerProcess(Path(tmp) / "data", "pop.max_wait_ms=30000")
        try:
            with ChronomqClient(server.target) as client:
                client.create_topic("idle")
                client.create_topic("work")
            print(f"waiting calls: none; {a.probes} calls of each kind, one at a time")
            print("\n".join(_probe(server.target, a.probes)))
            ctx = mp.get_context("spawn")
            ready, stop = ctx.Event(), ctx.Event()
            helper = ctx.Process(target=_waiters, args=(
                server.target, a.streams, a.polls, a.connections, ready, stop))
            helper.start()
            ready.wait(120)
            with ChronomqClient(server.target) as client:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    s = client.stats()
                    if (s["rpc.open_streams"] >= a.streams
                            and s["rpc.parked_long_polls"] >= a.polls):
                        break
                    time.sleep(0.5)
                print(f"waiting calls: {s['rpc.open_streams']:.0f} idle Subscribe streams, "
                      f"{s['rpc.parked_long_polls']:.0f} parked long polls over "
                      f"{a.connections} connections")
            print("\n".join(_probe(server.target, a.probes)))
            stop.set()
            helper.join(60)
        finally:
            t0 = time.monotonic()
            code = server.terminate()
            print(f"SIGTERM: exit {code} after {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
