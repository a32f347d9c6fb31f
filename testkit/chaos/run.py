"""The failover chaos, start to end (``bench/bench_failover.py`` is its command line,
``tests/chronomq/test_failover_chaos.py`` its short mode).

Four brokers (``testkit.chaos.cluster``) on one bucket, one topic created on each of three
(the fourth, a spare, is the least loaded survivor: it takes an owner over, so the three
topics stay with three owners instead of merging at each failover); the clients of
``testkit.chaos.workload`` run all along.  Each cycle aims at one topic (in turn), takes
the broker that serves it now, creates a topic ``z<n>`` there, fills it (20 sends),
drains and acks it, deletes it (each OK ledgered), and at once applies a fault
(``testkit.chaos.faults``, the kinds in turn, shuffled per round by the seed), then:

* times the unavailability of the victim's topics: from the fault to the first OK of a
  sender's send begun after it (STUCK if none within ``recover_s``);
* heals: a broker whose current life was taken over is retired (one that rejoined as a
  new incarnation is kept), one that exited by itself is reported (BROKER_EXITED) and
  retired; new names join until four are alive;
* before the next fault, checks that each topic is served by exactly the broker the
  bucket names (TWO_OWNERS when another still serves it ``settle_s`` later), and
  ledgers wherever a deleted topic is still listed or owned (``TopicSeen``).

At the end the workload stops (its schedules deleted), every topic is drained, each
deleted topic is looked for and popped at every live broker, and the ledger is checked
(``testkit.chaos.check``).
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from store.names import INCARNATION_SEP
from testkit.chaos.check import Outcome, check_all, drain
from testkit.chaos.cluster import Cluster
from testkit.chaos.faults import FAULTS, KINDS, Fault
from testkit.chaos.workload import GROUP, Workload
from testkit.ledger import (
    AckOk,
    SendAttempt,
    SendOk,
    TopicDeleted,
    make_body,
    now_ms,
)
from testkit.s3 import start_moto, start_seaweed
from tiered.providers.s3 import S3Provider, S3Settings

BUCKET = "failover-chaos"
DELETED_FILL = 20  # messages sent, drained and acked in a topic before it is deleted


@dataclass(frozen=True)
class Plan:
    cycles: int
    lease_s: float
    kinds: tuple[str, ...] = KINDS
    seed: int = 1
    s3: str = "seaweed"  # or "moto"
    topics: int = 3  # one created on each of as many brokers ...
    spares: int = 1  # ... and brokers holding none: a survivor that takes an owner
    #                  over without merging two owners' topics
    settle_s: float = 30.0  # a second server of a topic is a violation after this
    drain_grace_s: float = 600.0  # the drain gives up once nothing came this long
    root: Path | None = None  # default: a new temporary directory
    log_level: str = "WARNING"  # the brokers' (INFO shows every takeover step)

    @property
    def brokers(self) -> int:
        return self.topics + self.spares

    @property
    def recover_s(self) -> float:
        """How long a fault's topics may go without an OK before it counts as STUCK."""
        return max(6 * self.lease_s + 60, 240)


@dataclass
class Result:
    root: Path
    faults: list[tuple[Fault, float | None]] = field(default_factory=list)  # , unavailable
    deleted: list[str] = field(default_factory=list)  # topics deleted before a fault
    outcome: Outcome | None = None
    violations: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    send_s: list[float] = field(default_factory=list)  # the senders' OK sends, sorted

    def gaps(self, kind: str) -> list[float]:
        return sorted(g for f, g in self.faults if f.kind == kind and g is not None)


def _schedule(plan: Plan, rng: random.Random) -> list[str]:
    kinds: list[str] = []
    while len(kinds) < plan.cycles:
        round_ = list(plan.kinds)
        rng.shuffle(round_)
        kinds += round_
    return kinds[: plan.cycles]


