"""Application code that sends, or takes and acks, one message at a time.

A broker (``chronomq serve``, default durable settings) runs as a subprocess; one client
process does each of these, one message per call in the application's code:

``unary_send``        ``client.send_one`` in a loop (one unary Send each)
``producer_sync``     ``producer.send(...).result()`` in a loop: waits for each answer
``producer_async``    ``producer.send(...)`` in a loop, the futures awaited at the end
``threads_sync``      ``--threads`` threads, each ``producer.send(...).result()`` in a loop
                      on one shared Producer (a web server's request threads)
``unary_pop_ack``     ``client.pop(max_messages=1)`` then ``client.ack`` per message
``consumer``          ``for m in Consumer(...): consumer.ack(m)`` (acks not awaited one by
                      one; all are durable at the end: ``close`` waits for them)
``consumer_sync``     the same with ``consumer.ack(m).result()`` per message

Prints messages per second for each (median of ``--rounds``) and the broker's CPU
microseconds per message.

    .venv/bin/python bench/bench_one_at_a_time.py [--messages 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_request_cost import cpu_s
from chronomq.client import ChronomqClient, message
from chronomq.client.consumer import Consumer
from chronomq.client.producer import Producer
from testkit.process import ServerProcess

BODY = b"x" * 200
SENDS = ("unary_send", "producer_sync", "producer_async", "threads_sync")
TAKES = ("unary_pop_ack", "consumer", "consumer_sync")


def fill(c: ChronomqClient, topic: str, n: int) -> None:
    for i in range(0, n, 500):
        assert all(o.ok for o in c.send([message(topic, BODY)] * min(500, n - i)))


def run_send(kind: str, c: ChronomqClient, topic: str, n: int, threads: int) -> None:
    if kind == "unary_send":
        for _ in range(n):
            c.send_one(topic, BODY)
        return
    with Producer(c) as p:
        if kind == "producer_sync":
            for _ in range(n):
                p.send(topic, BODY).result()
        elif kind == "producer_async":
            futures = [p.send(topic, BODY) for _ in range(n)]
            for f in futures:
                f.result()
        else:
            def loop() -> None:
                for _ in range(n // threads):
                    p.send(topic, BODY).result()
            ts = [threading.Thread(target=loop) for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()


def run_take(kind: str, c: ChronomqClient, topic: str, n: int) -> None:
    got = 0
    if kind == "unary_pop_ack":
        while got < n:
            for m in c.pop(topic, "g", max_messages=1, wait_ms=1000):
                assert c.ack("g", [m.receipt_handle]) == [""]
                got += 1
        return
    with Consumer(c, topic, "g") as consumer:
        for m in consumer:
            f = consumer.ack(m)
            if kind == "consumer_sync":
                f.result()
            got += 1
            if got == n:
                break
        assert consumer.flush(60)


def measure(srv: ServerProcess, c: ChronomqClient, n: int, body: Callable[[str], None],
            topic: str) -> tuple[float, float]:
    cpu0, t0 = cpu_s(srv.proc.pid), time.perf_counter()
    body(topic)
    wall, cpu = time.perf_counter() - t0, cpu_s(srv.proc.pid) - cpu0
    return n / wall, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--kinds", default=",".join(SENDS + TAKES))
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data")
        try:
            with ChronomqClient(srv.target) as c:
                for r in range(args.rounds):
                    for kind in kinds:
                        topic = f"{kind}-{r}"
                        c.create_topic(topic)
                        n = args.messages
                        if kind in TAKES:
                            fill(c, topic, n)
                            results[kind].append(measure(
                                srv, c, n, lambda t, k=kind, n=n: run_take(k, c, t, n), topic))
                        else:
                            n -= n % args.threads
                            results[kind].append(measure(
                                srv, c, n, lambda t, k=kind, n=n: run_send(
                                    k, c, t, n, args.threads), topic))
                        rate, cost = results[kind][-1]
                        print(f"round {r + 1} {kind:15s} {rate:9,.0f} msgs/s "
                              f"{cost:7,.0f} us broker CPU/msg", flush=True)
        finally:
            srv.terminate()
    print(f"\n{'kind':15s} {'msgs/s':>9s} {'broker us/msg':>14s}   "
          f"(median of {args.rounds}, {args.messages} messages each)")
    for kind in kinds:
        rate = statistics.median(x for x, _ in results[kind])
        cost = statistics.median(y for _, y in results[kind])
        print(f"{kind:15s} {rate:9,.0f} {cost:14,.0f}")


if __name__ == "__main__":
    main()
