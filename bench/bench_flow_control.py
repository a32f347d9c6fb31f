"""Per-key flow control at Pop (``pop.flowcontrol``) against ``chronomq serve``.

1. head-of-line: one hot key with HOT messages queued ahead of COLD keys with PER_COLD
   each; one Subscribe consumer acks each response at once.  Group ``limited`` has
   ``max_in_flight_per_key = 1``, group ``free`` none (the same messages, in turn): the
   time from the first receipt to the last cold message, and to the last hot one;
2. rate: ``rate_per_key = RATE`` for the hot key alone: the most hot messages any
   sliding second saw at the consumer, and the rate reached;
3. overhead: Subscribe pop+ack throughput of THROUGHPUT messages over 1,000 keys with a
   limit that never binds (``max_in_flight_per_key = 100000``) against no limit, in turn;
4. ``--keys N`` (this alone): cost at N keys, ``max_in_flight_per_key = 1`` against no
   limit, a fresh server each: N messages of N keys taken by unary Pop(32) and left in
   flight (ms a Pop: all of them, the last 1,000); then 32,000 more, half of keys in
   flight (held under the limit) and half of new keys, taken until the new ones came
   (ms a Pop); then every lease acked, 32 an Ack (ms an Ack); the server's RSS after
   each step.

    .venv/bin/python bench/bench_flow_control.py
    .venv/bin/python bench/bench_flow_control.py --hot 2000 --cold 100 --throughput 20000
    .venv/bin/python bench/bench_flow_control.py --keys 1000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess

TOPIC = "orders"


def _send(c: ChronomqClient, keyed: list[tuple[str, bytes]]) -> None:
    for i in range(0, len(keyed), 500):
        out = c.send([message(TOPIC, body, key=key) for key, body in keyed[i : i + 500]])
        assert all(o.ok for o in out), [o.error for o in out if not o.ok][:3]


def _drain(c: ChronomqClient, group: str, total: int, timeout_s: float
           ) -> list[tuple[float, str]]:
    """Receive and ack ``total`` messages over Subscribe: (receipt time, key) of each."""
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout_s
    with c.subscribe(TOPIC, group, invisible_time_s=60, max_outstanding=1024) as sub:
        for response in sub.responses():
            now = time.monotonic()
            got += [(now, m.key) for m in response.messages]
            sub.ack([m.receipt_handle for m in response.messages])
            if len(got) >= total or now > deadline:
                break
    return got


def head_of_line(tmp: Path, hot: int, cold: int, per_cold: int) -> None:
    srv = ServerProcess(tmp / "hol", "groups.limited.max_in_flight_per_key=1")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic(TOPIC, queue_count=4)
            _send(c, [("hot", b"h%d" % i) for i in range(hot)] +
                  [(f"cold-{k}", b"c") for _ in range(per_cold) for k in range(cold)])
            total = hot + cold * per_cold
            for group in ("free", "limited"):
                got = _drain(c, group, total, 600)
                t0 = got[0][0]
                last_cold = max(t for t, k in got if k != "hot") - t0
                last_hot = max(t for t, k in got if k == "hot") - t0
                print(f"head-of-line, group {group:>7}: {len(got):,} of {total:,}; last cold "
                      f"message after {last_cold:.2f} s, last hot after {last_hot:.2f} s",
                      flush=True)
    finally:
        srv.terminate()


def rate(tmp: Path, rate_per_key: int, n: int) -> None:
    srv = ServerProcess(tmp / "rate", f"groups.limited.rate_per_key={rate_per_key}")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic(TOPIC, queue_count=4)
            _send(c, [("hot", b"h%d" % i) for i in range(n)])
            got = [t for t, _ in _drain(c, "limited", n, 600)]
        most, j = 0, 0
        for i, t in enumerate(got):  # the most receipts in any window of one second
            while got[j] <= t - 1.0:
                j += 1
            most = max(most, i - j + 1)
        span = got[-1] - got[0]
        print(f"rate_per_key = {rate_per_key}: {len(got):,} hot messages in {span:.2f} s "
              f"({(len(got) - 1) / span:.1f}/s); the most in any second at the consumer: "
              f"{most}", flush=True)
    finally:
        srv.terminate()


def overhead(tmp: Path, n: int) -> None:
    for label, settings in (("no limit", ()),
                            ("limit set", ("groups.g.max_in_flight_per_key=100000",))):
        srv = ServerProcess(tmp / label.replace(" ", "-"), *settings)
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=4)
                _send(c, [(f"k{i % 1000}", b"x" * 100) for i in range(n)])
                t0 = time.monotonic()
                got = _drain(c, "g", n, 600)
                seconds = time.monotonic() - t0
            print(f"Subscribe pop+ack over 1,000 keys, {label:>9}: {len(got):,} in "
                  f"{seconds:.2f} s = {len(got) / seconds:,.0f} msgs/s", flush=True)
        finally:
            srv.terminate()


def _rss_mb(srv: ServerProcess) -> float:
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pops(c: ChronomqClient, want: Callable[[list[str]], bool]) -> tuple[list[str], list[float]]:
    """Unary Pop(32), invisible an hour, until ``want(keys so far)`` is false or 100 Pops
    in a row came back empty (a Pop that only held what it read answers with nothing):
    the receipt handles and each Pop's seconds."""
    handles: list[str] = []
    keys: list[str] = []
    took: list[float] = []
    empty = 0
    while want(keys) and empty < 100:
        t0 = time.perf_counter()
        got = c.pop(TOPIC, "g", 32, 3600)
        took.append(time.perf_counter() - t0)
        empty = 0 if got else empty + 1
        handles += [m.receipt_handle for m in got]
        keys += [m.key for m in got]
    return handles, took


