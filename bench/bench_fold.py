"""A queue that commits one message at a time, with and without folds (``tiered.fold``).

Durable-ack makes a commit of every lone change: one log and one cq object each, every
one listed in the queue's metadata, which each commit rewrites in full (locally and in
the tier) and the commit record carries.  This runs a real store and tiered dispatcher
on a local-directory tier in this process, sends ``--commits`` messages of 100 B one
commit each, runs the fold pass (with tier retention) every ``--pass-every`` commits, and
prints at each checkpoint, for folds off (``tier.fold_objects=0``) and on (the default,
32): the metadata's size and objects listed, the mean time of a commit over the last
window (step, upload, metadata saved), the objects in the tier, and the bytes written
to the tier's data over the bytes committed (the folds' rewrite).

    .venv/bin/python bench/bench_fold.py --commits 10000

``--e2e N``: from outside instead: a ``chronomq serve`` with durable-ack on SeaweedFS (a
real S3 server), one topic of one queue, N lone Sends one after the other (each its own
commit), folds off then on (retention's pass, which folds, every 10 s); prints each
1,000 Sends' p50 / p99 and, at the end, the size of the queue's metadata copy in the
bucket.

    .venv/bin/python bench/bench_fold.py --e2e 20000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.clock import SystemClock
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.providers.local import LocalProvider


class Counting(LocalProvider):
    """The local-directory tier, counting the bytes written under ``/data/``."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.data_bytes = 0
        self._count_lock = threading.Lock()

    def write(self, path: str, data: bytes) -> None:
        super().write(path, data)
        if "/data/" in path:
            with self._count_lock:
                self.data_bytes += len(data)


def run(root: Path, commits: int, pass_every: int, fanin: int,
        checkpoints: list[int]) -> list[dict[str, float]]:
    clock = SystemClock()
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    provider = Counting(str(root / "tier"))
    tier = TieredDispatcher(store, provider, "b0", str(root / "data" / "tiered"),
                            TierConfig(durable_ack=True, fold_objects=fanin, fold_keep_s=0),
                            clock)
    tier.open()
    store.create_topic(Topic("t", 1))
    rows: list[dict[str, float]] = []
    committed, window_s, window_n = 0, 0.0, 0
    try:
        for i in range(1, commits + 1):
            store.put([Message("", "t", b"x" * 100)]).result(10)
            began = time.perf_counter()
            while tier.step():  # (a lone change is due at once, as with durable-ack)
                pass
            window_s += time.perf_counter() - began
            window_n += 1
            committed += 1
            if i % pass_every == 0:
                tier.run_retention()
            if i in checkpoints:
                q = tier.queue("t", 0)
                assert q is not None
                meta = q.to_json()
                raw = json.loads(meta)
                listed = sum(len(s["objects"]) for stream in ("log", "cq")
                             for s in json.loads(raw[stream])["segments"])
                data = q.log.commit_position + q.cq.commit_position
                objects = sum(1 for p in (root / "tier").rglob("*")
                              if p.is_file() and "/data/" in str(p))
                rows.append({"commits": i, "meta_bytes": len(meta), "listed": listed,
                             "commit_ms": window_s / window_n * 1000,
                             "tier_objects": objects,
                             "amplification": provider.data_bytes / data})
                window_s, window_n = 0.0, 0
                print(f"  fold_objects={fanin:>2} after {i:>6} commits: metadata "
                      f"{len(meta):>8,} B, {listed:>6,} objects listed; a commit "
                      f"{rows[-1]['commit_ms']:.2f} ms; {objects:,} objects in the tier; "
                      f"written / committed {rows[-1]['amplification']:.2f}", flush=True)
    finally:
        tier.stop()
        store.stop()
    return rows


