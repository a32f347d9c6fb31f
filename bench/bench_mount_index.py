"""A mount's key index at object-store latency: what a takeover's "ids" step costs.

Broker A's store and tiered dispatcher (real ones, ManualClock) write TOPICS topics of
QUEUES queues to a local-directory tier, PER_QUEUE messages a queue stored over ten
minutes, none of it in a sealed key-index file (A was killed with its open file).  A
mount reads that tier through a provider that waits ``--latency-ms`` per read (an S3
GET's round trip), and the script prints the seconds and tier reads of:

* ``warm(since_ms)`` for the last minute: what ``cluster.handover.InheritedIds.warm``
  does before a takeover accepts sends (a binary search then a read of each queue's tail);
* the first QueryMessages by id: the whole unsealed tail indexed.

    .venv/bin/python bench/bench_mount_index.py                  # 50 x 4 queues, 5 ms
    .venv/bin/python bench/bench_mount_index.py --topics 100 --latency-ms 20
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.clock import ManualClock
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.mount import MountedBroker
from tiered.providers.local import LocalProvider


class SlowProvider(LocalProvider):
    """A local-directory tier whose reads each wait ``latency_s`` first (and are counted)."""

    def __init__(self, root: str, latency_s: float) -> None:
        super().__init__(root)
        self.latency_s = latency_s
        self.reads = 0
        self._lock = threading.Lock()

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        with self._lock:
            self.reads += 1
        time.sleep(self.latency_s)
        return super().read(path, offset, length)


def _fill(root: Path, clock: ManualClock, topics: int, queues: int, per_queue: int) -> int:
    """A's tier as a kill -9 left it, copied to ``root / "tier"``: the first five
    minutes in a sealed key-index file, the rest in its open one (lost).  Returns the
    store time of its last record."""
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    config = TierConfig(index_ms=3_600_000)
    tier = TieredDispatcher(store, LocalProvider(str(root / "live")), "a",
                            str(root / "data" / "tiered"), config, clock)
    tier.open()
    try:
        names = [f"t{i:03d}" for i in range(topics)]
        for name in names:
            store.create_topic(Topic(name, queues))
        for step in range(10):  # a minute apart
            for name in names:
                store.put([Message(f"{name}-{step}-{i}", name, b"x" * 100)
                           for i in range(per_queue * queues // 10)]).result(30)
            last_ms = clock.now_ms()
            clock.advance(60_000)
            while tier.step():
                pass
            tier.commit(force=step == 4)  # the key index sealed once, after 5 minutes
        shutil.copytree(root / "live", root / "tier")  # what a kill -9 leaves
        return last_ms
    finally:
        tier.stop()
        store.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--per-queue", type=int, default=200)
    p.add_argument("--latency-ms", type=float, default=5.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mount-index-") as tmp:
        root = Path(tmp)
        last_ms = _fill(root, ManualClock(), args.topics, args.queues, args.per_queue)
        for what in ("warm", "query"):
            provider = SlowProvider(str(root / "tier"), args.latency_ms / 1000)
            mounted = MountedBroker(provider, "a", str(root / f"mount-{what}"))
            reads, t0 = provider.reads, time.monotonic()
            if what == "warm":
                mounted.warm(last_ms - 60_000)
            else:
                assert mounted.query_by_message_id("t000-0-0")
            print(f"{what:5s} {args.topics} x {args.queues} queues at {args.latency_ms:g} ms "
                  f"a read: {time.monotonic() - t0:6.2f} s, {provider.reads - reads} reads")


if __name__ == "__main__":
    main()
