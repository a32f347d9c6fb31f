"""RocketMQ front figures: what official RocketMQ 5 clients get from chronomq.

Starts ``chronomq serve`` with the RocketMQ front on (default durable settings) in a
temporary directory and measures, each from separate client processes:

- SendMessage with the generated stub, 100 messages of 200 B per request (the front's
  own cost per message; compare bench_foundation's SendStream figure);
- the official Python Producer, ``send_async`` with a window of requests in flight (the
  client sends one message per request);
- the official Python SimpleConsumer draining the backlog: receive 32, ack each;
- the official Node.js client (when node is installed; ``npm ci`` in
  tests/rocketmq/nodejs first): Producer with 256 sends in flight, SimpleConsumer with 4
  receive loops acking every message.

A first line measures Heartbeat, a call that does nothing: the per-call floor.
Each line also gives the broker's CPU time per message (user + system, from /proc), which
tells the front's cost apart from the client's: the clients share the machine's 2 cores.

    .venv/bin/python bench/bench_rocketmq.py [--seconds 10] [--clients 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient
from testkit.process import ServerProcess

TOPIC = "bench"
ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / "tests" / "rocketmq" / "nodejs" / "node_modules"
WINDOW = 256  # Producer.send_async futures in flight per process


def _stub_sender(target: str, seconds: float, out: Any) -> None:
    import grpc

    from chronomq.rocketmq.pb import definition as rd
    from chronomq.rocketmq.pb import service as rs
    from chronomq.rocketmq.pb import service_grpc

    seq = 0
    sent = 0
    with grpc.insecure_channel(target) as ch:
        stub = service_grpc.MessagingServiceStub(ch)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            messages = []
            for _ in range(100):
                seq += 1
                messages.append(rd.Message(
                    topic=rd.Resource(name=TOPIC), body=b"x" * 200,
                    system_properties=rd.SystemProperties(
                        message_id=f"{id(out):x}-{seq}", message_type=rd.NORMAL,
                        body_encoding=rd.IDENTITY)))
            r = stub.SendMessage(rs.SendMessageRequest(messages=messages))
            assert r.status.code == rd.OK, r.status
            sent += len(r.entries)
        out.put((sent, time.monotonic() - t0))


def _heartbeats(target: str, seconds: float, out: Any) -> None:
    """The floor: a call that does nothing, from 16 threads."""
    import threading

    import grpc

    from chronomq.rocketmq.pb import service as rs
    from chronomq.rocketmq.pb import service_grpc

    counts = [0] * 16

    def lane(i: int) -> None:
        with grpc.insecure_channel(target) as ch:
            stub = service_grpc.MessagingServiceStub(ch)
            while time.monotonic() - t0 < seconds:
                stub.Heartbeat(rs.HeartbeatRequest())
                counts[i] += 1

    t0 = time.monotonic()
    lanes = [threading.Thread(target=lane, args=(i,)) for i in range(len(counts))]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    out.put((sum(counts), time.monotonic() - t0))


def _producer(target: str, seconds: float, out: Any) -> None:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    p = Producer(ClientConfiguration(target, Credentials()), (TOPIC,))
    p.startup()
    try:
        sent = 0
        pending: list[Any] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            m = Message()
            m.topic = TOPIC
            m.body = b"x" * 200
            pending.append(p.send_async(m))
            if len(pending) >= WINDOW:
                pending.pop(0).result()
                sent += 1
        for f in pending:
            f.result()
            sent += 1
        out.put((sent, time.monotonic() - t0))
    finally:
        p.shutdown()


def _consumer(target: str, seconds: float, out: Any) -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    c = SimpleConsumer(ClientConfiguration(target, Credentials()), "bench",
                       {TOPIC: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        done = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            got = c.receive(32, 30)
            if not got:
                break
            for m in got:
                c.ack(m)
            done += len(got)
        out.put((done, time.monotonic() - t0))
    finally:
        c.shutdown()


def _run(fn: Any, target: str, n: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(target, seconds, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(count for count, _ in results) / max(t for _, t in results)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _node(mode: str, target: str, seconds: float) -> float:
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    out = subprocess.run(["node", str(ROOT / "bench" / "rocketmq_node.js"), mode, target,
                          TOPIC, str(seconds)], env=env, check=True, capture_output=True,
                         text=True, timeout=seconds + 120)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return float(r["count"]) / float(r["seconds"])


def _figure(srv: ServerProcess, name: str, what: str, measure: Any) -> None:
    """Run ``measure`` (returns msgs/s), print it with the broker's CPU per message."""
    cpu0, t0 = _cpu_s(srv.proc.pid), time.monotonic()
    rate = measure()
    cpu, wall = _cpu_s(srv.proc.pid) - cpu0, time.monotonic() - t0
    per_msg_us = cpu / max(rate * wall, 1) * 1e6
    print(f"{name} {rate:,.0f} msgs/s  broker CPU {per_msg_us:,.0f} us/msg "
          f"({cpu / wall:.0%} of a core)  ({what})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=2)
    args = ap.parse_args()
    n, secs = args.clients, args.seconds
    node = shutil.which("node") is not None and NODE_MODULES.exists()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data", "rocketmq.enabled=true", "rocketmq.port=0")
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=4)
            rmq = srv.rocketmq_target
            _figure(srv, "rocketmq_heartbeat_calls", f"Heartbeat, generated stub, 16 threads "
                    f"x {n} processes: the cost of a call (calls/s, CPU per call)",
                    lambda: _run(_heartbeats, rmq, n, secs))
            _figure(srv, "rocketmq_send_batch100_200B", f"SendMessage, generated stub, "
                    f"{n} client processes, flush=sync",
                    lambda: _run(_stub_sender, rmq, n, secs))
            _figure(srv, "rocketmq_python_producer", f"official Python Producer.send_async, "
                    f"window {WINDOW}, {n} processes",
                    lambda: _run(_producer, rmq, n, secs))
            if node:
                _figure(srv, "rocketmq_node_producer", "official Node.js Producer, 256 sends "
                        "in flight, 1 process", lambda: _node("produce", rmq, secs))
            with ChronomqClient(srv.target) as c:
                backlog = c.stats()["store.messages_appended"]
            _figure(srv, "rocketmq_python_simple_consumer", f"official Python "
                    f"SimpleConsumer, receive 32 + ack each, {n} processes, backlog "
                    f"{backlog:,.0f}", lambda: _run(_consumer, rmq, n, secs))
            if node:
                _figure(srv, "rocketmq_node_simple_consumer", "official Node.js "
                        "SimpleConsumer, 4 receive loops of 32, acks in parallel, 1 process",
                        lambda: _node("consume", rmq, secs))
            if not node:
                print("(Node.js figures skipped: node or tests/rocketmq/nodejs/node_modules "
                      "missing; run npm ci there)")
        finally:
            srv.terminate()


if __name__ == "__main__":
    main()
