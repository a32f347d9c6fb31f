"""Memory soak: a steady mixed load against ``chronomq serve`` for MINUTES, watching the
broker's memory, files and threads (issue 16, "bounded memory").

Load (defaults reproduce the report): RATE msgs/s sent by one process in batches every
100 ms, a third due at once and the rest delayed uniformly 1-30 s, bodies 50-2,000 B;
one consumer group pops (32 at a time, long polling) and acks everything on
CONSUMER_THREADS threads of one process.  The broker uploads to a local-directory tier
and keeps 60 s of CommitLog locally (16 MiB segments, retention every 60 s).

Every EVERY_S seconds one line: elapsed, RSS and anonymous memory (/proc/PID/status),
open files (/proc/PID/fd), threads, the broker's CPU share since the last line, the
machine's load average, the data dir and tier sizes, messages sent and acked.  At the
end: RSS at the baseline (10 min, or half the run when shorter) and at the end with
their ratio (the goal: at most 1.2), and the ledger check: every message whose Send
answered OK was received (duplicates are counted, not errors: POP is at least once).

``--memstats`` has the broker write its allocator figures (glibc heap, RocksDB
memtables and block cache; ``chronomq.memtrace``) and prints the first and last;
``--tracemalloc`` also traces Python allocations and prints the allocation sites that
grew most between the snapshot at the baseline and the last one.

    .venv/bin/python bench/bench_soak.py --minutes 1                  # short check
    .venv/bin/python bench/bench_soak.py --minutes 20 --memstats
    .venv/bin/python bench/bench_soak.py --minutes 4 --tracemalloc --snapshot-s 60
    .venv/bin/python bench/bench_soak.py --minutes 10 --env MALLOC_ARENA_MAX=2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from chronomq.memtrace import proc_status
from testkit.process import ServerProcess

TOPIC, GROUP = "soak", "soak-group"
SEQ_DIGITS = 12  # a body starts with its sequence number


def _sender(target: str, a: argparse.Namespace, stop: Any, sent: Any, out: Any) -> None:
    """Send at ``a.rate`` until ``stop``; hands back the bitmap of sequence numbers whose
    Send answered OK."""
    rnd = random.Random(1)
    ok = bytearray()
    seq = 0
    tick_s = 0.1
    per_tick = a.rate * tick_s
    owed = 0.0
    pad = bytes(rnd.getrandbits(8) for _ in range(a.body_max))
    with ChronomqClient(target) as c:
        next_at = time.monotonic()
        while not stop.is_set():
            owed += per_tick
            batch = []
            for _ in range(int(owed)):
                size = rnd.randint(a.body_min, a.body_max)
                body = (b"%0*d" % (SEQ_DIGITS, seq) + pad)[:max(size, SEQ_DIGITS)]
                delay = 0 if rnd.random() < a.immediate else rnd.randint(
                    a.delay_min_s * 1000, a.delay_max_s * 1000)
                batch.append(message(TOPIC, body, delay_ms=delay or None))
                seq += 1
            owed -= len(batch)
            if batch:
                try:
                    outcomes = c.send(batch)
                except Exception as exc:  # counted as not sent; the soak goes on
                    print(f"send failed: {exc}", flush=True)
                    outcomes = []
                ok.extend(b"\0" * (seq - len(ok)))
                first = seq - len(batch)
                for i, o in enumerate(outcomes):
                    ok[first + i] = o.ok
                with sent.get_lock():
                    sent.value += sum(o.ok for o in outcomes)
            next_at += tick_s
            time.sleep(max(0.0, next_at - time.monotonic()))
    out.put(bytes(ok))


def _consumer(target: str, threads: int, stop: Any, acked: Any, out: Any) -> None:
    """Pop + Ack until ``stop``; hands back (received bitmap, duplicates, failed acks)."""
    seen = bytearray()
    dupes = [0]
    failed = [0]
    lock = threading.Lock()

    def run() -> None:
        with ChronomqClient(target) as c:
            while not stop.is_set():
                try:
                    got = c.pop(TOPIC, GROUP, 32, 30, wait_ms=500)
                    errors = c.ack(GROUP, [m.receipt_handle for m in got]) if got else []
                except Exception as exc:
                    print(f"pop/ack failed: {exc}", flush=True)
                    time.sleep(0.5)
                    continue
                with lock:
                    failed[0] += sum(1 for e in errors if e)
                    for m, e in zip(got, errors, strict=True):
                        if e:
                            continue
                        seq = int(m.body[:SEQ_DIGITS])
                        if seq >= len(seen):
                            seen.extend(b"\0" * (seq + 1 - len(seen)))
                        dupes[0] += seen[seq]
                        seen[seq] = 1
                with acked.get_lock():
                    acked.value += len(got) - sum(1 for e in errors if e)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put((bytes(seen), dupes[0], failed[0]))


def _du_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
                total += os.stat(os.path.join(root, name)).st_size
    return total / 1e6


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sample:
    def __init__(self, t_s: float, pid: int, data: Path, tier: Path) -> None:
        status = proc_status(pid)
        self.t_s = t_s
        self.rss_mb = status.get("VmRSS", 0) / 1024
        self.anon_mb = status.get("RssAnon", 0) / 1024
        self.threads = status.get("Threads", 0)
        self.fds = len(os.listdir(f"/proc/{pid}/fd"))
        self.cpu_s = _cpu_s(pid)
        self.data_mb = _du_mb(data)
        self.tier_mb = _du_mb(tier)


def _print_memstats(path: Path) -> None:
    """One line per broker sample: where its anonymous memory is (MB)."""
    if not path.exists():
        print("(no memstats lines: run longer than one interval)")
        return
    dbs: list[str] = []
    for n, text in enumerate(path.read_text().splitlines()):
        line = json.loads(text)
        m, rocks = line["malloc"], line["rocksdb"]
        if n == 0:
            dbs = sorted(rocks)
            print("memstats (MB): anon = glibc heaps (in use + free-but-kept) + mmapped + "
                  "the rest; RocksDB memtables/block cache per database")
            print(f"{'min':>6} {'anon':>6} {'heaps':>6} {'in use':>6} {'free':>6} "
                  f"{'mmap':>6} {'python':>6} " + " ".join(f"{d + ' mem/cache':>16}"
                                                          for d in dbs))
        figures = " ".join(f"{rocks.get(d, {}).get('memtables', 0) / 1e6:8.1f}/"
                           f"{rocks.get(d, {}).get('block_cache', 0) / 1e6:<7.1f}" for d in dbs)
        print(f"{line['t_s'] / 60:6.1f} {line['anon_kb'] / 1024:6.1f} "
              f"{m.get('arena', 0) / 1e6:6.1f} {m.get('uordblks', 0) / 1e6:6.1f} "
              f"{m.get('fordblks', 0) / 1e6:6.1f} {m.get('hblkhd', 0) / 1e6:6.1f} "
              f"{line['traced_bytes'] / 1e6:6.1f} {figures}")


def _print_tracemalloc(trace_dir: Path, baseline_s: float, every_s: float, top: int) -> None:
    import tracemalloc

    snaps = sorted(trace_dir.glob("snap-*.pickle"))
    if len(snaps) < 2:
        print("(fewer than two tracemalloc snapshots: run longer than two intervals)")
        return
    first = min(len(snaps) - 2, max(0, int(baseline_s // every_s) - 1))
    old = tracemalloc.Snapshot.load(str(snaps[first]))
    new = tracemalloc.Snapshot.load(str(snaps[-1]))
    print(f"tracemalloc: growth from {snaps[first].name} to {snaps[-1].name} "
          f"(snapshots every {every_s:.0f} s), top {top} sites by growth:")
    for kind in ("lineno", "traceback") if new.traceback_limit > 1 else ("lineno",):
        for stat in new.compare_to(old, kind)[:top]:
            print(f"  {stat.size_diff / 1e6:+8.2f} MB {stat.count_diff:+9d} blocks "
                  f"(now {stat.size / 1e6:7.2f} MB)  {stat.traceback.format()[0].strip()}")
            if kind == "traceback":
                for frame in stat.traceback.format()[2::2][:6]:
                    print(f"        {frame.strip()}")
    total_old = sum(s.size for s in old.statistics("filename"))
    total_new = sum(s.size for s in new.statistics("filename"))
    print(f"  traced total {total_old / 1e6:.1f} MB -> {total_new / 1e6:.1f} MB")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=500, help="messages per second")
    ap.add_argument("--immediate", type=float, default=1 / 3, help="share due at once")
    ap.add_argument("--delay-min-s", type=int, default=1)
    ap.add_argument("--delay-max-s", type=int, default=30)
    ap.add_argument("--body-min", type=int, default=50)
    ap.add_argument("--body-max", type=int, default=2000)
    ap.add_argument("--consumer-threads", type=int, default=2)
    ap.add_argument("--every-s", type=float, default=30.0, help="seconds between lines")
    ap.add_argument("--baseline-minutes", type=float, default=10.0)
    ap.add_argument("--retention-s", type=int, default=60, help="local CommitLog retention")
    ap.add_argument("--segment-mb", type=int, default=16, help="CommitLog segment size")
    ap.add_argument("--tier-retention-s", type=int, default=0, help="0: keep forever")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="another broker setting (repeatable)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for the broker, e.g. MALLOC_ARENA_MAX=2")
    ap.add_argument("--memstats", action="store_true",
                    help="the broker samples its allocators (chronomq.memtrace)")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="the broker also takes tracemalloc snapshots")
    ap.add_argument("--snapshot-s", type=float, default=60.0,
                    help="seconds between memstats lines / snapshots")
    ap.add_argument("--frames", type=int, default=1, help="tracemalloc frames per site")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    return ap.parse_args()


def main() -> None:
    a = _parse()
    tmp = Path(tempfile.mkdtemp(prefix="chronomq-soak-"))
    data, tier, trace_dir = tmp / "data", tmp / "tier", tmp / "memtrace"
    env = dict(kv.split("=", 1) for kv in a.env)
    if a.tracemalloc or a.memstats:
        env["CHRONOMQ_TRACEMALLOC" if a.tracemalloc else "CHRONOMQ_MEMSTATS"] = str(trace_dir)
        env["CHRONOMQ_MEMTRACE_INTERVAL_S"] = str(a.snapshot_s)
        env["CHRONOMQ_TRACEMALLOC_FRAMES"] = str(a.frames)
    os.environ.update(env)  # the broker inherits them (ServerProcess passes os.environ)
    settings = ["tier.upload=true", f"tier.local_dir={tier}",
                f"tier.retention_ms={a.tier_retention_s * 1000}",
                f"store.retention_ms={a.retention_s * 1000}",
                f"store.segment_bytes={a.segment_mb << 20}",
                "server.retention_interval_s=60", *a.set]
    srv = ServerProcess(data, *settings)
    pid = srv.proc.pid
    print(f"soak: {a.rate} msgs/s for {a.minutes:g} min, {a.immediate:.0%} due at once, "
          f"the rest delayed {a.delay_min_s}-{a.delay_max_s} s, bodies {a.body_min}-"
          f"{a.body_max} B; broker pid {pid}; {' '.join(settings)}; env {env or '-'}; "
          f"{os.cpu_count()} CPUs", flush=True)
    ctx = mp.get_context("spawn")
    stop_send, stop_pop = ctx.Event(), ctx.Event()
    sent, acked = ctx.Value("q", 0), ctx.Value("q", 0)
    sent_q, got_q = ctx.Queue(), ctx.Queue()
    baseline_s = min(a.baseline_minutes * 60, a.minutes * 30)
    samples: list[Sample] = []
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic(TOPIC, queue_count=4)
        procs = [ctx.Process(target=_sender, args=(srv.target, a, stop_send, sent, sent_q)),
                 ctx.Process(target=_consumer, args=(srv.target, a.consumer_threads,
                                                     stop_pop, acked, got_q))]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        print(f"{'min':>6} {'rss MB':>7} {'anon MB':>7} {'fds':>5} {'thr':>4} {'cpu%':>5} "
              f"{'load':>5} {'data MB':>8} {'tier MB':>8} {'sent':>9} {'acked':>9}", flush=True)
        end = t0 + a.minutes * 60
        next_at = t0
        while True:
            now = time.monotonic()
            if now >= next_at:
                s = Sample(now - t0, pid, data, tier)
                cpu = 100 * (s.cpu_s - samples[-1].cpu_s) / max(1e-9, s.t_s - samples[-1].t_s) \
                    if samples else 0.0
                samples.append(s)
                print(f"{s.t_s / 60:6.1f} {s.rss_mb:7.1f} {s.anon_mb:7.1f} {s.fds:5d} "
                      f"{s.threads:4d} {cpu:5.0f} {os.getloadavg()[0]:5.2f} {s.data_mb:8.1f} "
                      f"{s.tier_mb:8.1f} {sent.value:9d} {acked.value:9d}", flush=True)
                next_at += a.every_s
            if now >= end:
                break
            time.sleep(min(1.0, max(0.0, min(next_at, end) - time.monotonic())))
        stop_send.set()
        ok = sent_q.get(timeout=60)
        drain_until = time.monotonic() + a.delay_max_s + 60
        expected = ok.count(1)
        while acked.value < expected and time.monotonic() < drain_until:
            time.sleep(0.5)
        stop_pop.set()
        seen, dupes, failed_acks = got_q.get(timeout=60)
        for p in procs:
            p.join(30)
        final = Sample(time.monotonic() - t0, pid, data, tier)
        _summary(a, samples, final, baseline_s, ok, seen, dupes, failed_acks)
    finally:
        srv.terminate()
        if a.memstats or a.tracemalloc:
            _print_memstats(trace_dir / "stats.jsonl")
        if a.tracemalloc:
            _print_tracemalloc(trace_dir, baseline_s, a.snapshot_s, a.top)
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _summary(a: argparse.Namespace, samples: list[Sample], final: Sample, baseline_s: float,
             ok: bytes, seen: bytes, dupes: int, failed_acks: int) -> None:
    base = min(samples, key=lambda s: abs(s.t_s - baseline_s))
    last = samples[-1]
    ratio = last.rss_mb / base.rss_mb
    peak = max(samples, key=lambda s: s.rss_mb)
    sent_ok = ok.count(1)
    lost = sum(1 for i, v in enumerate(ok) if v and (i >= len(seen) or not seen[i]))
    rate = sent_ok / (a.minutes * 60)
    print(f"summary: RSS at {base.t_s / 60:.1f} min {base.rss_mb:.1f} MB (anon "
          f"{base.anon_mb:.1f}), at {last.t_s / 60:.1f} min {last.rss_mb:.1f} MB (anon "
          f"{last.anon_mb:.1f}): ratio {ratio:.2f} ({'within' if ratio <= 1.2 else 'ABOVE'} "
          f"1.2); peak {peak.rss_mb:.1f} MB at {peak.t_s / 60:.1f} min; fds "
          f"{samples[0].fds}->{final.fds}, threads {samples[0].threads}->{final.threads}; "
          f"data dir max {max(s.data_mb for s in samples):.0f} MB")
    print(f"ledger: sent OK {sent_ok} ({rate:.0f} msgs/s), received {seen.count(1)}, lost "
          f"{lost}, duplicates {dupes}, failed acks {failed_acks}: "
          f"{'OK' if lost == 0 else 'MESSAGES LOST'}", flush=True)


if __name__ == "__main__":
    main()
