"""kill -9 chaos: a real broker process, real gRPC, and a ledger checked after the faults.

Two producers (unary Send and SendStream) send a mix of immediate, near (wheel) and far
(TimerFlatFile) messages, by ``delay_ms`` and by ``deliver_at_ms``; two consumers of one
group pop with 2-5 s invisible times, ack most, nack some and leave 10 % to run out.
Everything is ledgered (``testkit.ledger``).  The broker is killed with SIGKILL at
seeded random moments and restarted on the same data directory.  At the end, after a
last restart, one consumer drains the group until every delayed message is due and every
lease ran out, the broker must stop with exit code 0 on SIGTERM, and the checker must find
no violation of docs/DESIGN.md's durability contract.

``run_chaos`` is the core; ``bench/bench_chaos.py`` runs it in its long mode.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError
from chronomq.v1 import broker_pb2 as pb
from testkit.checker import VIOLATION_KINDS, Report, check, check_ledgers
from testkit.ledger import (
    AckOk,
    Change,
    Delivery,
    Draft,
    Entry,
    Ledger,
    LedgeredClient,
    Release,
    SendAttempt,
    SendOk,
    drain,
    load,
    make_body,
    now_ms,
    parse_body,
)
from testkit.process import ServerProcess

TOPIC, GROUP = "chaos", "g"

# small horizons so that the far-future path (TimerFlatFiles, preload) and the tier
# upload run within seconds; rocks_horizon_ms >= preload_ahead_ms + bucket_ms
CHAOS_SETTINGS = (
    "tier.upload=true", "tier.upload_batch_ms=200", "store.segment_bytes=1048576",
    "timer.rocks_horizon_ms=2000", "timer.bucket_ms=1000", "timer.preload_ahead_ms=1000",
    "timer.wheel_window_ms=1000", "timer.preload_interval_ms=200", "timer.flat_batch_ms=200",
    "timer.load_interval_ms=100",
)
REVIVE_SLACK_MS = 1500  # a lease revives "well within a second" after its deadline


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    seed: int
    cycles: int  # kill -9 and restart this many times
    run_s: tuple[float, float]  # the workload runs this long before a kill ...
    quick_kill: float = 0.2  # ... or, this often, only 0.05-0.5 s (a crash in recovery)
    near_delay_ms: tuple[int, int] = (500, 4000)
    far_delay_ms: tuple[int, int] = (5000, 20_000)  # beyond rocks_horizon: TimerFlatFiles
    drain_grace_s: float = 20.0  # the drain gives up this long after everything is due

    @classmethod
    def ci(cls, seed: int) -> ChaosPlan:
        return cls(seed, cycles=3, run_s=(1.5, 3.5), far_delay_ms=(2500, 6000),
                   drain_grace_s=10.0)

    @classmethod
    def long(cls, seed: int, cycles: int) -> ChaosPlan:
        return cls(seed, cycles=cycles, run_s=(3.0, 10.0))


@dataclass(slots=True)
class ChaosResult:
    report: Report
    ledger_dir: Path
    restart_s: list[float]  # process start to "listening", every start after the first
    exit_code: int  # of the final SIGTERM
    server_log: list[str]  # every incarnation's output (WARNING and above)
    worker_errors: list[str]  # unexpected exceptions in the client threads (harness bugs)
    rpc_errors: list[str]  # calls the broker failed while it was not being killed

    def evidence(self, lines: int = 60) -> str:
        return "\n".join([self.report.summary(), f"ledger: {self.ledger_dir}",
                          *self.worker_errors, *self.rpc_errors[:20],
                          "server log (tail):", *self.server_log[-lines:]])


@dataclass
class _Cluster:
    """The broker as the client threads see it: up at ``target``, or down."""

    target: str = ""
    generation: int = 0
    clients: list[LedgeredClient] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)  # harness bugs
    rpc_errors: list[str] = field(default_factory=list)  # failed calls while it was up
    cond: threading.Condition = field(default_factory=threading.Condition)

    def up(self, target: str) -> None:
        with self.cond:
            self.target, self.generation = target, self.generation + 1
            self.cond.notify_all()

    def down(self) -> None:
        with self.cond:
            self.target = ""

    def wait_up(self) -> tuple[int, str] | None:
        with self.cond:
            self.cond.wait_for(lambda: self.target or self.stop.is_set(), 0.5)
            return (self.generation, self.target) if self.target else None

    def live(self, generation: int) -> bool:
        return not self.stop.is_set() and self.generation == generation and bool(self.target)

    def horizon_ms(self) -> int:
        """By then every message sent is due and every lease taken ran out."""
        return max(lc.horizon_ms for lc in self.clients)


Leased = tuple[pb.ReceivedMessage, Delivery]
_Body = Callable[[LedgeredClient, random.Random, int], None]


def _worker(cluster: _Cluster, ledger: Ledger, name: str, seed: int, body: _Body) -> None:
    """Run ``body`` against each incarnation of the broker until told to stop."""
    rnd = random.Random(f"{seed}:{name}")
    lc: LedgeredClient | None = None
    while not cluster.stop.is_set():
        up = cluster.wait_up()
        if up is None:
            continue
        generation, target = up
        with ChronomqClient(target, timeout_s=10) as client:
            if lc is None:
                lc = LedgeredClient(client, ledger, name)
                cluster.clients.append(lc)
            lc.client = client
            try:
                body(lc, rnd, generation)
            except RpcError as exc:
                if cluster.live(generation):  # not killed: the broker failed a call
                    cluster.rpc_errors.append(f"{name} at {now_ms()}: {exc}")
                time.sleep(0.05)  # killed under us: expected (a pause before wait_up again)
            except Exception as exc:  # a harness bug: the test must say so
                cluster.errors.append(f"{name}: {exc!r}")
                raise


def _drafts(plan: ChaosPlan, lc: LedgeredClient, rnd: random.Random) -> list[Draft]:
    out = []
    for _ in range(rnd.randint(3, 8)):
        kind = rnd.randrange(3)  # immediate, near, far: a third each
        delay = (0, rnd.randint(*plan.near_delay_ms), rnd.randint(*plan.far_delay_ms))[kind]
        key = f"k{rnd.randrange(32)}" if rnd.random() < 0.5 else ""
        if delay and rnd.random() < 0.5:
            out.append(lc.draft(TOPIC, deliver_at_ms=now_ms() + delay, key=key))
        else:
            out.append(lc.draft(TOPIC, delay_ms=delay or None, key=key))
    return out


def _producer(cluster: _Cluster, plan: ChaosPlan, streaming: bool) -> _Body:
    def body(lc: LedgeredClient, rnd: random.Random, generation: int) -> None:
        if streaming:
            def batches() -> Iterator[list[Draft]]:
                while cluster.live(generation):
                    yield _drafts(plan, lc, rnd)
                    time.sleep(rnd.uniform(0.005, 0.03))  # pacing the load, not a wait

            for _ in lc.send_stream(batches()):
                pass
            return
        while cluster.live(generation):
            lc.send(_drafts(plan, lc, rnd))
            time.sleep(rnd.uniform(0.005, 0.03))  # pacing the load, not a wait
    return body


def _consumer(cluster: _Cluster) -> _Body:
    def body(lc: LedgeredClient, rnd: random.Random, generation: int) -> None:
        while cluster.live(generation):
            invisible_s = rnd.randint(2, 5)
            got = lc.pop(TOPIC, GROUP, 16, invisible_s, wait_ms=300)
            acks: list[Leased] = []
            nacks: list[Leased] = []
            for item in got:
                r = rnd.random()
                if r < 0.10:
                    continue  # never acked: comes back when its lease runs out
                (nacks if r < 0.15 else acks).append(item)
            lc.ack(GROUP, acks)
            if nacks:
                delay_ms = rnd.randint(0, 1000)
                lc.nack(GROUP, nacks, delay_ms)
    return body


def _start(data: Path, restart_s: list[float] | None) -> ServerProcess:
    t0 = time.monotonic()
    srv = ServerProcess(data, *CHAOS_SETTINGS)
    if restart_s is not None:
        restart_s.append(time.monotonic() - t0)
    return srv


def run_chaos(workdir: Path, plan: ChaosPlan, say: Callable[[str], None] = print
              ) -> ChaosResult:
    """Run the chaos scenario of this module's docstring in ``workdir``."""
    data, ledgers = workdir / "data", workdir / "ledger"
    rnd = random.Random(plan.seed)
    restart_s: list[float] = []
    server_log: list[str] = []
    cluster = _Cluster()
    srv = _start(data, None)
    with ChronomqClient(srv.target) as c:
        c.create_topic(TOPIC, queue_count=4)
    cluster.up(srv.target)
    bodies = {"unary": _producer(cluster, plan, False), "stream": _producer(cluster, plan, True),
              "c1": _consumer(cluster), "c2": _consumer(cluster)}
    ledger_files = {name: Ledger(ledgers / f"{name}.jsonl") for name in bodies}
    threads = [threading.Thread(target=_worker, name=f"chaos-{name}", daemon=True,
                                args=(cluster, ledger_files[name], name, plan.seed, body))
               for name, body in bodies.items()]
    for t in threads:
        t.start()
    try:
        for cycle in range(plan.cycles):
            quick = rnd.random() < plan.quick_kill
            # a random span of real time under load before the kill: the scenario itself
            time.sleep(rnd.uniform(0.05, 0.5) if quick else rnd.uniform(*plan.run_s))
            cluster.down()
            killed_at = now_ms()
            srv.kill9()
            server_log += [f"[incarnation {cycle}] {line.rstrip()}" for line in srv.output]
            server_log.append(f"[harness] killed -9 at {killed_at}")
            if cycle < plan.cycles - 1:
                srv = _start(data, restart_s)
                cluster.up(srv.target)
                server_log.append(f"[harness] restarted, listening at {now_ms()}")
                say(f"cycle {cycle + 1}/{plan.cycles}: restarted in {restart_s[-1]:.2f} s")
    finally:
        cluster.stop.set()
        for t in threads:
            t.join(30)
        for ledger in ledger_files.values():
            ledger.close()
    srv = _start(data, restart_s)
    server_log.append(f"[harness] restarted, listening at {now_ms()}; draining")
    say(f"final restart in {restart_s[-1]:.2f} s; draining")
    drain(srv.target, ledgers, TOPIC, GROUP, cluster.horizon_ms() + REVIVE_SLACK_MS,
          plan.drain_grace_s)
    exit_code = srv.terminate()
    server_log.append(f"[harness] SIGTERM at {now_ms()}: exit code {exit_code}")
    server_log += [f"[incarnation {plan.cycles}] {line.rstrip()}" for line in srv.output]
    report = check_ledgers(ledgers, GROUP)
    return ChaosResult(report, ledgers, restart_s, exit_code, server_log, cluster.errors,
                       cluster.rpc_errors)


