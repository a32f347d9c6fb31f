"""POP core throughput in process, without gRPC: ``PopService.pop`` (32) + ``ack_many``
over a real store and RocksDB, so a change to pop/ is measured without the transport's
noise.  Prints one line.

    .venv/bin/python bench/bench_pop_core.py [--messages 60000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pop.service import PopService
from store.clock import SystemClock
from store.kv import KV
from store.message import Draft
from store.store import MessageStore, StoreConfig
from store.topics import Topic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    n_messages = parser.parse_args().messages
    with tempfile.TemporaryDirectory() as d:
        clock = SystemClock()
        store = MessageStore(StoreConfig(d), clock)
        kv = KV(os.path.join(d, "pop"))
        pop = PopService(store, kv, b"s" * 32, clock)
        store.add_dispatch_handler(pop.copies)
        store.open()
        store.start()
        store.create_topic(Topic("t", 4))
        for _ in range(0, n_messages, 1000):
            store.put_drafts([Draft("", "t", "", "", b"x" * 100, b"", 0, 0)
                              for _ in range(1000)]).result()
        store.wait_visible()
        t0 = time.perf_counter()
        done = 0
        while done < n_messages:
            got = pop.pop("t", "g", 32, 60)
            if not got:
                break
            pop.ack_many("g", [p.receipt_handle for p in got])
            done += len(got)
        elapsed = time.perf_counter() - t0
        print(f"pop_ack_core_msgs_per_s {done / elapsed:,.0f}  ({done} msgs, Pop 32 + "
              f"ack_many, in process, {elapsed:.2f} s)")
        store.stop()
        kv.close()


if __name__ == "__main__":
    main()
