"""The faults of the failover chaos (``bench/bench_failover.py``), one function per kind.

Each takes the cluster (``testkit.chaos.cluster``), the broker owning the topic the cycle
aims at, a seeded ``random.Random`` and a ``Fault`` record to fill: ``at`` (monotonic
time of the fault, from which the affected topics' unavailability is measured), notes of
what happened, and violations of the restart rules:

* ``kill9-restart-now``: kill -9, started again at once with its data directory (it
  resumes its topics: its lease has not expired);
* ``kill9-restart-late``: kill -9, started again with its data directory after 1-2
  leases: once a survivor claimed its lease it must never resume that life: it rejoins
  as a new incarnation (``cluster.rejoin``: a lease and tier prefix ``<name>--<n>``),
  which this harness goes on using; else it resumes;
* ``kill9-wipe``: kill -9, data directory deleted, started again under its old name: it
  must not resume its old life: it waits for a survivor to take that over (once its
  lease expired) and rejoins as a new incarnation (kept), or refuses (retired; a new
  name joins: ``heal``);
* ``sigstop``: SIGSTOP for 1-3 leases, SIGCONT; taken over meanwhile, it must answer no
  OK (the probers ask it for one lease more) and is then retired;
* ``cut-s3``: its proxy stalls (or resets) every S3 request for 1.5-3 leases, then
  passes again: it fences itself, a survivor takes over; then as ``sigstop``;
* ``slow-s3-watcher``: a broker that owns no topic (the spare; else the one owning
  fewest, not the cycle's owner) gets 2-5 s per S3 request for 2-3 leases: its lease
  requests time out (each waits ``lease_s`` / 6), so it fences itself and is taken over
  (holding nothing, or its topics move); its slow look at the leases must claim nobody
  alive.  Its unavailability is measured on every topic.

* ``kill9-taker``: kill -9 of the owner, and the moment its lease shows ``taken_by``,
  kill -9 of the taker too, its data directory deleted (its machine lost): a third
  broker takes the taker over and finishes what it had begun (``cluster.takeover``:
  the intent in the tier, the claim inherited); both retired.  Measured on both
  brokers' topics.
* ``clock-ahead``: kill -9, started again at once with its data directory under
  libfaketime, its wall clock ``AHEAD_S`` ahead (it resumes its life, or rejoins if it
  was claimed meanwhile); it serves 2-3 leases like that (leases, ticks, timers by its
  clock), then kill -9 again, measured from there: a survivor takes it over; retired.
  Its time ahead is ledgered (``ClockAhead``: absolute due times are its clock's).
* ``restart-same-name``: kill -9; once a survivor claimed its lease, started again
  under its name with its data directory: it must rejoin as a new incarnation, and the
  harness keeps it (the fleet's size holds).

A restart that resumes a life taken over, or one whose data directory is gone, or a
rejoin whose old life was not taken over, is a violation (RESTARTED_TAKEN_OVER,
REBORN_EMPTY_STARTED, REJOINED_UNTAKEN).
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from testkit.chaos.cluster import Broker, Cluster
from testkit.ledger import ClockAhead, Entry, now_ms

KINDS = ("kill9-restart-now", "kill9-restart-late", "kill9-wipe", "sigstop", "cut-s3",
         "slow-s3-watcher", "kill9-taker", "clock-ahead", "restart-same-name")
AHEAD_S = 30


@dataclass
class Fault:
    kind: str
    victim: str  # the life (prefix) the fault struck: its lease is the one looked at
    topics: list[str]  # whose unavailability this fault is measured on
    at: float = 0.0  # monotonic
    at_ms: int = 0  # wall, for the logs
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)  # for the ledger (ClockAhead)

    def mark(self) -> None:
        self.at, self.at_ms = time.monotonic(), time.time_ns() // 1_000_000


def _restart(cluster: Cluster, b: Broker, f: Fault) -> None:
    """Start ``b`` again with its data directory: as the same life unless it was taken
    over, else as a new incarnation (``cluster.rejoin``), which this harness keeps
    using."""
    before = b.prefix
    try:
        cluster.start(b)
    except RuntimeError as exc:
        by = cluster.taken_by(b.name)
        if "taken over by" in str(exc) and by:
            f.notes.append(f"restart refused (taken over by {by})")
        else:
            f.notes.append(f"restart refused: {_reason(str(exc))}")
        cluster.retire(b)
        return
    by = cluster.taken_by(before)
    if b.prefix != before:
        if by:
            f.notes.append(f"rejoined as {b.prefix} after its takeover by {by}")
        else:
            f.violations.append(f"REJOINED_UNTAKEN {b.name} started as {b.prefix} although "
                                f"its lease {before} was not taken over")
            cluster.retire(b)
        return
    if by:
        f.violations.append(f"RESTARTED_TAKEN_OVER {b.name} started again although its lease "
                            f"says taken_by {by}")
    else:
        f.notes.append("restarted, resumed")


def _reason(text: str) -> str:
    lines = [ln for ln in text.splitlines() if "refus" in ln or "taken over" in ln
             or "holds none" in ln or "rror" in ln]
    return (lines[-1] if lines else text.splitlines()[-1] if text else "?")[:200]


def kill9_restart_now(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    f.mark()
    cluster.kill9(b)
    _restart(cluster, b, f)


def kill9_restart_late(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    f.mark()
    cluster.kill9(b)
    wait_s = rng.uniform(1, 2) * cluster.lease_s
    f.notes.append(f"down {wait_s:.1f} s")
    time.sleep(wait_s)
    _restart(cluster, b, f)


def kill9_wipe(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    f.mark()
    cluster.kill9(b)
    shutil.rmtree(b.data_dir)
    before = b.prefix
    try:  # it waits for a survivor to take its old life over, then rejoins
        cluster.start(b)
    except RuntimeError as exc:
        why = "holds none of it" if "holds none" in str(exc) else _reason(str(exc))
        f.notes.append(f"reborn empty: refused ({why})")
    else:
        by = cluster.taken_by(before)
        if b.prefix != before and by:
            f.notes.append(f"reborn empty: rejoined as {b.prefix} after its takeover by {by}")
            return
        f.violations.append(f"REBORN_EMPTY_STARTED {b.name} started with an empty data "
                            f"directory as {b.prefix}, its lease {before} not taken over")
    cluster.retire(b)


def _after_resume(cluster: Cluster, b: Broker, f: Fault) -> None:
    """One lease for the probers to ask the resumed broker for an OK; then retire it if
    it was taken over."""
    time.sleep(cluster.lease_s)
    by = cluster.taken_by(b.prefix)
    if by:
        f.notes.append(f"taken over by {by}; retired")
        cluster.retire(b)
    else:
        f.notes.append("kept its lease, resumed")


def sigstop(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    pause_s = rng.uniform(1, 3) * cluster.lease_s
    f.mark()
    cluster.signal(b, signal.SIGSTOP)
    try:
        time.sleep(pause_s)
    finally:
        cluster.signal(b, signal.SIGCONT)
    f.notes.append(f"paused {pause_s:.1f} s")
    _after_resume(cluster, b, f)


def cut_s3(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    mode = rng.choice(("stall", "reset"))
    cut_s = rng.uniform(1.5, 3) * cluster.lease_s
    f.mark()
    b.proxy.set_mode(mode)
    try:
        time.sleep(cut_s)
    finally:
        b.proxy.set_mode("pass")
    f.notes.append(f"S3 {mode} {cut_s:.1f} s")
    _after_resume(cluster, b, f)


def slow_s3_watcher(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    """``b`` (an owner) is left alone: the watcher slowed is another broker."""
    loads = {w.name: sum(cluster.owner(t) == w.prefix for t in cluster.topics)
             for w in cluster.live() if w.alive and w is not b}
    if not loads:
        f.notes.append("no watcher to slow down")
        return
    watcher = cluster.brokers[min(loads, key=lambda n: (loads[n], n))]
    f.victim, f.topics = watcher.prefix, list(cluster.topics)  # any topic may suffer
    delay_s = rng.uniform(1.0, 2.5)  # per chunk each way: 2-5 s per request
    slow_s = rng.uniform(2, 3) * cluster.lease_s
    f.mark()
    watcher.proxy.set_mode("slow", delay_s=delay_s)
    f.notes.append(f"{loads[watcher.name]} topics; S3 at {2 * delay_s:.1f} s/request for "
                   f"{slow_s:.1f} s")
    try:
        time.sleep(slow_s)
    finally:
        watcher.proxy.set_mode("pass")
    _after_resume(cluster, watcher, f)


def _claimed(cluster: Cluster, b: Broker, f: Fault) -> str:
    """The taker of ``b``'s life once one claimed it (polled closely: the moment it
    shows); "" and a violation if none did within ten leases."""
    deadline = time.monotonic() + 10 * cluster.lease_s
    while time.monotonic() < deadline:
        taker = cluster.taken_by(b.prefix)
        if taker:
            return taker
        time.sleep(0.01)
    f.violations.append(f"NOT_CLAIMED {b.prefix}: no survivor claimed its lease in "
                        f"{10 * cluster.lease_s:g} s")
    return ""


def kill9_taker(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    f.mark()
    cluster.kill9(b)
    taker = _claimed(cluster, b, f)
    if not taker:
        cluster.retire(b)
        return
    s = next((w for w in cluster.brokers.values() if w.prefix == taker), None)
    if s is None or not s.alive:
        f.notes.append(f"claimed by {taker}, not a live broker of the harness")
        cluster.retire(b)
        return
    cluster.kill9(s)  # at its claim: what it had begun is in the bucket alone
    shutil.rmtree(s.data_dir)
    f.topics = sorted({*f.topics, *(t for t in cluster.topics if cluster.owner(t) in
                                    (s.name, s.prefix))})
    f.notes.append(f"its taker {s.name} killed at its claim, its data gone")
    cluster.retire(b)
    cluster.retire(s)


def clock_ahead(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    cluster.kill9(b)
    from_ms = now_ms()
    try:
        cluster.start(b, clock_ahead_s=AHEAD_S)
    except RuntimeError as exc:
        f.mark()
        f.notes.append(f"restart {AHEAD_S} s ahead refused: {_reason(str(exc))}")
        cluster.retire(b)
        return
    run_s = rng.uniform(2, 3) * cluster.lease_s
    f.notes.append(f"ran {run_s:.1f} s as {b.prefix}, its clock {AHEAD_S} s ahead")
    time.sleep(run_s)
    f.mark()
    cluster.kill9(b)
    f.entries.append(ClockAhead(b.prefix, AHEAD_S * 1000, from_ms, now_ms()))
    taker = _claimed(cluster, b, f)
    if taker:
        f.notes.append(f"taken over by {taker}; retired")
    cluster.retire(b)


def restart_same_name(cluster: Cluster, b: Broker, rng: random.Random, f: Fault) -> None:
    f.mark()
    cluster.kill9(b)
    taker = _claimed(cluster, b, f)
    if not taker:
        cluster.retire(b)
        return
    f.notes.append(f"claimed by {taker}")
    _restart(cluster, b, f)  # resuming the life taken over: RESTARTED_TAKEN_OVER


FAULTS: dict[str, Callable[[Cluster, Broker, random.Random, Fault], None]] = {
    "kill9-restart-now": kill9_restart_now, "kill9-restart-late": kill9_restart_late,
    "kill9-wipe": kill9_wipe, "sigstop": sigstop, "cut-s3": cut_s3,
    "slow-s3-watcher": slow_s3_watcher, "kill9-taker": kill9_taker,
    "clock-ahead": clock_ahead, "restart-same-name": restart_same_name}
