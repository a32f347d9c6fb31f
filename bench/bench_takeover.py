"""Takeover figures: a broker with TOPICS topics, GROUPS consumer groups and PENDING
pending delayed messages is killed (kill -9, its data directory deleted) and another
broker takes it over from the shared tier (``chronomq takeover``).

Prints the seconds until the first send to a taken topic is accepted (the takeover's
``accepting_after_seconds``, and a client's own first OK measured from the call), until
every pending message is scheduled (the takeover's ``seconds``), the peak RSS of the
taking broker, a check that the pending count matches, and how long QueryMessages takes
to find an adopted pending message by id (20 of them, near and far).

    .venv/bin/python bench/bench_takeover.py --topics 1000 --groups 100 --pending 1000000
    .venv/bin/python bench/bench_takeover.py --quick        # 100 topics, 10k pending
    .venv/bin/python bench/bench_takeover.py --quick --history 100000  # a longer journal
    .venv/bin/python bench/bench_takeover.py --quick --history 100000 --snapshot-records 0
    .venv/bin/python bench/bench_takeover.py --pending 1000000 --delayed-history 1000000

``--delayed-history N``: before the kill, A also delivers N delayed messages (due a
second after they are sent, in batches of 500, to a topic of their own): a timer history
of N records in the delayed stream and a record per delivery batch in the timer stream.
Printed too: the size of A's system streams and timer snapshots in the tier (the local
tier) against its live state.

``--tier local`` (default) shares a local directory; ``--tier s3`` runs moto's S3 server.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess, wait_tier_caught_up
from testkit.s3 import start_moto

HOUR_MS = 3_600_000


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _history(c: ChronomqClient, target: str, n: int) -> None:
    """A consumer history: ``n`` messages sent, then popped and acked one at a time by
    four consumers (two journal records each: the Pop's lease, the Ack)."""
    c.create_topic("history", queue_count=4)
    for i in range(0, n, 500):
        assert all(o.ok for o in c.send([message("history", b"h" * 100)] * min(500, n - i)))
    t0 = time.monotonic()
    done = [0]

    def consume() -> None:
        with ChronomqClient(target) as cc:
            empty = 0
            while empty < 3:
                got = cc.pop("history", "history", 1, 60, wait_ms=100)
                empty = 0 if got else empty + 1
                for m in got:
                    cc.ack("history", [m.receipt_handle])
                    done[0] += 1
    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"A: history of {done[0]:,} pops and acks one at a time in "
          f"{time.monotonic() - t0:.1f} s", flush=True)


def _delayed_history(c: ChronomqClient, n: int) -> None:
    """``n`` delayed messages due a second after they are sent, delivered by A's timer."""
    c.create_topic("delayed-history", queue_count=4)
    t0 = time.monotonic()
    for i in range(0, n, 500):
        assert all(o.ok for o in c.send([message("delayed-history", b"d" * 100,
                                                 delay_ms=1000)] * min(500, n - i)))
    while c.stats().get("timer.delivered", 0) < n:
        time.sleep(0.5)
    print(f"A: delayed history of {n:,} messages sent and delivered in "
          f"{time.monotonic() - t0:.1f} s", flush=True)


def _tier_bytes(root: Path, prefixes: tuple[str, ...]) -> int:
    """Bytes of the local tier's objects under ``prefixes`` (paths relative to it)."""
    return sum(f.stat().st_size for p in prefixes for f in (root / "tier").glob(p + "/**/*")
               if f.is_file())