@pytest.mark.slow
def test_kill9_chaos_keeps_the_durability_contract(tmp_path: Path) -> None:
    # Given: producers and consumers busy against a broker killed -9 three times
    result = run_chaos(tmp_path, ChaosPlan.ci(seed=20261122))
    # Then: the broker stops cleanly and the ledger shows no violation
    assert not result.worker_errors, result.evidence()
    assert not result.rpc_errors, result.evidence()
    assert result.report.sends_ok > 500 and result.report.acks > 200, result.evidence()
    assert result.exit_code == 0, result.evidence()
    assert result.report.ok, result.evidence()


# ---------------------------------------------------------------------- the checker itself


def _send(token: str, lb_ms: int = 0, mid: str = "", topic: str = "t") -> list[Entry]:
    out: list[Entry] = [SendAttempt(token, topic, lb_ms)]
    return [*out, SendOk(token, mid)] if mid else out


def _deliver(lease: str, mid: str, token: str, start_ms: int, at_ms: int,
             invisible_time_s: int = 5, body_ok: bool = True, topic: str = "t") -> Delivery:
    return Delivery(lease, mid, "g", topic, token, body_ok, start_ms, at_ms, invisible_time_s,
                    1, "" if body_ok else "b'garbage'")


def _clean_history() -> list[Entry]:
    """A message revived after its lease, one released and redelivered after its delay,
    a delayed one delivered after its due time, every one acked in the end."""
    return [
        *_send("p:1", mid="A"), *_send("p:2", mid="B"), *_send("p:3", lb_ms=5000, mid="C"),
        _deliver("c:1", "A", "p:1", 100, 110),  # lease to 5100, never acked
        _deliver("c:2", "A", "p:1", 5000, 5300), AckOk("c:2", "A", "g", 5310),
        _deliver("c:3", "B", "p:2", 100, 110), Release("c:3", "B", "g", 200, 300),
        _deliver("c:4", "B", "p:2", 450, 600), AckOk("c:4", "B", "g", 610),
        _deliver("c:5", "C", "p:3", 4000, 5001), AckOk("c:5", "C", "g", 5010),
    ]


