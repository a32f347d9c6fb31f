"""Durable-ack figures: ``chronomq serve`` with a tier on moto's S3 server (real HTTP) or
SeaweedFS (``--s3 seaweed``: a real S3 server), in two modes side by side:

- local:   ``tier.upload=true`` (an OK means fsynced on local disk; the tier follows);
- durable: ``tier.upload=true tier.durable_ack=true`` (an OK means the change is in the
  tier; the tiered dispatcher commits back to back, waiting ``tier.durable_ack_ms``).

For each mode:

1. unary Send latency: SENDS sequential ``send_one`` of 100 B bodies, p50/p99/max;
2. SendStream throughput: MESSAGES messages of 100 B in batches of 100 over one stream
   (requests pipelined, outcomes read as they come), msgs/s;
3. Producer throughput: MESSAGES messages of 100 B through the client library's batching
   ``Producer`` (one ``send`` per message, every future kept and resolved; its default
   settings, or ``--producer-in-flight``), msgs/s;
4. Subscribe pop+ack throughput: a BACKLOG of 100 B messages sent beforehand, drained by
   one consumer over Subscribe (credit 1024, one ack request per response), msgs/s;
5. Consumer take+ack throughput: the same backlog drained by another group through the
   library's ``Consumer`` with its defaults, one ``ack`` per message (every future
   resolved before the clock stops), msgs/s.

The tier is left to catch up (Stats ``tier.lag_bytes`` 0) before phases 1, 3 and 4, so a
local-mode upload of earlier data does not run under the measurement.  moto runs in its
own process, so the consumer in this process does not share a GIL with it.

``--s3-latency-ms N`` puts the fault proxy (``testkit.proxy``, ``latency`` mode, in a
process of its own too) between the brokers and the S3 server: every S3 request waits N ms
before it is forwarded, as on a real object store (20 ms: S3 Standard in-region; the last
command below, ~1 min).  Each mode then prints a line more: its unary Send p50 / p99 in
ms and in round trips (ms / N), its tier commit in round trips, and its Producer and
Consumer rates.

    .venv/bin/python bench/bench_durable_ack.py               # ~1-2 min
    .venv/bin/python bench/bench_durable_ack.py --quick       # ~30 s
    .venv/bin/python bench/bench_durable_ack.py --s3 seaweed --rounds 2  # in turn, twice
    .venv/bin/python bench/bench_durable_ack.py --s3 seaweed --mode durable --s3-latency-ms 20
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from chronomq.client.consumer import Consumer
from chronomq.client.producer import Producer
from testkit.process import ServerProcess

BODY = b"x" * 100
BATCH = 100
CREDIT = 1024  # Subscribe max_outstanding (bench_pop's setting)
KEYS = ("testing", "testing")  # moto accepts any; the tests' CREDS


def _moto(out: Any, stop: Any) -> None:
    """Child process: run moto's S3 server until ``stop`` is set."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    out.put(server.get_host_and_port())
    stop.wait()
    server.stop()


def _latency_proxy(upstream: str, latency_ms: float, out: Any, stop: Any) -> None:
    """Child process: delay every request to ``upstream`` by ``latency_ms`` until
    ``stop`` is set."""
    from testkit.proxy import FaultProxy

    with FaultProxy(upstream) as proxy:
        proxy.set_mode("latency", latency_ms=latency_ms)
        out.put(proxy.endpoint)
        stop.wait()


def _create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=KEYS[0],
                 aws_secret_access_key=KEYS[1]).create_bucket(Bucket=bucket)


def _tier(endpoint: str, bucket: str, name: str) -> list[str]:
    return ["tier.provider=s3", f"tier.s3_bucket={bucket}", f"tier.s3_endpoint_url={endpoint}",
            f"tier.s3_access_key_id={KEYS[0]}", f"tier.s3_secret_access_key={KEYS[1]}",
            f"tier.broker_name={name}"]


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


