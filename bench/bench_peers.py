"""chronomq side by side with the systems users would pick instead (bench/peers.py):
beanstalkd (binlog on) and a Redis sorted-set delay queue (AOF everysec), each started
fresh on loopback for every run, with the same client processes and 100-byte bodies.

Workloads, every system in turn per round (A B C A B C ...), medians over the rounds:

1. produce: 2 processes put batches of 100 for SECONDS (chronomq: one Send of 100;
   Redis: a pipeline of 100 ZADD; beanstalkd: 100 puts, its protocol has no batch);
   "1/call": the application sends one message per call (chronomq: its batching
   Producer, futures awaited every 1,000; the peers: one request per message);
   "1/call awaited": each answer awaited before the next send (chronomq's answer
   means fsynced; beanstalkd and Redis answer before their periodic fsync);
2. consume: CONSUME messages preloaded, 2 processes take and ack them (chronomq: the
   Subscribe stream, acks per response); "1/call": one message taken and acked per call
   (chronomq: its Consumer iterator; beanstalkd reserve + delete; Redis BLMOVE + LREM);
3. lateness: messages due uniformly at 2k/s and 10k/s for SECONDS (sent ahead of time
   by 2 processes; beanstalkd's each at its due time minus whole seconds, see
   bench/peers.py), 2 consumer processes; receipt - due: p50/p99/max, early ones;
4. hot second: HOT messages due at one instant; time from that instant to the last one
   consumed;
5. far future: FAR messages due 1-30 days ahead; server RSS and disk afterwards.

The machine stays in one state for all systems (only the system under test and its
clients run).  Results go to bench/RESULTS.md (section "Peers") with the command and
date; bench/peers_lateness.png plots the lateness distributions and every other figure
side by side.

    .venv/bin/python bench/bench_peers.py --quick        # under 5 minutes
    .venv/bin/python bench/bench_peers.py --rounds 3     # the full run
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import SERVERS, Server, available, body, client, due_of, rss_mb

CTX = mp.get_context("spawn")
PROCS = 2
BATCH = 100


# ---------------------------------------------------------------------- workers

def _producer(system: str, address: str, seconds: float, mode: str, out: Any) -> None:
    c = client(system, address, mode)
    sent, seq, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        c.put([(body(seq + i, 0), 0) for i in range(BATCH)])
        seq += BATCH
        sent += BATCH
    c.close()
    out.put(sent)


def _scheduler(system: str, address: str, dues: list[int], first_seq: int, out: Any) -> None:
    c = client(system, address)
    c.schedule([(body(first_seq + i, due), due) for i, due in enumerate(dues)], BATCH)
    c.close()
    if getattr(c, "missed", 0):
        print(f"  ({system}: {c.missed} of {len(dues)} puts missed their slot)", flush=True)
    out.put(len(dues))


def _consumer(system: str, address: str, total: int, done: Any, deadline: float,
              mode: str, out: Any) -> None:
    c = client(system, address, mode)
    lateness: list[float] = []
    first = 0.0
    while done.value < total and time.time() < deadline:
        got = c.take()
        if not got:
            continue
        now = time.time() * 1000
        first = first or now / 1000
        lateness += [now - due_of(b) for _, b in got]
        c.ack([h for h, _ in got])
        with done.get_lock():
            done.value += len(got)
    c.close()
    out.put((lateness, time.time(), first))


def _run(target: Callable[..., None], args_list: list[tuple[Any, ...]]) -> list[Any]:
    q = CTX.Queue()
    ps = [CTX.Process(target=target, args=(*a, q)) for a in args_list]
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return results


def _consumers(system: str, address: str, total: int, timeout_s: float,
               mode: str = "batch") -> tuple[Any, Any, Any]:
    q = CTX.Queue()
    done = CTX.Value("q", 0)
    deadline = time.time() + timeout_s
    ps = [CTX.Process(target=_consumer, args=(system, address, total, done, deadline, mode,
                                              q))
          for _ in range(PROCS)]
    for p in ps:
        p.start()
    return q, ps, done  # the caller keeps ``done`` alive until the consumers finish


def _collect(q: Any, ps: list[Any], _done: Any) -> tuple[list[float], float, float]:
    """(lateness of every message received, when the last one came, when the first)."""
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    firsts = [r[2] for r in results if r[2]]
    return ([x for r in results for x in r[0]], max(r[1] for r in results),
            min(firsts, default=0.0))


def _schedule(system: str, address: str, dues: list[int]) -> None:
    half = len(dues) // PROCS + 1
    _run(_scheduler, [(system, address, dues[i * half : (i + 1) * half], i * half)
                      for i in range(PROCS)])


# ---------------------------------------------------------------------- workloads

MODE_LABEL = {"batch": "", "single": " 1/call", "single-wait": " 1/call awaited"}


def produce(srv: Server, seconds: float, mode: str = "batch") -> dict[str, float]:
    sent = sum(_run(_producer, [(srv.name, srv.address, seconds, mode)] * PROCS))
    return {f"produce{MODE_LABEL[mode]} msgs/s": sent / seconds}


def consume(srv: Server, n: int, mode: str = "batch") -> dict[str, float]:
    _schedule(srv.name, srv.address, [0] * n)
    time.sleep(0.5)  # let the Redis mover reach the ready list
    q, ps, done = _consumers(srv.name, srv.address, n, 300, mode)
    lateness, last, first = _collect(q, ps, done)
    return {f"consume{MODE_LABEL[mode]} msgs/s": len(lateness) / (last - first)}


def lateness(srv: Server, rate: int, seconds: float,
             samples: dict[str, list[float]]) -> dict[str, float]:
    n = rate * int(seconds)
    lead_s = 3 + n / 8000  # time to send them all before the first is due
    t0 = int(time.time() * 1000 + lead_s * 1000)
    dues = [t0 + int(i * 1000 / rate) for i in range(n)]
    q, ps, done = _consumers(srv.name, srv.address, n, lead_s + seconds + 60)
    _schedule(srv.name, srv.address, dues)
    late, _, _ = _collect(q, ps, done)
    late.sort()
    samples.setdefault(f"{srv.name} {rate}/s", []).extend(late)
    pct = (lambda p: late[min(len(late) - 1, int(p * len(late)))]) if late else (lambda p: -1)
    return {f"{rate}/s lateness p50 ms": pct(0.5), f"{rate}/s lateness p99 ms": pct(0.99),
            f"{rate}/s lateness max ms": late[-1] if late else -1,
            f"{rate}/s early": float(sum(x < 0 for x in late)),
            f"{rate}/s received": float(len(late))}


def _lateness_at(rate: int, seconds: float, srv: Server,
                 samples: dict[str, list[float]]) -> dict[str, float]:
    return lateness(srv, rate, seconds, samples)


def hot(srv: Server, n: int) -> dict[str, float]:
    lead_s = 3 + n / 8000
    t0 = int(time.time() * 1000 + lead_s * 1000)
    q, ps, done = _consumers(srv.name, srv.address, n, lead_s + 300)
    _schedule(srv.name, srv.address, [t0] * n)
    late, last, _ = _collect(q, ps, done)
    return {"hot drain s": last - t0 / 1000, "hot received": float(len(late))}


def far(srv: Server, n: int) -> dict[str, float]:
    now = int(time.time() * 1000)
    rnd = random.Random(7)
    _schedule(srv.name, srv.address,
              [now + rnd.randint(86_400_000, 30 * 86_400_000) for _ in range(n)])
    time.sleep(2)  # one fsync interval for everyone
    return {"far RSS MB": rss_mb(srv.pid), "far disk MB": srv.disk_mb()}


# ---------------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, one round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(available()))
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--only", default="",
                    help="run only the workloads whose names contain one of these "
                         "comma-separated words (e.g. lateness,hot)")
    args = ap.parse_args()
    if args.quick:
        rounds, seconds, n_consume, n_hot, n_far, rates = 1, 5.0, 50_000, 50_000, 200_000, \
            (2000, 10000)
    else:
        rounds, seconds, n_consume, n_hot, n_far, rates = args.rounds, 10.0, 200_000, \
            200_000, 1_000_000, (2000, 10000)
    systems = [s for s in args.systems.split(",") if s]
    workloads: list[tuple[str, Callable[[Server, dict[str, list[float]]], dict[str, float]]]] = [
        ("produce", lambda s, _: produce(s, seconds)),
        ("produce 1/call", lambda s, _: produce(s, seconds, "single")),
        ("produce 1/call awaited", lambda s, _: produce(s, seconds, "single-wait")),
        ("consume", lambda s, _: consume(s, n_consume)),
        ("consume 1/call", lambda s, _: consume(s, n_consume // 2, "single")),
        *[(f"lateness {r}/s", partial(_lateness_at, r, seconds)) for r in rates],
        ("hot second", lambda s, _: hot(s, n_hot)),
        ("far future", lambda s, _: far(s, n_far)),
    ]
    if args.only:
        words = [w for w in args.only.split(",") if w]
        workloads = [(n, w) for n, w in workloads if any(word in n for word in words)]
    figures: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
    samples: dict[str, list[float]] = {}
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="chronomq-peers-"))
    try:
        for name, work in workloads:
            for rnd in range(rounds):
                for system in systems:  # A B C, A B C, ...
                    where = root / f"{system}-{name.replace(' ', '-').replace('/', '')}-{rnd}"
                    srv = SERVERS[system](where)
                    try:
                        t0 = time.monotonic()
                        got = work(srv, samples)
                    finally:
                        srv.stop()
                        shutil.rmtree(where, ignore_errors=True)
                    for k, v in got.items():
                        figures[system].setdefault(k, []).append(v)
                    print(f"[{time.monotonic() - started:6.0f} s] {name:>16} round {rnd + 1} "
                          f"{system:>10}: " + ", ".join(f"{k} {v:,.1f}" for k, v in got.items())
                          + f" ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = _table(figures, systems, rounds)
    print(table)
    if not args.no_write:
        cmd = "bench/bench_peers.py " + " ".join(sys.argv[1:])
        _write_results(table, cmd, rounds)
        _plot(samples, figures, Path(__file__).with_name("peers_lateness.png"))


def _table(figures: dict[str, dict[str, list[float]]], systems: list[str], rounds: int) -> str:
    peers = [s for s in systems if not s.startswith("chronomq")]
    head = ["figure", *[f"{s}" for s in systems], *[f"chronomq / {p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys(k for s in systems for k in figures[s]))
    for k in keys:
        meds = {s: statistics.median(figures[s][k]) for s in systems if k in figures[s]}
        cells = [k]
        for s in systems:
            vals = figures[s].get(k, [])
            if not vals:
                cells.append("-")
                continue
            spread = (max(vals) - min(vals)) / meds[s] * 100 if rounds > 1 and meds[s] else 0
            cells.append(f"{meds[s]:,.1f}" + (f" (±{spread / 2:.0f} %)" if rounds > 1 else ""))
        for p in peers:
            ok = "chronomq" in meds and p in meds and meds[p]
            cells.append(f"{meds['chronomq'] / meds[p]:.2f}" if ok else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_results(table: str, cmd: str, rounds: int) -> None:
    path = Path(__file__).with_name("RESULTS.md")
    text = path.read_text()
    marker = "\n## Peers (issue 7)"
    head = text.split(marker)[0].rstrip() + "\n"
    section = (f"{marker} — {date.today().isoformat()}\n\n`.venv/bin/python {cmd}` "
               f"({rounds} round(s); medians, ± half the spread between rounds as noise). "
               "Each system is started fresh for each run with its durable settings; the "
               "machine runs nothing else, in the same state for all. Lateness "
               "distributions: [`peers_lateness.png`](peers_lateness.png). Ratios are "
               "chronomq / peer: above 1 is better for throughput, below 1 for lateness, "
               "drain time, memory and disk.\n\n"
               f"{table}\n\n<!-- peers-notes -->\n")
    old_notes = text.split("<!-- peers-notes -->", 1)[1] if "<!-- peers-notes -->" in text \
        else ""
    path.write_text(head + section + old_notes.lstrip("\n"))


def _plot(samples: dict[str, list[float]], figures: dict[str, dict[str, list[float]]],
          out: Path) -> None:
    """Lateness distributions (one panel per rate), then throughput and the hot second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({k.split()[1] for k in samples}, key=lambda r: int(r.split("/")[0]))
    systems = list(figures)
    bars = [("msgs/s, higher is better", [k for k in _keys(figures) if k.endswith("msgs/s")]),
            ("hot second: s from due to the last consumed, lower is better",
             [k for k in _keys(figures) if k == "hot drain s"])]
    cols = max(len(rates), len(bars))
    fig, axes = plt.subplots(2, cols, figsize=(7 * cols, 9), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=False):
        for key, xs in sorted(samples.items()):
            if key.split()[1] != rate or not xs:
                continue
            xs = sorted(xs)
            ys = [i / len(xs) for i in range(len(xs))]
            ax.plot([max(x, 0.1) for x in xs], ys, label=key.split()[0])
        ax.set_xscale("log")
        ax.set_xlabel("lateness (receipt - due), ms, log scale")
        ax.set_ylabel("fraction of messages")
        ax.set_title(f"messages due at {rate}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    for ax, (title, keys) in zip(axes[1], bars, strict=False):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            vals = [statistics.median(figures[system][k]) if figures[system].get(k) else 0
                    for k in keys]
            ax.bar([j + i * width for j in range(len(keys))], vals, width, label=system)
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(keys))])
        ax.set_xticklabels([k.replace(" msgs/s", "") for k in keys], rotation=20,
                           ha="right")
        ax.set_title(title)
        if keys and keys[0].endswith("msgs/s"):
            ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    for row in axes:
        for ax in row:
            if not ax.has_data():
                ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def _keys(figures: dict[str, dict[str, list[float]]]) -> list[str]:
    return list(dict.fromkeys(k for f in figures.values() for k in f))


if __name__ == "__main__":
    main()