def e2e(sends: int, fanins: list[int]) -> None:
    from chronomq.client import ChronomqClient
    from testkit.process import ServerProcess
    from testkit.s3 import start_seaweed

    with tempfile.TemporaryDirectory() as tmp:
        server = start_seaweed(Path(tmp) / "seaweed", "fold")
        try:
            for fanin in fanins:
                name = f"fold{fanin}"
                srv = ServerProcess(
                    Path(tmp) / name, "tier.upload=true", "tier.durable_ack=true",
                    "tier.provider=s3", "tier.s3_bucket=fold",
                    f"tier.s3_endpoint_url={server.endpoint}",
                    "tier.s3_access_key_id=testing", "tier.s3_secret_access_key=testing",
                    f"tier.broker_name={name}", f"tier.fold_objects={fanin}",
                    "server.retention_interval_s=10")
                try:
                    with ChronomqClient(srv.target, timeout_s=60) as c:
                        c.create_topic("t", queue_count=1)
                        window: list[float] = []
                        for i in range(1, sends + 1):
                            began = time.perf_counter()
                            c.send_one("t", b"x" * 100)
                            window.append((time.perf_counter() - began) * 1000)
                            if i % 1000 == 0:
                                window.sort()
                                print(f"  fold_objects={fanin:>2} sends {i - 999:>6}-{i:<6}: "
                                      f"p50 {window[len(window) // 2]:.1f} ms, "
                                      f"p99 {window[int(len(window) * 0.99)]:.1f} ms",
                                      flush=True)
                                window = []
                        st = c.stats()
                        print(f"  fold_objects={fanin:>2}: gc collections young / middle / "
                              f"full {st.get('gc.collections_young', 0):.0f} / "
                              f"{st.get('gc.collections_middle', 0):.0f} / "
                              f"{st.get('gc.collections_full', 0):.0f}, longest pause "
                              f"{st.get('gc.longest_pause_s', 0) * 1000:.1f} ms; tier "
                              f"commits {st.get('tier.commits', 0):.0f}", flush=True)
                finally:
                    srv.terminate()
                import boto3
                s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                  aws_access_key_id="testing",
                                  aws_secret_access_key="testing")
                meta = s3.get_object(Bucket="fold", Key=f"{name}/meta/t/0.json")["Body"].read()
                print(f"  fold_objects={fanin:>2}: the queue's metadata copy "
                      f"{len(meta):,} B after {sends:,} Sends", flush=True)
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--pass-every", type=int, default=1_000,
                    help="commits between fold passes (the retention pass's cadence)")
    ap.add_argument("--e2e", type=int, default=0,
                    help="lone Sends to a durable-ack broker on SeaweedFS instead")
    ap.add_argument("--fanins", default="0,32",
                    help="with --e2e: the tier.fold_objects to run, in turn")
    args = ap.parse_args()
    if args.e2e:
        e2e(args.e2e, [int(f) for f in args.fanins.split(",")])
        return
    checkpoints = sorted({c for c in (1_000, 5_000, 10_000, 20_000, 50_000, args.commits)
                          if c <= args.commits})
    results = {}
    for fanin in (0, 32):
        with tempfile.TemporaryDirectory() as tmp:
            results[fanin] = run(Path(tmp), args.commits, args.pass_every, fanin, checkpoints)
    print("\n| commits | metadata off / on (B) | listed off / on | a commit off / on (ms) "
          "| tier objects off / on | written / committed on |")
    print("|---|---|---|---|---|---|")
    for off, on in zip(results[0], results[32], strict=True):
        print(f"| {off['commits']:,.0f} | {off['meta_bytes']:,.0f} / {on['meta_bytes']:,.0f} "
              f"| {off['listed']:,.0f} / {on['listed']:,.0f} "
              f"| {off['commit_ms']:.2f} / {on['commit_ms']:.2f} "
              f"| {off['tier_objects']:,.0f} / {on['tier_objects']:,.0f} "
              f"| {on['amplification']:.2f} |")


if __name__ == "__main__":
    main()
