"""Server CPU per single-message request: chronomq against a bare grpcio server.

The floor is what gRPC in Python costs by itself: a bare threaded grpcio server (the
kind chronomq runs, same thread pool size) that decodes the same request messages and
answers with responses of the same shape and size, doing nothing else.  chronomq does
the same calls with its default durable settings (each Send answered after fsync, each
Pop's lease written to RocksDB with sync).  One client process makes the calls one after
another (the case where nothing can be batched); the server's CPU time (user + system,
from /proc/PID/stat) is divided by the calls made.

Kinds of call:

``unary_send``   Send with one 200 B message, one call at a time
``stream_send``  one message per SendRequest on one SendStream, ``--window`` in flight
``pop_ack``      Pop of one message, then Ack of its handle (two calls per message)

    .venv/bin/python bench/bench_request_cost.py [--calls 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from testkit.process import ServerProcess

TOPIC, GROUP = "cost", "g"
BODY = b"x" * 200
KINDS = ("unary_send", "stream_send", "pop_ack")
HANDLE = "h" * 120  # about the size of a chronomq receipt handle


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the bare server

def _received() -> pb.ReceivedMessage:
    return pb.ReceivedMessage(message_id="0" * 32, topic=TOPIC, queue_id=0, queue_offset=1,
                              body=BODY, born_at_ms=1, deliver_at_ms=1, delivery_attempt=1,
                              receipt_handle=HANDLE)


class EchoBroker(pb_grpc.BrokerServicer):
    """Answers without doing anything: the cost of gRPC and protobuf alone."""

    def Send(self, request: pb.SendRequest, context: Any) -> pb.SendResponse:
        return pb.SendResponse(results=[pb.SendResult(message_id="0" * 32, deliver_at_ms=1)
                                        for _ in request.messages])

    def SendStream(self, request_iterator: Iterator[pb.SendRequest],
                   context: Any) -> Iterator[pb.SendResponse]:
        for request in request_iterator:
            yield self.Send(request, context)

    def Pop(self, request: pb.PopRequest, context: Any) -> pb.PopResponse:
        return pb.PopResponse(messages=[_received()])

    def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        return pb.AckResponse(results=[pb.AckResult() for _ in request.receipt_handles])


def serve_echo(port_file: str, workers: int) -> None:
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    pb_grpc.add_BrokerServicer_to_server(EchoBroker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(port_file).write_text(str(port))
    server.wait_for_termination()


# ---------------------------------------------------------------- the client

def client(kind: str, target: str, calls: int, window: int, out: Any) -> None:
    import grpc

    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.BrokerStub(ch)
        send = pb.SendRequest(messages=[pb.OutgoingMessage(topic=TOPIC, body=BODY)])
        for _ in range(20):  # warm the channel
            stub.Send(send)
        out.put("ready")
        time.sleep(0.5)  # the parent reads the server's CPU time now
        t0 = time.monotonic()
        if kind == "unary_send":
            for _ in range(calls):
                stub.Send(send)
        elif kind == "stream_send":
            import queue
            import threading
            credits = threading.Semaphore(window)
            requests: queue.SimpleQueue[pb.SendRequest | None] = queue.SimpleQueue()

            def feed() -> None:
                for _ in range(calls):
                    credits.acquire()
                    requests.put(send)
                requests.put(None)
            threading.Thread(target=feed, daemon=True).start()
            for _ in stub.SendStream(iter(requests.get, None)):
                credits.release()
        else:
            pop = pb.PopRequest(topic=TOPIC, group=GROUP, max_messages=1, invisible_time_s=60)
            for _ in range(calls // 2):
                got = stub.Pop(pop)
                stub.Ack(pb.AckRequest(group=GROUP, receipt_handles=[
                    m.receipt_handle for m in got.messages]))
        out.put(time.monotonic() - t0)


def measure(kind: str, target: str, pid: int, calls: int, window: int) -> tuple[float, float]:
    """(server CPU microseconds per call, calls per second)."""
    out: mp.Queue[Any] = mp.Queue()
    p = mp.Process(target=client, args=(kind, target, calls, window, out))
    p.start()
    assert out.get(timeout=180) == "ready"
    time.sleep(0.25)
    before = cpu_s(pid)
    wall = out.get(timeout=600)
    used = cpu_s(pid) - before
    p.join()
    return used / calls * 1e6, calls / wall


def run_chronomq(kind: str, calls: int, window: int) -> tuple[float, float]:
    from chronomq.client import ChronomqClient, message

    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data")
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=1)
                if kind == "pop_ack":
                    for _ in range(0, calls, 500):
                        c.send([message(TOPIC, BODY) for _ in range(500)])
            return measure(kind, srv.target, srv.proc.pid, calls, window)
        finally:
            srv.terminate()


def run_echo(kind: str, calls: int, window: int, workers: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([sys.executable, __file__, "--serve-echo", port_file,
                                 "--workers", str(workers)])
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(port_file) or not Path(port_file).read_text():
                if time.monotonic() > deadline:
                    raise RuntimeError("the bare gRPC server did not start")
                time.sleep(0.05)
            target = f"127.0.0.1:{Path(port_file).read_text()}"
            return measure(kind, target, proc.pid, calls, window)
        finally:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000, help="calls per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="chronomq and the floor in turn")
    ap.add_argument("--window", type=int, default=8, help="requests in flight on a stream")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--workers", type=int, default=64, help="the bare server's pool")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure the bare grpcio server (--no-floor: chronomq only)")
    ap.add_argument("--serve-echo", metavar="PORT_FILE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_echo:
        serve_echo(a.serve_echo, a.workers)
        return 0
    print(f"server CPU per call, 1 client, {a.calls} calls, medians of {a.rounds} rounds "
          "(chronomq and the bare grpcio server in turn)", flush=True)
    print("| call | chronomq us/call | floor us/call | ratio | chronomq calls/s | floor calls/s |")
    print("|---|---|---|---|---|---|")
    for kind in a.kinds.split(","):
        ours: list[tuple[float, float]] = []
        floor: list[tuple[float, float]] = []
        ratios: list[float] = []
        for r in range(a.rounds):
            ours.append(run_chronomq(kind, a.calls, a.window))
            floor.append(run_echo(kind, a.calls, a.window, a.workers) if a.floor
                         else (float("nan"), float("nan")))
            ratios.append(ours[-1][0] / floor[-1][0])
            print(f"  {kind} round {r + 1}: chronomq {ours[-1][0]:.0f} us/call "
                  f"({ours[-1][1]:.0f}/s), floor {floor[-1][0]:.0f} us/call "
                  f"({floor[-1][1]:.0f}/s)", file=sys.stderr, flush=True)
        med = statistics.median
        print(f"| {kind} | {med(c for c, _ in ours):.0f} | {med(c for c, _ in floor):.0f} | "
              f"{med(ratios):.2f} | {med(r for _, r in ours):,.0f} | "
              f"{med(r for _, r in floor):,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
