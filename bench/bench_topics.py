"""Many topics: CreateTopic rate, start and restart time, open files, memory and the size
of a Stats answer with 10,000 topics x 4 queues, the broker under ``ulimit -n 1024``.

    .venv/bin/python bench/bench_topics.py [--topics 10000] [--queues 4] [--nofile 1024]

0. The topic catalogue alone, in this process: 64 threads creating topics (the store's
   ceiling, without gRPC).
1. Start an empty broker with RLIMIT_NOFILE = ``--nofile`` (soft and hard).
2. Create the topics in steps of 1,000 with 64 CreateTopic calls in flight from one
   client (each answered only once durable); then 200 more one at a time.
3. Send one message to every queue and wait until all are dispatched: one ConsumeQueue
   file per queue (40,000 with the defaults).
4. Restart after SIGTERM, after kill -9, and after kill -9 plus a faked OS restart (a
   new boot id) with ``store.flush=async`` (whose start walks every queue for entries
   past the log end; ``store.tailcheck``), each until it serves
   again (the process start included), with open files and RSS after each; a new group
   pops a sample across the range.
5. The size of a Stats answer, and again after one group popped every topic (Stats then
   holds five figures per group and topic).
6. The store alone opened in this process on the same data (twice): its share of a
   restart, without the interpreter start and imports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from store.clock import SystemClock
from store.store import MessageStore, StoreConfig
from store.topics import Topic, TopicCatalogue
from testkit.process import ServerProcess

WINDOW = 64  # calls in flight


def _pipelined(call: Callable[[Any], Future[Any]], requests: list[Any]) -> list[Any]:
    out: list[Any] = []
    inflight: list[Future[Any]] = []
    for r in requests:
        inflight.append(call(r))
        if len(inflight) >= WINDOW:
            out.append(inflight.pop(0).result())
    out += [f.result() for f in inflight]
    return out


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _stats_bytes(stub: Any) -> int:
    return int(stub.Stats(pb.StatsRequest(), timeout=60).ByteSize())


def _catalogue_alone(directory: Path, topics: int, threads: int = 64) -> float:
    """Creates per second of a bare ``TopicCatalogue`` with ``threads`` creating at once."""
    directory.mkdir()
    catalogue = TopicCatalogue(str(directory))
    per = topics // threads

    def create(worker: int) -> None:
        for i in range(per):
            catalogue.create(Topic(f"w{worker}-{i}", 4))

    workers = [threading.Thread(target=create, args=(w,)) for w in range(threads)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    rate = per * threads / (time.monotonic() - t0)
    print(f"TopicCatalogue alone, {threads} threads: {rate:,.0f} creates per second, "
          f"{catalogue.syncs:,} fsyncs for {per * threads:,} creates")
    catalogue.close()
    return rate


def _start(data: Path, nofile: int, *settings: str) -> tuple[ServerProcess, float]:
    t0 = time.monotonic()
    srv = ServerProcess(data, *settings, nofile=nofile)
    return srv, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--nofile", type=int, default=1024)
    args = ap.parse_args()
    names = [f"topic-{i:05d}" for i in range(args.topics)]
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-", dir="/var/tmp") as tmp:
        data = Path(tmp) / "data"
        print(f"load average {_load()} at the start")
        _catalogue_alone(Path(tmp) / "catalogue", args.topics)
        srv, empty_s = _start(data, args.nofile)
        print(f"ulimit -n {args.nofile}; empty broker serving after {empty_s:.2f} s, "
              f"{_fds(srv.proc.pid)} open files, RSS {_rss_mb(srv.proc.pid):.0f} MB")
        with grpc.insecure_channel(srv.target) as channel:
            stub: Any = pb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]

            def create(name: str) -> Any:
                return stub.CreateTopic.future(pb.CreateTopicRequest(
                    topic=pb.Topic(name=name, queue_count=args.queues)), timeout=60)

            rates = []
            for lo in range(0, args.topics, 1000):
                t0 = time.monotonic()
                _pipelined(create, names[lo:lo + 1000])
                rate = len(names[lo:lo + 1000]) / (time.monotonic() - t0)
                rates.append(f"{lo // 1000 + 1}k: {rate:,.0f}")
            print(f"CreateTopic per second, {WINDOW} in flight, by topics so far: "
                  + ", ".join(rates))
            t0 = time.monotonic()
            for i in range(200):
                create(f"one-by-one-{i}").result()
            print(f"CreateTopic one at a time, at {args.topics:,} topics: "
                  f"{200 / (time.monotonic() - t0):,.0f} per second")
            t0 = time.monotonic()
            sends = _pipelined(lambda t: stub.Send.future(pb.SendRequest(messages=[
                message(t, f"{t}/{q}".encode()) for q in range(args.queues)]), timeout=60),
                names)
            failed = sum(r.WhichOneof("outcome") == "error" for s in sends for r in s.results)
            with ChronomqClient(srv.target) as c:
                while c.stats()["store.dispatch_lag_bytes"] > 0:
                    time.sleep(0.05)
            files = sum(1 for _ in (data / "consumequeue").glob("*/*/*.cq"))
            print(f"one message to each of {args.topics * args.queues:,} queues, all "
                  f"dispatched after {time.monotonic() - t0:.1f} s ({failed} failed); "
                  f"ConsumeQueue files {files:,}; broker: {_fds(srv.proc.pid)} open files, "
                  f"RSS {_rss_mb(srv.proc.pid):.0f} MB")
            plain = _stats_bytes(stub)  # no consumer group yet
        for group, how, settings in (
                ("after-sigterm", "SIGTERM", ()), ("after-kill", "kill -9", ()),
                ("after-kill-async", "kill -9 and an OS restart (a new boot id), with "
                 "flush=async (the start walks every queue for entries past the log end)",
                 ("store.flush=async",))):
            if how == "SIGTERM":
                srv.terminate()
            else:
                srv.kill9()
            if settings:
                (data / "checkpoint" / "boot-id").write_text("another boot\n")
            srv, start_s = _start(data, args.nofile, *settings)
            fds, rss = _fds(srv.proc.pid), _rss_mb(srv.proc.pid)
            with ChronomqClient(srv.target) as c:
                sample = names[:: max(1, args.topics // 100)]
                t0 = time.monotonic()
                served = sum(len(c.pop(t, group, 32)) for t in sample)
                pop_s = time.monotonic() - t0
            print(f"restart after {how}: serving after {start_s:.2f} s with "
                  f"{args.topics:,} topics x {args.queues} queues; {fds} open files, "
                  f"RSS {rss:.0f} MB; a new group popped {served:,} messages from "
                  f"{len(sample)} topics in {pop_s:.2f} s ({_fds(srv.proc.pid)} open files "
                  "after)")
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            sampled = _stats_bytes(stub)
            t0 = time.monotonic()
            popped = _pipelined(lambda t: stub.Pop.future(pb.PopRequest(
                topic=t, group="g", max_messages=32, invisible_time_s=600), timeout=60),
                names)
            got = sum(len(p.messages) for p in popped)
            print(f"group g popped every topic once in {time.monotonic() - t0:.1f} s "
                  f"({got:,} messages); Stats answer: {plain:,} bytes with no consumer "
                  f"group, {sampled:,} with 3 groups x {len(sample)} topics, "
                  f"{_stats_bytes(stub):,} after group g (five figures per group and topic)")
        srv.terminate()
        for _ in range(2):
            t0 = time.monotonic()
            store = MessageStore(StoreConfig(str(data), max_open_files=256), SystemClock())
            store.open()
            open_s = time.monotonic() - t0
            store.stop()
            print(f"the store alone, in this process (no interpreter start, no imports, no "
                  f"RocksDB of POP and timer): opened with {args.topics:,} topics x "
                  f"{args.queues} queues in {open_s:.3f} s")
    print(f"load average {_load()} at the end (2 CPUs shared with the client)")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