def test_the_checker_passes_a_clean_history() -> None:
    report = check(_clean_history(), group="g")
    assert report.ok, report.summary()
    assert (report.sends_ok, report.deliveries, report.acks, report.releases) == (3, 5, 3, 1)


BROKEN: dict[str, list[Entry]] = {
    "LOST": [*_send("p:9", mid="Z")],
    "REDELIVERED_AFTER_ACK": [_deliver("c:9", "A", "p:1", 6000, 6001)],  # A acked at 5310
    "LEASE_BROKEN": [_deliver("c:9", "A", "p:1", 200, 3000)],  # c:1 leased A until 5100
    "EARLY": [*_send("p:4", lb_ms=5000), _deliver("c:9", "D", "p:4", 4000, 4999)],
    "UNEXPECTED": [_deliver("c:9", "Q", "x:1", 100, 200)],
    "CORRUPT": [_deliver("c:9", "E", "", 100, 200, body_ok=False)],
}


@pytest.mark.parametrize("kind", VIOLATION_KINDS)
def test_the_checker_names_each_violation(kind: str) -> None:
    # Given: the clean history with one broken fact added
    report = check(_clean_history(), BROKEN[kind], group="g")
    # Then: exactly that violation is named
    assert [v.kind for v in report.violations] == [kind], report.summary()