def _tier_settings(kind: str, root: Path, name: str, endpoint: str) -> list[str]:
    if kind == "s3":
        return ["tier.provider=s3", "tier.s3_bucket=takeover-bench",
                f"tier.s3_endpoint_url={endpoint}", "tier.s3_access_key_id=testing",
                "tier.s3_secret_access_key=testing", f"tier.broker_name={name}"]
    return ["tier.provider=local", f"tier.local_dir={root / 'tier'}", f"tier.broker_name={name}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--pending", type=int, default=1_000_000)
    p.add_argument("--tier", choices=("local", "s3"), default="local")
    p.add_argument("--history", type=int, default=0,
                   help="messages popped and acked one at a time before the kill (a "
                   "journal of about twice as many records)")
    p.add_argument("--snapshot-records", type=int, default=None,
                   help="A's tier.journal_snapshot_records (0: no snapshot but at start, "
                   "so a takeover replays A's whole journal); default: the broker's")
    p.add_argument("--delayed-history", type=int, default=0,
                   help="delayed messages delivered before the kill (a timer history)")
    p.add_argument("--quick", action="store_true", help="100 topics, 10 groups, 10k pending")
    p.add_argument("--profile", default="", help="py-spy the taking broker into this file "
                   "(collapsed stacks)")
    args = p.parse_args()
    if args.quick:
        args.topics, args.groups, args.pending = 100, 10, 10_000
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    endpoint = ""
    if args.tier == "s3":
        endpoint = start_moto("takeover-bench")
    root = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    common = ["tier.upload=true", "tier.claim_topics=true", "store.default_queue_count=4"]
    try:
        snapshots = ([] if args.snapshot_records is None else
                     [f"tier.journal_snapshot_records={args.snapshot_records}"])
        a = ServerProcess(root / "a", *common, *snapshots, "server.retention_interval_s=5",
                          *_tier_settings(args.tier, root, "a", endpoint))
        topics = [f"t{i:04d}" for i in range(args.topics)]
        t0 = time.monotonic()
        with ChronomqClient(a.target, timeout_s=600) as c:
            for t in topics:
                c.create_topic(t)
            rnd = random.Random(7)
            left = args.pending

            def batches():  # type: ignore[no-untyped-def]
                nonlocal left
                while left > 0:
                    n = min(500, left)
                    left -= n
                    yield [message(topics[rnd.randrange(len(topics))], b"p" * 100,
                                   delay_ms=rnd.randrange(HOUR_MS, 6 * HOUR_MS))
                           for _ in range(n)]
            sent = 0
            sample: list[str] = []  # ids of pending messages, looked up after the takeover
            for n, out in enumerate(c.send_stream(batches())):  # type: ignore[no-untyped-call]
                sent += sum(o.ok for o in out)
                if n % 97 == 0 and len(sample) < 20 and out and out[0].ok:
                    sample.append(out[0].message_id)
            # every group reads a few topics: positions to carry over
            for g in range(args.groups):
                for t in topics[g % len(topics)::max(1, len(topics) // 10)][:10]:
                    c.send_one(t, b"now")
                    for m in c.pop(t, f"g{g:03d}", 4, 60):
                        c.ack(f"g{g:03d}", [m.receipt_handle])
            if args.history:
                _history(c, a.target, args.history)
            if args.delayed_history:
                _delayed_history(c, args.delayed_history)
            fill_s = time.monotonic() - t0
            caught = wait_tier_caught_up(c, timeout_s=1800)
            journal = c.stats().get("journal.records", 0)
            if args.tier == "local":  # the next timer snapshot and retention pass (1 s, 5 s)
                time.sleep(15)
        if args.tier == "local":
            system = _tier_bytes(root, ("a/data/%SYS%delayed", "a/data/%SYS%timer",
                                        "a/data/%SYS%state", "a/timer-snapshot"))
            live = args.pending * 190  # a pending record as sent (100 B body + headers)
            print(f"A: system streams and timer snapshots in the tier {system / 1e6:.1f} MB; "
                  f"live pending records ~{live / 1e6:.1f} MB ({system / max(live, 1):.2f}x)")
        print(f"A: {sent} pending delayed messages in {args.topics} topics, {args.groups} "
              f"groups, {journal:,.0f} journal records; filled in {fill_s:.1f} s, tier "
              f"caught up {caught:.1f} s later")
        a.kill9()
        shutil.rmtree(root / "a")
        b = ServerProcess(root / "b", *common, *_tier_settings(args.tier, root, "b", endpoint))
        first_ok: list[float] = []

        def probe(start: float) -> None:  # a producer that keeps sending to a taken topic
            with ChronomqClient(b.target) as pc:
                while time.monotonic() - start < 600:
                    try:
                        pc.send_one(topics[0], b"probe")
                        first_ok.append(time.monotonic() - start)
                        return
                    except RpcError:
                        time.sleep(0.05)
        spy = None
        if args.profile:
            pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen([pyspy, "record", "--nonblocking", "-p",
                                    str(b.proc.pid), "-o", args.profile, "-f", "raw"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        with ChronomqClient(b.target, timeout_s=3600) as c:
            start = time.monotonic()
            prober = threading.Thread(target=probe, args=(start,), daemon=True)
            prober.start()
            r = c.takeover("a", force=True)
            wall = time.monotonic() - start
            prober.join(60)
            rss = _peak_rss_mb(b.proc.pid)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            stats = c.stats()
            looks = []  # QueryMessages by id of adopted pending messages (RocksDB or a
            for mid in sample:  # TimerFlatFile object): seconds, found
                t1 = time.monotonic()
                got = c.query(message_id=mid)
                looks.append((time.monotonic() - t1, [m.message_id for m in got] == [mid]))
        print(f"takeover of {len(r.topics)} topics, {r.groups} groups, {r.pending} pending "
              f"({args.tier} tier)")
        print(f"  sends accepted after   {r.accepting_after_seconds:8.2f} s (takeover's own "
              f"figure); a producer's first OK after "
              f"{first_ok[0] if first_ok else float('nan'):.2f} s   goal <= 5 s")
        print(f"  every pending scheduled {r.seconds:8.2f} s (call: {wall:.2f} s)   goal <= 30 s")
        print(f"  peak RSS of the taking broker {rss:.0f} MB")
        print(f"  journal: {stats.get('takeover.a.journal_records', 0):,.0f} records replayed "
              f"in {stats.get('takeover.a.journal_seconds', 0):.2f} s (before sends are "
              "accepted)")
        record = root / "b" / "takeovers" / "a.json"
        if record.exists():  # the takeover's own seconds per step
            phases = json.loads(record.read_text()).get("phases", {})
            print("  steps: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        print(f"  pending check: sent {sent}, scheduled {r.pending}; on B's timer: "
              f"{stats.get('timer.pending_rocksdb', 0):.0f} in RocksDB (estimate), "
              f"{stats.get('timer.flat_objects', 0):.0f} TimerFlatFile objects")
        if looks:
            secs = sorted(t for t, _ in looks)
            print(f"  QueryMessages by id of {len(looks)} adopted pending messages: "
                  f"{sum(ok for _, ok in looks)} found, p50 {secs[len(secs) // 2] * 1000:.0f} "
                  f"ms, max {secs[-1] * 1000:.0f} ms")
        b.terminate()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
