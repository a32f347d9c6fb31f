"""Tiered message store figures against ``chronomq serve`` (default durable settings).

1. upload: two sender processes send 1 KiB messages (batches of 100) for SECONDS, first
   with the tier off, then with uploads to a local-directory tier on; prints the send
   rate each leaves, the tier's upload rate during the sends (msgs/s, MB/s) and the time
   to catch up after; then a broker restarted with uploads on over a backlog the tier
   has not seen uploads it with no sends running (the upload path alone);
2. s3: an in-process broker uploads MESSAGES messages to moto's S3 server over HTTP;
   every S3 request is counted (botocore events) and reported per 10k messages;
3. cold: MESSAGES messages go up to the tier, local retention deletes them, then two
   consumer processes pop them all over Subscribe, from the tier.

    .venv/bin/python bench/bench_tier.py --seconds 20 --messages 200000
"""

from __future__ import annotations

import argparse
import collections
import logging
import multiprocessing as mp
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pop import _drain, _subscriber
from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess, wait_tier_caught_up

BODY = b"x" * 1024


def _sender(target: str, topic: str, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    sent = 0
    end = time.monotonic() + seconds
    with ChronomqClient(target) as c:
        batches = ([message(topic, BODY, key=f"k{i % 1000}") for i in range(100)]
                   for _ in iter(lambda: time.monotonic() < end, False))
        for outcomes in c.send_stream(batches):
            sent += sum(o.ok for o in outcomes)
    out.put(sent)


def _send_for(target: str, topic: str, seconds: float, procs: int = 2) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_sender, args=(target, topic, seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    sent = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return sent / seconds


TIER = ("tier.upload=true",)


def upload(tmp: Path, seconds: int) -> None:
    print(f"sends of 1 KiB messages in batches of 100, 2 sender processes, {seconds} s:")
    srv = ServerProcess(tmp / "plain")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("up", queue_count=4)
        base = _send_for(srv.target, "up", seconds)
        print(f"  tier off: {base:,.0f} msgs/s sent")
    finally:
        srv.terminate()
    tier = tmp / "tier"
    srv = ServerProcess(tmp / "tiered", *TIER, f"tier.local_dir={tier}")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("up", queue_count=4)
            before = c.stats()
            t0 = time.monotonic()
            rate = _send_for(srv.target, "up", seconds)
            during = c.stats()
            window = time.monotonic() - t0
            catch_up = wait_tier_caught_up(c, 600, 0.1)
        recs = during["tier.uploaded_records"] - before["tier.uploaded_records"]
        mb = (during["tier.uploaded_bytes"] - before["tier.uploaded_bytes"]) / 1e6
        print(f"  tier on:  {rate:,.0f} msgs/s sent ({rate / base:.0%} of tier off); "
              f"uploaded meanwhile {recs / window:,.0f} msgs/s, {mb / window:.1f} MB/s; "
              f"caught up {catch_up:.1f} s after the sends")
    finally:
        srv.terminate()
    # the upload path alone: the tier-off broker's backlog, uploaded on restart
    srv = ServerProcess(tmp / "plain", *TIER, f"tier.local_dir={tmp / 'tier2'}")
    try:
        with ChronomqClient(srv.target) as c:
            t0 = time.monotonic()
            took = wait_tier_caught_up(c, 600, 0.1)
            s = c.stats()
        print(f"  backlog upload, no sends: {s['tier.uploaded_records']:,.0f} msgs, "
              f"{s['tier.uploaded_bytes'] / 1e6:,.0f} MB in {took:.1f} s: "
              f"{s['tier.uploaded_records'] / took:,.0f} msgs/s, "
              f"{s['tier.uploaded_bytes'] / 1e6 / took:.1f} MB/s")
    finally:
        srv.terminate()


def s3_requests(tmp: Path, n: int) -> None:
    from moto.server import ThreadedMotoServer

    from chronomq.broker import Broker
    from chronomq.config import BrokerConfig, TierConfig
    from store.clock import SystemClock
    from store.message import Message, draft_of
    from store.store import StoreConfig
    from store.topics import Topic
    from tests.conftest import CREDS, create_bucket
    from tiered.providers.s3 import S3Provider

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    create_bucket(endpoint, "bench")
    tier = TierConfig(provider="s3", s3_bucket="bench", s3_endpoint_url=endpoint,
                      s3_access_key_id=CREDS["access_key_id"],
                      s3_secret_access_key=CREDS["secret_access_key"], upload=True)
    broker = Broker(BrokerConfig(store=StoreConfig(str(tmp / "s3data")), tier=tier),
                    SystemClock())
    counts: collections.Counter[str] = collections.Counter()
    assert isinstance(broker.tier, S3Provider)
    broker.tier.on_request(lambda operation: counts.update([operation]))
    broker.open()
    broker.start()
    try:
        broker.create_topic(Topic("s3", 4))
        t0 = time.monotonic()
        for b in range(0, n, 1000):
            broker.sender.send([draft_of(Message("", "s3", BODY, key=f"k{i % 1000}"))
                                for i in range(b, min(n, b + 1000))]).result(60)
        assert broker.tiered is not None
        while broker.tiered.statistics().position < broker.store.commitlog.confirmed_offset:
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        broker.stop()
        server.stop()
    total = sum(counts.values())
    per = {k: v * 10_000 / n for k, v in sorted(counts.items())}
    print(f"S3 requests for {n:,} messages of 1 KiB on 4 queues (default batches: 4 MiB or "
          f"5 s), {took:.1f} s: {total:,} requests = {total * 10_000 / n:.1f} per 10k "
          f"messages ({', '.join(f'{k} {v:.1f}' for k, v in per.items())})")


def cold(tmp: Path, n: int) -> None:
    srv = ServerProcess(tmp / "cold", *TIER, f"tier.local_dir={tmp / 'coldtier'}",
                        "store.retention_bytes=1", "store.segment_bytes=16777216",
                        "server.retention_interval_s=1")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("cold", queue_count=4)
            batches = ([message("cold", BODY) for _ in range(min(100, n - b))]
                       for b in range(0, n, 100))
            failed = sum(not o.ok for out in c.send_stream(batches) for o in out)
            assert not failed, f"{failed} sends failed"
            wait_tier_caught_up(c, 600, 0.1)
            deadline = time.monotonic() + 60  # retention runs every second
            while c.stats()["commitlog.min_offset"] == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            s = c.stats()
            local = s["commitlog.max_offset"] - s["commitlog.min_offset"]
        print(f"cold reads: {n:,} messages of 1 KiB, {s['commitlog.max_offset'] / 1e6:.0f} MB "
              f"sent, {local / 1e6:.0f} MB left on local disk; Subscribe, 2 consumer "
              "processes, new group:")
        _drain(srv.target, "cold", n, _subscriber, 2)
        with ChronomqClient(srv.target) as c:
            s = c.stats()
        print(f"    read-ahead cache: {s['tier.cache_fetches']:,.0f} tier fetches, "
              f"{s['tier.cache_fetched']:,.0f} entries fetched, {s['tier.cache_hits']:,.0f} "
              f"served from memory, {s['tier.cache_expired_unread']:,.0f} expired unread")
    finally:
        srv.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--only", choices=["upload", "s3", "cold"])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="chronomq-bench-"))
    try:
        if args.only in (None, "upload"):
            upload(tmp, args.seconds)
        if args.only in (None, "s3"):
            s3_requests(tmp, args.messages)
        if args.only in (None, "cold"):
            cold(tmp, args.messages)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    threading.excepthook = lambda a: print("thread failed:", a.exc_value, file=sys.stderr)
    main()
