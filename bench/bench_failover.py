"""Failover chaos: three brokers with ``tier.failover`` and ``tier.durable_ack`` on moto's
S3; a producer sends one message at a time through ``RoutedClient`` (the bucket finds the
owner) and records every OK; CYCLES times the topic's current owner is killed with kill -9
and, once a survivor took it over and sends are accepted again, a fresh broker (new data
directory, new name) joins, so three are alive again.

Prints, per failover, the unavailability (from the kill to the first OK of a send begun
after it), and checks before each kill that exactly the broker the owner record names
serves the topic (no two owners), then
p50/p99/max against the goal (p99 <= tier.lease_s + 5 s), and the end check: every OK
send is consumed from the final owner (lost = 0) and none twice after its ack.

    .venv/bin/python bench/bench_failover.py --cycles 20 --lease-s 10
    .venv/bin/python bench/bench_failover.py --cycles 2 --lease-s 3     # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.s3 import start_moto
from chronomq.broker import make_provider
from chronomq.client import ChronomqClient, RpcError, message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from chronomq.config import load_config
from tests.chronomq.process import ServerProcess


def _settings(endpoint: str, name: str, lease_s: float) -> list[str]:
    return ["tier.provider=s3", "tier.s3_bucket=failover-bench",
            f"tier.s3_endpoint_url={endpoint}", "tier.s3_access_key_id=testing",
            "tier.s3_secret_access_key=testing", f"tier.broker_name={name}",
            "tier.upload=true", "tier.claim_topics=true", "tier.durable_ack=true",
            "tier.failover=true", f"tier.lease_s={lease_s}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--lease-s", type=float, default=10.0)
    args = p.parse_args()
    endpoint = start_moto("failover-bench")
    root = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    n = 0

    def start() -> tuple[str, ServerProcess]:
        nonlocal n
        n += 1
        name = f"broker-{n}"
        return name, ServerProcess(root / name, *_settings(endpoint, name, args.lease_s))

    brokers = dict(start() for _ in range(3))
    first = next(iter(brokers.values()))
    with ChronomqClient(first.target) as c:
        c.create_topic("orders", queue_count=4)
    tier = make_provider(load_config(None, _settings(endpoint, "client", args.lease_s)))
    rc = RoutedClient(BrokerDirectory(tier=tier, timeout_s=5), follow_s=120)
    ok: dict[str, float] = {}  # id -> when its OK came
    begun: dict[str, float] = {}  # id -> when its send began
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            started = time.monotonic()
            try:
                (out,) = rc.send([message("orders", b"x" * 100, message_id=f"M{i:09d}")])
                if out.ok:
                    ok[out.message_id] = time.monotonic()
                    begun[out.message_id] = started
                else:
                    errors.append(out.error)
            except RpcError as exc:
                errors.append(f"{exc.code.name}: {exc.details}")
            time.sleep(0.005)
    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    gaps: list[float] = []
    try:
        for cycle in range(args.cycles):
            time.sleep(2)
            serving = []  # the brokers that hold the topic and answer: exactly one
            for k, proc in brokers.items():
                with ChronomqClient(proc.target, timeout_s=5) as bc:
                    try:
                        if "orders" in {t.name for t in bc.list_topics()} and \
                                not bc.stats().get("lease.taken_over"):
                            serving.append(k)
                    except RpcError:
                        pass
            rc.directory.forget("orders")
            owner = rc.directory.locate("orders")
            holder = [k for k, s in brokers.items() if s.target == owner]
            if serving != holder:
                raise SystemExit(f"cycle {cycle + 1}: the owner record names {holder or owner},"
                                 f" the topic is served by {serving}")
            name = holder[0]
            killed = time.monotonic()
            brokers.pop(name).kill9()

            def after(since: float = killed) -> list[float]:  # OKs of sends begun after
                return [ok[m] for m, t in list(begun.items()) if t > since]
            while not after():
                if time.monotonic() - killed > 300:
                    raise SystemExit(f"cycle {cycle}: no send accepted 300 s after the kill")
                time.sleep(0.02)
            gap = min(after()) - killed
            gaps.append(gap)
            print(f"cycle {cycle + 1:2d}: killed {name}, sends accepted again after "
                  f"{gap:5.2f} s ({len(ok)} OK so far)", flush=True)
            new_name, proc = start()
            brokers[new_name] = proc
        time.sleep(2)
    finally:
        stop.set()
        sender.join(60)
    seen: set[str] = set()
    quiet = 0
    while quiet < 3:
        batch = rc.pop("orders", "audit", 32, 60, 500)
        quiet = quiet + 1 if not batch else 0
        seen |= {m.message_id for m in batch}
        if batch:
            rc.ack("orders", "audit", [m.receipt_handle for m in batch])
    lost = set(ok) - seen
    gaps.sort()
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    print(f"\n{len(gaps)} failovers, tier.lease_s = {args.lease_s:g}: unavailability p50 "
          f"{statistics.median(gaps):.2f} s, p99 {p99:.2f} s, max {gaps[-1]:.2f} s "
          f"(goal p99 <= {args.lease_s + 5:g} s: {'met' if p99 <= args.lease_s + 5 else 'MISSED'})")
    print(f"sends answered OK: {len(ok)}, consumed from the final owner: {len(seen & set(ok))}, "
          f"lost: {len(lost)}; refused or timed out along the way (not OK, not counted): "
          f"{len(errors)}")
    for proc in brokers.values():
        proc.terminate()
    if lost:
        raise SystemExit(f"LOST {len(lost)}: {sorted(lost)[:5]}")


if __name__ == "__main__":
    main()
