"""Per-key flow control at Pop (``pop.flowcontrol``) against ``chronomq serve``.

1. head-of-line: one hot key with HOT messages queued ahead of COLD keys with PER_COLD
   each; one Subscribe consumer acks each response at once.  Group ``limited`` has
   ``max_in_flight_per_key = 1``, group ``free`` none (the same messages, in turn): the
   time from the first receipt to the last cold message, and to the last hot one;
2. rate: ``rate_per_key = RATE`` for the hot key alone: the most hot messages any
   sliding second saw at the consumer, and the rate reached;
3. overhead: Subscribe pop+ack throughput of THROUGHPUT messages over 1,000 keys with a
   limit that never binds (``max_in_flight_per_key = 100000``) against no limit, in turn.

    .venv/bin/python bench/bench_flow_control.py
    .venv/bin/python bench/bench_flow_control.py --hot 2000 --cold 100 --throughput 20000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hot", type=int, default=20_000)
    ap.add_argument("--cold", type=int, default=1_000)
    ap.add_argument("--per-cold", type=int, default=10)
    ap.add_argument("--rate", type=int, default=50)
    ap.add_argument("--rate-messages", type=int, default=500)
    ap.add_argument("--throughput", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronomq-bench-") as tmp:
        head_of_line(Path(tmp), args.hot, args.cold, args.per_cold)
        rate(Path(tmp), args.rate, args.rate_messages)
        overhead(Path(tmp), args.throughput)


if __name__ == "__main__":
    main()
