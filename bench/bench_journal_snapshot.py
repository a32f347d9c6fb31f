"""How long a journal snapshot holds Pops and Acks: ``LeaseJournal.snapshot`` scans the
whole lease book under the journal's ``ordered`` lock (a consistent cut), so every Pop
and Ack of the broker waits that long, once per ``tier.journal_snapshot_records``
records (or per book size, if larger).

Builds a real MessageStore with the journal streams and a real RocksDB lease book of
ENTRIES entries (ack offsets of 100 groups over topics of 4 queues), then times
``snapshot()`` (the lock held) and the CommitLog append of its records.

    .venv/bin/python bench/bench_journal_snapshot.py --entries 10000 400000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pop.leasejournal import LeaseJournal
from store.clock import SystemClock
from store.journal import StateJournal
from store.kv import KV, GroupCommit
from store.names import SYSTEM_STREAMS
from store.store import MessageStore, StoreConfig
from store.topics import Topic


def run(entries: int, root: Path) -> None:
    store = MessageStore(StoreConfig(str(root / "data")), SystemClock())
    store.open()
    store.start()
    try:
        for stream in SYSTEM_STREAMS:
            store.create_topic(Topic(stream, 1), system=True)
        kv = KV(str(root / "pop"))
        for i in range(0, entries, 10_000):
            kv.write([(b"o" + f"g{j % 100:03d}/t{j // 400:05d}/{j % 4}".encode(),
                       b"\x00" * 8) for j in range(i, min(entries, i + 10_000))])
        log = LeaseJournal(kv, GroupCommit(kv))
        journal = StateJournal(store)
        log.attach(journal)  # the start snapshot (not timed)
        t0 = time.perf_counter()
        futures = log.snapshot()  # the lock is held for this call
        held = time.perf_counter() - t0
        infos = [i for f in futures for i in f.result()]
        stored = time.perf_counter() - t0
        size = sum(i.record_size for i in infos)
        print(f"{entries:>9,} entries: ordered lock held {held * 1000:8.1f} ms; "
              f"{len(infos)} records, {size / 1e6:.1f} MB in the CommitLog after "
              f"{stored * 1000:.1f} ms", flush=True)
        kv.close()
    finally:
        store.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000, 400_000])
    args = p.parse_args()
    for n in args.entries:
        with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
            run(n, Path(tmp))


if __name__ == "__main__":
    main()