def run(plan: Plan, say: Callable[[str], None] = print) -> Result:
    unknown = set(plan.kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; use {', '.join(KINDS)}")
    rng = random.Random(plan.seed)
    root = plan.root or Path(tempfile.mkdtemp(prefix="bench-failover-"))
    result = Result(root)
    server = None
    if plan.s3 == "seaweed":
        server = start_seaweed(root / "seaweed", BUCKET)
        endpoint = server.endpoint
    else:
        endpoint = start_moto(BUCKET)
    topics = [f"t{i}" for i in range(plan.topics)]
    cluster = Cluster(root, endpoint, BUCKET, plan.lease_s, topics, plan.log_level)
    workload: Workload | None = None
    try:
        for topic in topics:
            with ChronomqClient(cluster.spawn().address) as c:
                c.create_topic(topic, queue_count=2)
        for _ in range(plan.spares):
            cluster.spawn()

        def routed() -> RoutedClient:
            tier = S3Provider(S3Settings(bucket=BUCKET, endpoint_url=endpoint,
                                         access_key_id="testing", secret_access_key="testing",
                                         connect_timeout_s=2, read_timeout_s=5))
            return RoutedClient(BrokerDirectory(tier=tier, timeout_s=5), follow_s=120)
        workload = Workload(routed, topics, cluster.addresses, plan.lease_s, plan.seed)
        workload.start()
        _warm_up(workload, topics)
        say(f"{plan.brokers} brokers ({plan.spares} spare) on {plan.s3} ({endpoint}), "
            f"topics {', '.join(topics)}, tier.lease_s = {plan.lease_s:g}, seed {plan.seed}; "
            f"data in {root}")
        since = time.monotonic()
        for n, kind in enumerate(_schedule(plan, rng), 1):
            try:
                fault, gap = _cycle(plan, cluster, workload, topics[(n - 1) % len(topics)],
                                    kind, rng, f"z{n}", result.deleted)
            except RuntimeError as exc:  # nobody serves a topic: no more faults
                result.violations.append(f"STUCK before cycle {n}: {exc}")
                say(result.violations[-1])
                break
            result.faults.append((fault, gap))
            result.violations += fault.violations
            shown = f"{gap:6.2f} s" if gap is not None else "  none"
            say(f"cycle {n:2d} {kind:18s} {fault.victim:10s} {','.join(fault.topics):8s} "
                f"unavailable {shown}; {'; '.join(fault.notes)} "
                f"({workload.ok_count()} OK so far; {_send_figures(workload, since)})")
            since = time.monotonic()
            result.violations += _single_owners(plan, cluster, topics)
            workload.ledger.append(*cluster.seen(result.deleted))
        time.sleep(2)
        t0 = time.monotonic()
        workload.stop()
        say(f"clients stopped ({time.monotonic() - t0:.1f} s); draining")
        for stack in workload.stuck:
            say(f"a client thread did not stop: {stack}")
        result.errors = dict(workload.errors)
        result.send_s = sorted(ok - start for t in topics for start, ok in workload.oks[t])
        drain_s = drain(routed, topics, workload, plan.drain_grace_s, say)
        workload.ledger.append(*cluster.seen(result.deleted))
        _pop_deleted(cluster, workload, result.deleted)
        claims = {}
        for life in (p for b in cluster.brokers.values() for p in b.lives):
            lease = cluster.lease(life)
            if lease.get("taken_by"):
                claims[life] = (str(lease["taken_by"]), int(str(lease.get("claimed_ms", 0))))
        result.outcome = check_all(workload, claims)
        result.outcome.drain_s = drain_s
        result.violations += result.outcome.violations
    finally:
        if workload is not None:
            workload.stop()
            workload.ledger.dump(root / "ledger.jsonl")
        cluster.stop()
        cluster.write_logs(root / "logs")
        if server is not None:
            server.stop()
    return result


def _send_figures(workload: Workload, since: float) -> str:
    """The senders' OK sends begun since ``since``: how many, their median time."""
    took = sorted(ok - start for t in workload.topics for start, ok in list(workload.oks[t])
                  if start > since)
    if not took:
        return "no sender OK"
    return f"sender: {len(took)} OK, p50 {1000 * took[len(took) // 2]:.0f} ms"


def _warm_up(workload: Workload, topics: list[str]) -> None:
    deadline = time.monotonic() + 120
    while any(len(workload.oks[t]) < 10 for t in topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no sends accepted 120 s after the start: {workload.errors}")
        time.sleep(0.2)


def _cycle(plan: Plan, cluster: Cluster, workload: Workload, topic: str, kind: str,
           rng: random.Random, doomed: str, deleted: list[str]) -> tuple[Fault, float | None]:
    owner = cluster.owner(topic)
    victim = cluster.by_prefix(owner)
    if victim is None or not victim.alive:
        alive = [b.prefix for b in cluster.live() if b.alive]
        raise RuntimeError(f"topic {topic}'s owner is {owner or 'unknown'}; alive: {alive}")
    fault = Fault(kind, victim.prefix, [t for t in cluster.topics
                                      if cluster.owner(t) == victim.prefix])
    try:
        _create_fill_delete(victim.address, doomed, workload)
        deleted.append(doomed)
    except RpcError as exc:
        fault.notes.append(f"topic {doomed} not deleted: {exc.code.name} {exc.details}")
    FAULTS[kind](cluster, victim, rng, fault)
    workload.ledger.append(*fault.entries)
    gap = _unavailable(plan, workload, fault)
    if gap is None:
        fault.violations.append(f"STUCK {fault.topics}: no send accepted {plan.recover_s:g} s "
                                f"after {kind} of {victim.name}")
    _heal(plan, cluster, fault)
    fault.notes += _takeover_figures(cluster, fault.victim, fault.at_ms)
    return fault, gap


def _takeover_figures(cluster: Cluster, departed: str, fault_ms: int) -> list[str]:
    """When ``departed``'s lease was claimed (after the fault) and what the broker that
    took it over recorded (its local state file)."""
    lease = cluster.lease(departed)
    taker = str(lease.get("taken_by", ""))
    if not taker:
        return []
    claimed = (int(str(lease.get("claimed_ms", 0))) - fault_ms) / 1000
    out = f"claimed by {taker} at +{claimed:.1f} s"
    # (a rejoined incarnation, ``<name>--<n>``, runs in its name's data directory)
    path = cluster.root / taker.split(INCARNATION_SEP)[0] / "takeovers" / f"{departed}.json"
    with contextlib.suppress(ValueError, OSError):
        state = json.loads(path.read_text())
        if not state.get("done"):
            return [out + ", its takeover not done yet"]
        out += (f", sends accepted {float(state.get('accepting_after_s', -1)):.1f} s later, "
                f"done after {float(state.get('seconds', -1)):.1f} s, "
                f"{state.get('pending', '?')} pending")
        if isinstance(state.get("phases"), dict):
            out += " [" + ", ".join(f"{k} {float(v):.1f}" for k, v in state["phases"].items()
                                    if float(v) >= 0.1) + "]"
    return [out]


def _unavailable(plan: Plan, workload: Workload, fault: Fault) -> float | None:
    """Seconds from the fault to the first OK of a send begun after it, the longest of
    the fault's topics; None if one got none within ``recover_s``."""
    deadline = fault.at + plan.recover_s
    gaps = []
    for topic in fault.topics:
        while (ok := workload.first_ok_after(topic, fault.at)) is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        gaps.append(ok - fault.at)
    return max(gaps, default=0.0)


def _create_fill_delete(address: str, topic: str, workload: Workload) -> None:
    """Create ``topic`` at ``address``, send ``DELETED_FILL``, pop and ack them all, then
    delete it: every OK ledgered (the delete's as ``TopicDeleted``)."""
    ledger = workload.ledger
    with ChronomqClient(address, timeout_s=30) as c:
        c.create_topic(topic, queue_count=1)
        tokens = [f"{topic}-{n}" for n in range(DELETED_FILL)]
        start = now_ms()
        ledger.append(*[SendAttempt(t, topic, start) for t in tokens])
        out = c.send([message(topic, make_body(t), message_id=t) for t in tokens])
        ledger.append(*[SendOk(t, o.message_id) for t, o in zip(tokens, out, strict=True)
                     if o.ok])
        acked, deadline = 0, time.monotonic() + 60
        while acked < sum(o.ok for o in out) and time.monotonic() < deadline:
            start = now_ms()
            got = c.pop(topic, GROUP, 32, 60, 500)
            leases = [(f"{topic}:{acked + i}", m) for i, m in enumerate(got)]
            for lease, m in leases:
                workload.delivered(lease, m, start, 60, address)
            errors = c.ack(GROUP, [m.receipt_handle for m in got])
            at = now_ms()
            ledger.append(*[AckOk(lease, m.message_id, GROUP, at)
                         for (lease, m), e in zip(leases, errors, strict=True) if not e])
            acked += len(got)
        start = now_ms()
        c.delete_topic(topic)
        ledger.append(TopicDeleted(topic, start, now_ms()))


def _pop_deleted(cluster: Cluster, workload: Workload, deleted: list[str]) -> None:
    """A Pop of every deleted topic at every live broker: what comes is ledgered (and
    named DELETED_BACK by the checker)."""
    for b in cluster.live():
        if not b.alive:
            continue
        with ChronomqClient(b.address, timeout_s=10) as c:
            for topic in deleted:
                start = now_ms()
                try:
                    got = c.pop(topic, GROUP, 32, 60, 0)
                except RpcError:
                    continue  # NOT_FOUND: as it should be
                for i, m in enumerate(got):
                    workload.delivered(f"gone:{b.prefix}:{topic}:{i}", m, start, 60,
                                              b.address)


def _heal(plan: Plan, cluster: Cluster, fault: Fault) -> None:
    for b in cluster.live():
        by = cluster.taken_by(b.prefix)
        if by:
            fault.notes.append(f"{b.name} taken over by {by}: retired")
            cluster.retire(b)
        elif not b.alive:
            tail = "".join((b.logs or [[""]])[-1][-5:]).strip()
            fault.violations.append(f"BROKER_EXITED {b.name} exited by itself: {tail}")
            cluster.retire(b)
    while len(cluster.live()) < plan.brokers:
        fault.notes.append(f"{cluster.spawn().name} joined")


def _single_owners(plan: Plan, cluster: Cluster, topics: list[str]) -> list[str]:
    """Wait until every topic is served by exactly the broker the bucket names."""
    deadline = time.monotonic() + plan.settle_s
    while True:
        wrong: dict[str, tuple[str, list[str]]] = {}
        for t in topics:
            owner, serving = cluster.owner(t), cluster.serving(t)
            if serving != [owner]:
                wrong[t] = (owner, serving)
        if not wrong:
            return []
        if time.monotonic() > deadline:
            return [f"TWO_OWNERS {t}: the bucket names {o or 'nobody'}, served by {s}"
                    for t, (o, s) in wrong.items() if len(s) > 1] or \
                   [f"STUCK {t}: the bucket names {o or 'nobody'}, served by {s or 'nobody'}"
                    for t, (o, s) in wrong.items()]
        time.sleep(0.5)
