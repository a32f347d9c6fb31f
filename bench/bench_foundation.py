"""Foundation figures: durable send throughput and pop+ack throughput over real gRPC.

Starts ``chronomq serve`` as a subprocess on 127.0.0.1 with its default durable settings
(flush = sync, group commit) in a temporary directory, drives it from separate client
processes, and prints one line per figure.

    .venv/bin/python bench/bench_foundation.py [--seconds 10] [--clients 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from testkit.process import ServerProcess

TOPIC = "bench"


def _stream_sender(target: str, per_request: int, body_bytes: int, seconds: float,
                   out: mp.Queue) -> None:  # type: ignore[type-arg]
    import grpc

    body = os.urandom(body_bytes // 2).hex().encode()[:body_bytes]
    request = pb.SendRequest(messages=[pb.OutgoingMessage(topic=TOPIC, body=body)
                                       for _ in range(per_request)])
    stop_at = time.monotonic() + seconds

    def requests():  # type: ignore[no-untyped-def]
        while time.monotonic() < stop_at:
            yield request

    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.BrokerStub(ch)
        sent = 0
        t0 = time.monotonic()
        for resp in stub.SendStream(requests()):
            sent += len(resp.results)
        out.put((sent, time.monotonic() - t0))


def _unary_sender(target: str, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    import grpc

    request = pb.SendRequest(messages=[pb.OutgoingMessage(topic=TOPIC, body=b"x" * 200)])
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.BrokerStub(ch)
        calls = 0
        t0 = time.monotonic()
        stop_at = t0 + seconds
        while time.monotonic() < stop_at:
            stub.Send(request)
            calls += 1
        out.put((calls, time.monotonic() - t0))


def _popper(target: str, group: str, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    with ChronomqClient(target) as c:
        got = 0
        t0 = time.monotonic()
        stop_at = t0 + seconds
        while time.monotonic() < stop_at:
            msgs = c.pop(TOPIC, group, max_messages=32, invisible_time_s=60)
            if not msgs:
                break
            c.ack(group, [m.receipt_handle for m in msgs])
            got += len(msgs)
        out.put((got, time.monotonic() - t0))


def _run(target: str, fn: object, n: int, *args: object) -> float:
    ctx = mp.get_context("spawn")  # forking a process that used gRPC is unsafe
    q = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(target, *args, q)) for _ in range(n)]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    count = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    return count / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data")
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=4)
            rate = _run(srv.target, _stream_sender, args.clients, 100, 200, args.seconds)
            print(f"send_stream_batch100_200B_msgs_per_s {rate:,.0f}  "
                  f"(SendStream, {args.clients} client processes, flush=sync)")
            rate = _run(srv.target, _stream_sender, args.clients, 1, 200, args.seconds)
            print(f"send_stream_single_msgs_per_s {rate:,.0f}  "
                  f"(SendStream, 1 message per request, pipelined, {args.clients} clients)")
            rate = _run(srv.target, _unary_sender, args.clients, args.seconds)
            print(f"send_unary_calls_per_s {rate:,.0f}  (unary Send, 1 message, "
                  f"{args.clients} clients)")
            with ChronomqClient(srv.target) as c:
                backlog = c.stats()["store.messages_appended"]
            rate = _run(srv.target, _popper, args.clients, "g1", args.seconds)
            print(f"pop_ack_batch32_msgs_per_s {rate:,.0f}  (unary Pop 32 + Ack, "
                  f"{args.clients} consumer processes, backlog {backlog:,.0f})")
        finally:
            srv.terminate()


if __name__ == "__main__":
    main()
