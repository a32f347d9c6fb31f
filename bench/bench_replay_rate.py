"""``chronomq replay --rate N``: is the cap reached?  Builds a tier of MESSAGES 100 B
messages (4 queues, local directory) through a broker with uploads on, then runs the
``chronomq replay`` console command once per rate into another topic of the same broker
(``local[2]``) and prints what it answered: msgs/s while sending, the send window, the
job time and Spark's start-up.

    .venv/bin/python bench/bench_replay_rate.py --messages 6000 --rates 1000,3000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess, wait_tier_caught_up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--rates", default="1000,3000", help="comma-separated msgs/s caps")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chronomq-bench-"))
    srv = ServerProcess(root / "data", "tier.upload=true", "tier.upload_batch_ms=50",
                        f"tier.local_dir={root / 'tier'}")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("orders", queue_count=4)
            for at in range(0, args.messages, 1000):
                c.send([message("orders", b"x" * 100)
                        for _ in range(min(1000, args.messages - at))])
            wait_tier_caught_up(c)
        print("rate cap | msgs/s while sending | send window s | job s | Spark start s")
        for rate in args.rates.split(","):
            with ChronomqClient(srv.target) as c:  # a fresh topic: nothing is a duplicate
                c.create_topic(f"copy-{rate}", queue_count=4)
            done = subprocess.run(
                [sys.executable, "-m", "chronomq.cli", "replay", "--topic", "orders",
                 "--tier-dir", str(root / "tier"), "--into-topic", f"copy-{rate}",
                 "--rate", rate, "--target", srv.target, "--json"],
                capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"replay failed: {done.stderr[-2000:]}")
            r = json.loads(done.stdout)
            print(f"{rate} | {r['msgs_per_s']:,.1f} | {r['send_seconds']:.2f} | "
                  f"{r['seconds']:.2f} | {r['spark_start_seconds']:.2f}  "
                  f"({r['sent']:,} sent, {r['failed']} failed)")
    finally:
        srv.terminate()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
