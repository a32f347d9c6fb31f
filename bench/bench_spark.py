"""Spark backlog figures: Spark start-up, rows/s reading the tier with the chronomq data
source (``local[2]``, or a standalone cluster), and replay msgs/s into a live broker on
the same machine.

A tier of MESSAGES 100 B messages (4 queues, local directory) is built in-process with the
store and the tiered dispatcher (no gRPC), then:

1. start-up: creating the Spark session (JVM, loopback, UI off);
2. read: ``sum(length(body))`` over every row through the data source (all columns
   decoded into Arrow batches), twice (the first pays the Python workers' start);
3. replay: ``chronomq replay``'s job sends about REPLAY of them (whole queues) into
   ``chronomq serve`` (default durable settings) over SendStream from every partition.

    .venv/bin/python bench/bench_spark.py --messages 2000000 --replay 500000
    .venv/bin/python bench/bench_spark.py --messages 1000000 --replay 500000 --cluster 2

``--cluster N`` runs the same on a standalone cluster of N one-core workers started from
pyspark's distribution (``spark.standalone``) on this machine, stopped at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import dir_mb
from chronomq.client import ChronomqClient
from chronomq.replay_sink import GrpcReplaySink
from spark.datasource import TierLocation
from spark.jobs import replay, select
from spark.session import make_session
from spark.standalone import StandaloneCluster
from store.clock import SystemClock
from store.message import Message, draft_of
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from testkit.process import ServerProcess
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.providers.local import LocalProvider
from tiered.scan import Selection


def build_tier(root: Path, n: int) -> None:
    clock = SystemClock()
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, LocalProvider(str(root / "tier")), "broker-0",
                            str(root / "data" / "tiered"), TierConfig(), clock)
    tier.open()
    store.create_topic(Topic("orders", 4))
    t0 = time.monotonic()
    for b in range(0, n, 2000):
        store.put_drafts([draft_of(Message("", "orders", b"x" * 100, key=f"k{i % 1000}",
                                           tag="t", properties={"n": str(i)}))
                          for i in range(b, min(n, b + 2000))]).result(60)
        while tier.step():
            pass
    tier.stop()
    store.stop()
    mb = dir_mb(root / "tier")
    print(f"tier built: {n:,} messages, {mb:,.0f} MB in the tier, "
          f"{time.monotonic() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--replay", type=int, default=500_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--cluster", type=int, default=0, metavar="N",
                    help="start a standalone cluster of N one-core workers (spark-class) "
                         "and run on it instead of --master")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chronomq-bench-"))
    cluster = None
    if args.cluster:
        t0 = time.monotonic()
        cluster = StandaloneCluster(workers=args.cluster, root=root / "cluster")
        args.master = cluster.start()
        print(f"standalone cluster: a master and {args.cluster} workers (1 core, 1 GiB "
              f"each) at {args.master}, started in {time.monotonic() - t0:.1f} s")
    try:
        build_tier(root, args.messages)
        t0 = time.monotonic()
        spark = make_session(args.master, "chronomq-bench")
        print(f"Spark start-up ({args.master}): {time.monotonic() - t0:.2f} s")
        location = TierLocation(path=str(root / "tier"))
        df = select(spark, location, Selection(frozenset({"orders"})))
        print(f"  {df.rdd.getNumPartitions()} input partitions")
        for run in (1, 2):
            t0 = time.monotonic()
            total = df.selectExpr("count(*)", "sum(length(body))").first()
            took = time.monotonic() - t0
            assert total is not None and total[0] == args.messages, total
            print(f"read {run}: {args.messages:,} rows in {took:.2f} s: "
                  f"{args.messages / took:,.0f} rows/s")
        srv = ServerProcess(root / "live")
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic("replayed", queue_count=4)
            # whole queues, so the replay keeps one partition per slice (a limit would
            # gather everything into one partition)
            queues = max(1, round(4 * args.replay / args.messages))
            part = df.where(f"queue_id < {queues}")
            r = replay(spark, part, GrpcReplaySink(srv.target), into_topic="replayed",
                       progress=False)
            print(f"  replay read {part.rdd.getNumPartitions()} partitions")
            print(f"replay: {r.sent:,} sent ({r.failed} failed) in {r.seconds:.2f} s: "
                  f"{r.sent / r.seconds:,.0f} msgs/s")
        finally:
            srv.terminate()
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