def many_keys(tmp: Path, n: int) -> None:
    more = 16_000
    for label, settings in (("no limit", ()),
                            ("max_in_flight_per_key = 1", ("groups.g.max_in_flight_per_key=1",))):
        srv = ServerProcess(tmp / f"keys-{len(settings)}", *settings)
        try:
            with ChronomqClient(srv.target) as c:
                c.create_topic(TOPIC, queue_count=4)
                _send(c, [(f"k{i}", b"x" * 100) for i in range(n)])
                rss0 = _rss_mb(srv)
                handles, took = _pops(c, lambda keys: len(keys) < n)
                rss1 = _rss_mb(srv)
                print(f"{n:,} keys, {label}: {len(handles):,} leased by {len(took):,} Pops, "
                      f"{1000 * sum(took) / len(took):.2f} ms a Pop (the last 1,000: "
                      f"{1000 * sum(took[-1000:]) / len(took[-1000:]):.2f} ms); RSS "
                      f"{rss0:,.0f} MB before, {rss1:,.0f} MB with all in flight", flush=True)
                _send(c, [(f"k{i}", b"y" * 100) for i in range(more)] +
                      [(f"new{i}", b"z" * 100) for i in range(more)])
                got, took = _pops(c, lambda keys: sum(k.startswith("new") for k in keys) < more)
                handles += got
                print(f"{n:,} keys, {label}: then {more:,} of keys in flight and {more:,} new: "
                      f"{len(got):,} by {len(took):,} Pops, {1000 * sum(took) / len(took):.2f} "
                      f"ms a Pop; RSS {_rss_mb(srv):,.0f} MB", flush=True)
                t0 = time.perf_counter()
                acks = 0
                for i in range(0, len(handles), 32):
                    acks += 1
                    assert not any(c.ack("g", handles[i:i + 32]))
                seconds = time.perf_counter() - t0
                print(f"{n:,} keys, {label}: {len(handles):,} acked by {acks:,} Acks, "
                      f"{1000 * seconds / acks:.2f} ms an Ack; RSS {_rss_mb(srv):,.0f} MB",
                      flush=True)
        finally:
            srv.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hot", type=int, default=20_000)
    ap.add_argument("--cold", type=int, default=1_000)
    ap.add_argument("--per-cold", type=int, default=10)
    ap.add_argument("--rate", type=int, default=50)
    ap.add_argument("--rate-messages", type=int, default=500)
    ap.add_argument("--throughput", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=0, help="only the cost at this many keys")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        if args.keys:
            many_keys(Path(tmp), args.keys)
            return
        head_of_line(Path(tmp), args.hot, args.cold, args.per_cold)
        rate(Path(tmp), args.rate, args.rate_messages)
        overhead(Path(tmp), args.throughput)


if __name__ == "__main__":
    main()