def test_the_checker_allows_what_a_nack_or_change_of_invisible_time_allows() -> None:
    base = [*_send("p:1", mid="A"), _deliver("c:1", "A", "p:1", 100, 110)]
    shortened = [*base, Change("c:1", "A", "g", 200, 1), _deliver("c:2", "A", "p:1", 1100, 1300)]
    assert check(shortened, group="g").ok
    not_yet = [*base, Change("c:1", "A", "g", 200, 1), _deliver("c:2", "A", "p:1", 1100, 1150)]
    assert [v.kind for v in check(not_yet, group="g").violations] == ["LEASE_BROKEN"]
    early_retry = [*base, Release("c:1", "A", "g", 200, 3000),
                   _deliver("c:2", "A", "p:1", 1000, 3100)]
    assert [v.kind for v in check(early_retry, group="g").violations] == ["LEASE_BROKEN"]


def test_the_checker_sees_a_message_delivered_under_another_id_or_topic() -> None:
    entries = [*_send("p:1", mid="A"), _deliver("c:1", "B", "p:1", 100, 110),
               _deliver("c:2", "A", "p:1", 100, 110, topic="other")]
    assert [v.kind for v in check(entries, group="g").violations] == ["CORRUPT", "CORRUPT"]


def test_ledger_round_trip_skips_a_torn_last_line(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "a.jsonl")
    ledger.append(*_clean_history())
    ledger.close()
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"k": "sent", "tok')  # a client killed mid-write
    assert load(tmp_path) == _clean_history()


def test_a_damaged_body_fails_its_check() -> None:
    body = make_body("p:7", 100)
    assert parse_body(body) == ("p:7", True)
    assert parse_body(body[:-1] + b"#") == ("p:7", False)
    assert parse_body(b"no separators")[1] is False