@dataclass
class Result:
    mode: str
    sends: int = 0
    send_errors: int = 0
    p50: float = float("nan")
    p99: float = float("nan")
    max: float = float("nan")
    commit_ms: float = float("nan")  # a tier commit's mean time during the unary sends
    stream_msgs: int = 0
    stream_errors: int = 0
    stream_s: float = float("nan")
    producer_msgs: int = 0
    producer_errors: int = 0
    producer_s: float = float("nan")
    sub_msgs: int = 0
    sub_s: float = float("nan")
    consumer_msgs: int = 0
    consumer_s: float = float("nan")
    consumer_credit: int = 0  # where the Consumer's credit ended
    producer_window: int = 0  # where the Producer's window of batches ended
    errors: list[str] = field(default_factory=list)  # first few error texts

    @property
    def stream_rate(self) -> float:
        return self.stream_msgs / self.stream_s if self.stream_s > 0 else float("nan")

    @property
    def producer_rate(self) -> float:
        return self.producer_msgs / self.producer_s if self.producer_s > 0 else float("nan")

    @property
    def sub_rate(self) -> float:
        return self.sub_msgs / self.sub_s if self.sub_s > 0 else float("nan")

    @property
    def consumer_rate(self) -> float:
        return self.consumer_msgs / self.consumer_s if self.consumer_s > 0 else float("nan")

    def note(self, text: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(text)


def _settle(c: ChronomqClient, timeout_s: float) -> float:
    """Wait until the tier holds the whole CommitLog (``tier.lag_bytes`` 0); seconds."""
    t0 = time.monotonic()
    while c.stats()["tier.lag_bytes"] > 0:
        if time.monotonic() - t0 > timeout_s:
            print(f"    (tier still {c.stats()['tier.lag_bytes']:,.0f} B behind after "
                  f"{timeout_s:g} s; going on)", flush=True)
            break
        time.sleep(0.05)
    return time.monotonic() - t0


def _stream(c: ChronomqClient, topic: str, n: int, seconds: float, res: Result | None
            ) -> tuple[int, int, float]:
    """Send ``n`` messages over SendStream (stop producing after ``seconds``); returns
    (ok, failed, elapsed)."""
    end = time.monotonic() + seconds
    batches = ([message(topic, BODY) for _ in range(min(BATCH, n - b))]
               for b in range(0, n, BATCH) if time.monotonic() < end)
    ok = failed = 0
    t0 = time.monotonic()
    for outcomes in c.send_stream(batches):
        for o in outcomes:
            if o.ok:
                ok += 1
            else:
                failed += 1
                if res is not None:
                    res.note(f"SendStream: {o.error}")
    return ok, failed, time.monotonic() - t0


def _producer(c: ChronomqClient, topic: str, n: int, seconds: float, res: Result,
              in_flight: int | None) -> tuple[int, int, float]:
    """Send ``n`` messages one ``Producer.send`` at a time (stop after ``seconds``); every
    future is resolved before the clock stops.  Returns (ok, failed, elapsed)."""
    end = time.monotonic() + seconds
    ok = failed = 0
    t0 = time.monotonic()
    with Producer(c) if in_flight is None else Producer(c, in_flight=in_flight) as p:
        futures = []
        for _ in range(n):
            if time.monotonic() > end:
                break
            futures.append(p.send(topic, BODY))
        for f in futures:
            try:
                f.result()
                ok += 1
            except Exception as exc:  # reported; the bench goes on
                failed += 1
                res.note(f"Producer: {type(exc).__name__}: {exc}")
        res.producer_window = p.in_flight
    return ok, failed, time.monotonic() - t0


def _subscribe(c: ChronomqClient, topic: str, n: int, seconds: float) -> tuple[int, float]:
    got = 0
    t0 = time.monotonic()
    with c.subscribe(topic, "bench", 300, CREDIT) as sub:
        stop = threading.Event()

        def watch() -> None:  # the stream may sit idle: end it at the deadline
            if not stop.wait(seconds):
                sub.close()

        threading.Thread(target=watch, daemon=True).start()
        for r in sub.responses():
            if r.messages:
                got += len(r.messages)
                sub.ack([m.receipt_handle for m in r.messages])
            if got >= n:
                break
        elapsed = time.monotonic() - t0
        stop.set()
    return got, elapsed


def _consumer(c: ChronomqClient, topic: str, n: int, seconds: float, res: Result,
              prefetch: int | None = None) -> tuple[int, float]:
    """Take and ack ``n`` messages one at a time through ``Consumer`` with its defaults
    (or a fixed credit, ``prefetch``); the acks' futures resolved before the clock
    stops."""
    t0 = time.monotonic()
    got = 0
    futures = []
    with Consumer(c, topic, "bench-consumer", prefetch=prefetch) as consumer:
        end = t0 + seconds
        while got < n and time.monotonic() < end:
            m = consumer.receive(timeout_s=max(0.0, end - time.monotonic()))
            if m is None:
                break
            futures.append(consumer.ack(m))
            got += 1
        acked = 0
        for f in futures:
            try:
                f.result(60)
                acked += 1
            except Exception as exc:  # reported; the bench goes on
                res.note(f"Consumer ack: {type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - t0
        res.consumer_credit = consumer.credit
    return acked, elapsed


def run_mode(mode: str, data: Path, endpoint: str, args: argparse.Namespace,
             tag: str = "") -> Result:
    res = Result(mode)
    bucket = f"bench-{mode}{tag}"
    _create_bucket(endpoint, bucket)
    settings = ["tier.upload=true", *_tier(endpoint, bucket, f"bench-{mode}")]
    data = data / f"{mode}{tag}"
    if mode == "durable":
        settings += ["tier.durable_ack=true", f"tier.durable_ack_ms={args.durable_ack_ms}"]
    print(f"[{mode}] starting broker: {' '.join(s for s in settings if 'secret' not in s)}",
          flush=True)
    srv = ServerProcess(data, *settings)
    spy = None
    if args.profile and mode == "durable":  # the durable broker, every phase
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        spy = subprocess.Popen([pyspy, "record", "--nonblocking", "-p", str(srv.proc.pid),
                                "-o", args.profile, "-f", "raw"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with ChronomqClient(srv.target, timeout_s=60) as c:
            c.create_topic("bench", queue_count=4)
            c.create_topic("backlog", queue_count=4)
            ok, failed, took = _stream(c, "backlog", args.backlog, args.seconds * 3, res)
            print(f"[{mode}] backlog: {ok:,} sent ({failed} failed) in {took:.1f} s; "
                  f"tier caught up {_settle(c, args.settle):.1f} s later", flush=True)

            for _ in range(10):  # warm-up (connection, first segment, ...)
                c.send_one("bench", BODY)
            lat: list[float] = []
            before = c.stats()
            end = time.monotonic() + args.seconds
            for _ in range(args.sends):
                if time.monotonic() > end:
                    break
                t0 = time.perf_counter()
                try:
                    c.send_one("bench", BODY)
                except Exception as exc:  # reported; the bench goes on
                    res.send_errors += 1
                    res.note(f"Send: {type(exc).__name__}: {exc}")
                    continue
                lat.append((time.perf_counter() - t0) * 1000)
            lat.sort()
            res.sends = len(lat)
            res.p50, res.p99 = _pct(lat, 0.5), _pct(lat, 0.99)
            res.max = lat[-1] if lat else float("nan")
            after = c.stats()
            commits = after["tier.commits"] - before["tier.commits"]
            res.commit_ms = 1000 * (after["tier.commit_seconds"] - before["tier.commit_seconds"]
                                    ) / max(commits, 1)
            print(f"[{mode}] unary Send: {res.sends} ok, {res.send_errors} failed; "
                  f"p50 {res.p50:.1f} ms, p99 {res.p99:.1f} ms; {commits:.0f} tier commits "
                  f"meanwhile, {res.commit_ms:.1f} ms each", flush=True)

            res.stream_msgs, res.stream_errors, res.stream_s = _stream(
                c, "bench", args.messages, args.seconds, res)
            print(f"[{mode}] SendStream: {res.stream_msgs:,} ok, {res.stream_errors} failed "
                  f"in {res.stream_s:.2f} s: {res.stream_rate:,.0f} msgs/s", flush=True)

            settled = _settle(c, args.settle)
            res.producer_msgs, res.producer_errors, res.producer_s = _producer(
                c, "bench", args.messages, args.seconds, res, args.producer_in_flight)
            print(f"[{mode}] Producer (tier caught up {settled:.1f} s first): "
                  f"{res.producer_msgs:,} ok, {res.producer_errors} failed in "
                  f"{res.producer_s:.2f} s: {res.producer_rate:,.0f} msgs/s (window "
                  f"{res.producer_window} batches)", flush=True)

            settled = _settle(c, args.settle)
            res.sub_msgs, res.sub_s = _subscribe(c, "backlog", args.backlog, args.seconds)
            print(f"[{mode}] Subscribe (tier caught up {settled:.1f} s first): "
                  f"{res.sub_msgs:,} popped+acked in {res.sub_s:.2f} s: "
                  f"{res.sub_rate:,.0f} msgs/s", flush=True)
            if res.sub_msgs < args.backlog:
                res.note(f"Subscribe: {res.sub_msgs} of {args.backlog} received in "
                         f"{args.seconds} s")
            settled = _settle(c, args.settle)
            res.consumer_msgs, res.consumer_s = _consumer(c, "backlog", args.backlog,
                                                          args.seconds, res,
                                                          args.consumer_prefetch)
            print(f"[{mode}] Consumer (tier caught up {settled:.1f} s first): "
                  f"{res.consumer_msgs:,} taken+acked in {res.consumer_s:.2f} s: "
                  f"{res.consumer_rate:,.0f} msgs/s (credit {res.consumer_credit})",
                  flush=True)
            _at_latency(res, args.s3_latency_ms)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        code = srv.terminate()
        if code != 0:
            res.note(f"broker exited {code}: {''.join(srv.output[-5:])}")
    return res


def _at_latency(res: Result, latency_ms: float) -> None:
    """The figures issue 52 asks for at an S3 latency: a lone Send in round trips (goal
    for durable-ack: p50 <= 2.5, p99 <= 4) and the Producer and Consumer rates."""
    def trips(ms: float) -> str:
        return f" = {ms / latency_ms:.1f} round trips" if latency_ms > 0 else ""

    where = f"S3 latency {latency_ms:g} ms" if latency_ms > 0 else "no S3 latency added"
    print(f"[{res.mode}] at {where}: lone Send p50 {res.p50:.1f} ms{trips(res.p50)}, "
          f"p99 {res.p99:.1f} ms{trips(res.p99)}; tier commit {res.commit_ms:.1f} ms"
          f"{trips(res.commit_ms)}; Producer {res.producer_rate:,.0f} msgs/s; Consumer "
          f"{res.consumer_rate:,.0f} msgs/s", flush=True)


def _table(local: Result, durable: Result, args: argparse.Namespace) -> None:
    def ratio(d: float, lo: float) -> str:
        return f"{d / lo:.2f}x" if lo > 0 else "-"

    goal = args.durable_ack_ms + 20
    rows = [
        (f"unary Send p50 (ms, {local.sends}/{durable.sends} sends)",
         f"{local.p50:.1f}", f"{durable.p50:.1f}", ratio(durable.p50, local.p50)),
        ("unary Send p99 (ms)", f"{local.p99:.1f}", f"{durable.p99:.1f}",
         ratio(durable.p99, local.p99)),
        ("unary Send max (ms)", f"{local.max:.1f}", f"{durable.max:.1f}",
         ratio(durable.max, local.max)),
        ("unary Send failures", str(local.send_errors), str(durable.send_errors), ""),
        (f"SendStream (msgs/s, batches of {BATCH})", f"{local.stream_rate:,.0f}",
         f"{durable.stream_rate:,.0f}", ratio(durable.stream_rate, local.stream_rate)),
        ("SendStream failures", str(local.stream_errors), str(durable.stream_errors), ""),
        (f"Producer (msgs/s, in_flight {args.producer_in_flight or 'default'})",
         f"{local.producer_rate:,.0f}",
         f"{durable.producer_rate:,.0f}", ratio(durable.producer_rate, local.producer_rate)),
        ("Producer failures", str(local.producer_errors), str(durable.producer_errors), ""),
        (f"Subscribe pop+ack (msgs/s, credit {CREDIT})", f"{local.sub_rate:,.0f}",
         f"{durable.sub_rate:,.0f}", ratio(durable.sub_rate, local.sub_rate)),
        ("Consumer take+ack (msgs/s, defaults)", f"{local.consumer_rate:,.0f}",
         f"{durable.consumer_rate:,.0f}", ratio(durable.consumer_rate, local.consumer_rate)),
    ]
    w = max(len(r[0]) for r in rows)
    print()
    print(f"{args.s3} S3 over HTTP; 100 B bodies; durable_ack_ms={args.durable_ack_ms}")
    print(f"{'':{w}}  {'local':>10}  {'durable':>10}  {'dur/local':>9}")
    for name, lo, du, rt in rows:
        print(f"{name:{w}}  {lo:>10}  {du:>10}  {rt:>9}")
    print(f"durable unary p99 {durable.p99:.1f} ms = {durable.p99 / durable.commit_ms:.1f} "
          f"tier commits of {durable.commit_ms:.1f} ms (goal: at most 2)")
    verdict = "met" if durable.p99 <= goal else "MISSED"
    print(f"durable unary p99 {durable.p99:.1f} ms vs goal durable_ack_ms + 20 = {goal} ms: "
          f"{verdict}")
    for res in (local, durable):
        for e in res.errors:
            print(f"  [{res.mode}] {e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=300, help="sequential unary sends")
    ap.add_argument("--messages", type=int, default=50_000, help="SendStream messages")
    ap.add_argument("--backlog", type=int, default=20_000,
                    help="messages pre-filled for the Subscribe phase")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="cap on each measured phase")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="longest wait for the tier to catch up between phases")
    ap.add_argument("--durable-ack-ms", type=int, default=50)
    ap.add_argument("--producer-in-flight", type=int, default=None,
                    help="the Producer's batches in flight (default: the Producer's)")
    ap.add_argument("--consumer-prefetch", type=int, default=None,
                    help="the Consumer's credit, fixed (default: the Consumer's, which "
                    "follows the stream)")
    ap.add_argument("--s3", choices=["moto", "seaweed"], default="moto")
    ap.add_argument("--profile", default="", help="py-spy the durable broker into this "
                    "file (collapsed stacks)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="local and durable in turn, this many times (a table each)")
    ap.add_argument("--mode", choices=["local", "durable"], action="append",
                    help="run only this mode (repeatable; default both)")
    ap.add_argument("--s3-latency-ms", type=float, default=0.0,
                    help="delay every S3 request from the brokers by this much through "
                    "the fault proxy (default 0: no proxy)")
    ap.add_argument("--quick", action="store_true",
                    help="small run (~30 s): 300 sends, 20k stream, 5k backlog")
    args = ap.parse_args()
    if args.quick:
        args.sends, args.messages, args.backlog = 300, 20_000, 5_000
        args.seconds, args.settle = 15.0, 10.0
    modes = args.mode or ["local", "durable"]

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-durable-") as tmp, \
            _s3(args.s3, Path(tmp)) as upstream, \
            _delayed(upstream, args.s3_latency_ms) as endpoint:
        print(f"{args.s3} S3 at {upstream}", flush=True)
        if endpoint != upstream:
            print(f"every S3 request delayed {args.s3_latency_ms:g} ms by the fault proxy "
                  f"at {endpoint}", flush=True)
        for round_ in range(args.rounds):
            results: dict[str, Result] = {}
            order = modes if round_ % 2 == 0 else modes[::-1]
            for mode in order:
                results[mode] = run_mode(mode, Path(tmp), endpoint, args, f"-{round_}")
            if len(results) == 2:
                _table(results["local"], results["durable"], args)
            else:
                for r in results.values():
                    for e in r.errors:
                        print(f"  [{r.mode}] {e}")
    print(f"total {time.monotonic() - t0:.0f} s")


@contextmanager
def _s3(kind: str, tmp: Path) -> Iterator[str]:
    """An S3 endpoint for the run: moto in a process of its own, or SeaweedFS."""
    if kind == "seaweed":
        from testkit.s3 import start_seaweed
        server = start_seaweed(tmp / "seaweed", "bench-warm")
        try:
            yield server.endpoint
        finally:
            server.stop()
        return
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    moto = ctx.Process(target=_moto, args=(q, stop), daemon=True)
    moto.start()
    try:
        host, port = q.get(timeout=60)
        yield f"http://{host}:{port}"
    finally:
        stop.set()
        moto.join(15)
        if moto.is_alive():
            moto.kill()


@contextmanager
def _delayed(upstream: str, latency_ms: float) -> Iterator[str]:
    """``upstream`` itself, or at a latency the fault proxy before it (its own process,
    so its threads do not wait for this one's GIL)."""
    if latency_ms <= 0:
        yield upstream
        return
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    proxy = ctx.Process(target=_latency_proxy, args=(upstream, latency_ms, q, stop),
                        daemon=True)
    proxy.start()
    try:
        yield q.get(timeout=60)
    finally:
        stop.set()
        proxy.join(15)
        if proxy.is_alive():
            proxy.kill()


if __name__ == "__main__":
    main()
