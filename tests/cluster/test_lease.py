"""Broker leases with a manual clock on a real provider (local directory): acquire and
renew, expiry judged by the watcher's own clock, one winner among survivors, the least
loaded first, fencing strictly before a takeover can happen, a taken-over broker
refused for good."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chronomq.config import load_config
from chronomq.providers import make_lease_provider, make_provider
from cluster.layout import lease_path
from cluster.lease import (
    BrokerLease,
    TakenOver,
    claim,
    margin_s,
    successor,
)
from cluster.leasewatch import LeaseWatch
from store.clock import SystemClock
from store.errors import Unavailable
from testkit.proxy import FaultProxy
from tests.conftest import create_bucket
from tests.tiered.test_mount import _tier
from tiered.errors import TierUnavailable
from tiered.providers.local import LocalProvider

LEASE_S = 10.0


class Clock:
    """The project's Clock protocol, moved by hand (``t``: seconds)."""

    def __init__(self) -> None:
        self.t = 100.0

    def monotonic_ms(self) -> float:
        return self.t * 1000

    def now_ms(self) -> int:
        return int(self.t * 1000)


def _lease(tier: LocalProvider, name: str, clock: Clock, load: int = 0) -> BrokerLease:
    lease = BrokerLease(tier, name, f"{name}:1", "", LEASE_S, clock)
    lease.load = lambda: load
    return lease


def _three(root: Path) -> tuple[LocalProvider, Clock, list[BrokerLease]]:
    """a, b (least loaded) and c holding leases on a local tier."""
    tier = LocalProvider(str(root))
    clock = Clock()
    leases = [_lease(tier, n, clock, load) for n, load in (("a", 5), ("b", 1), ("c", 2))]
    for lease in leases:
        lease.acquire()
    return tier, clock, leases


def test_an_expired_lease_has_one_winner_and_the_holder_is_fenced_first(
        tmp_path: Path) -> None:
    tier, clock, (a, b, c) = _three(tmp_path)
    won: list[tuple[str, str]] = []
    watches = {x.broker: LeaseWatch(tier, x, lambda d, me=x.broker: won.append((me, d)))
               for x in (b, c)}
    for w in watches.values():
        w.step()  # first sight of every version
    a.check()  # valid
    clock.t += LEASE_S / 3
    assert a.renew() and b.renew() and c.renew()
    for w in watches.values():
        w.step()
    # a stops renewing now (dead or paused): it fences itself before anyone may take over
    fenced_at = clock.t + LEASE_S - margin_s(LEASE_S)
    while clock.t < fenced_at + 0.1:
        clock.t += 0.5
        b.renew()
        c.renew()
        for w in watches.values():
            w.step()
        assert not won, f"taken over at {clock.t}, a valid until {fenced_at}"
    with pytest.raises(Unavailable):
        a.check()
    # expiry: lease_s + margin after the watchers first saw a's last version; b (least
    # loaded) tries first, c a third of a lease later: only b wins
    for _ in range(20):
        clock.t += 0.5
        b.renew()
        c.renew()
        for w in watches.values():
            w.step()
    assert won == [("b", "a")]
    assert not a.renew()  # a comes back: it finds itself taken over
    with pytest.raises(TakenOver, match="taken over by b"):
        a.check()
    restarted = _lease(tier, "a", clock)
    with pytest.raises(TakenOver):  # a restart under the same name is refused too
        restarted.acquire()
    assert b"\"taken_by\": \"b\"" in tier.read(lease_path("a"))


def test_a_lease_renewed_in_time_is_never_taken(tmp_path: Path) -> None:
    tier = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b = _lease(tier, "a", clock), _lease(tier, "b", clock)
    a.acquire()
    b.acquire()
    won: list[str] = []
    watch = LeaseWatch(tier, b, won.append)
    for _ in range(200):  # 100 s, renewing every lease_s / 3
        clock.t += 0.5
        if int(clock.t * 2) % int(LEASE_S / 3 * 2) == 0:
            assert a.renew() and b.renew()
        watch.step()
        a.check()
    assert won == []


def test_the_successor_of_a_broker_follows_a_chain_of_takeovers(tmp_path: Path) -> None:
    """Where a taken-over broker's topics are served now (the RocketMQ front's QueryRoute
    at a broker taken over answers with it): a takes over nothing, b took a over, c took
    b over; a lease missing on the way gives no answer rather than a wrong one."""
    tier = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b, c = (BrokerLease(tier, n, f"{n}:1", f"{n}:2", LEASE_S, clock) for n in "abc")
    for lease in (a, b, c):
        lease.acquire()
    assert successor(tier, "a") is None  # holds its own topics
    for watcher, departed in ((b, a), (c, b)):  # the departed stops renewing
        watch = LeaseWatch(tier, watcher, lambda _: None)
        watch.step()
        clock.t += LEASE_S + 0.5
        assert watcher.renew() and c.renew()
        assert watch.step() == [departed.broker]
    found = successor(tier, "a")
    assert found is not None and (found.broker, found.rocketmq_address) == ("c", "c:2")
    assert successor(tier, "b") == found
    assert successor(tier, "c") is None
    tier.delete(lease_path("c"))
    assert successor(tier, "a") is None


class _SlowReads:
    """A real provider whose listing of the leases and ``read_versioned`` of one path
    each take ``read_s`` of the manual clock, during which ``during`` runs once
    (another broker's write landing while the request is in flight).  Counts the
    reads of each path."""

    def __init__(self, inner: LocalProvider, clock: Clock, path: str, read_s: float) -> None:
        self.inner, self.clock, self.path, self.read_s = inner, clock, path, read_s
        self.name = "slow"
        self.during: Callable[[], object] = lambda: None
        self.reads: dict[str, int] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def _slow(self) -> None:
        self.clock.t += self.read_s / 2
        during, self.during = self.during, lambda: None
        during()
        self.clock.t += self.read_s / 2

    def list_versions(self, prefix: str = "") -> dict[str, str]:
        if self.path.startswith(prefix):
            self._slow()
        return self.inner.list_versions(prefix)

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        self.reads[path] = self.reads.get(path, 0) + 1
        if path == self.path:
            self._slow()
        return self.inner.read_versioned(path)


def test_a_slow_read_never_makes_first_sight_earlier_than_the_write(tmp_path: Path) -> None:
    """The watcher reads its clock after each read: a renewal that lands while the read is
    in flight is first seen when the read returns, so the watcher claims the lease only
    after the holder fenced itself (was: the clock read before listing, first sight
    earlier than the write by up to the read's time, which ate the margin)."""
    inner = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b = _lease(inner, "a", clock), _lease(inner, "b", clock)
    a.acquire()
    b.acquire()
    slow = _SlowReads(inner, clock, lease_path("a"), read_s=6.0)
    won: list[str] = []
    watch = LeaseWatch(slow, b, won.append)  # type: ignore[arg-type]
    watch.step()
    slow.during = a.renew  # a's last renewal lands in the middle of the next listing
    watch.step()
    while not won:
        clock.t += 0.25
        b.renew()
        watch.step()
        if not won:
            continue
        with pytest.raises(Unavailable):  # a fenced itself before b could claim it
            a.check()


def test_a_look_reads_only_the_leases_that_changed(tmp_path: Path) -> None:
    """The leases of brokers taken over long ago stay in the bucket; a look lists them
    with their versions and reads again only those that changed (was: a read of every
    lease every ``lease_s`` / 10, 215 leases after a long chaos run, so that the watch
    fell behind and claims came seconds late)."""
    inner = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b = _lease(inner, "a", clock), _lease(inner, "b", clock)
    a.acquire()
    b.acquire()
    for n in range(30):  # retired: claimed long ago
        inner.write(lease_path(f"old{n}"), json.dumps(
            {"broker": f"old{n}", "lease_s": LEASE_S, "taken_by": "gone"}).encode())
    counting = _SlowReads(inner, clock, lease_path("none"), read_s=0.0)
    won: list[str] = []
    watch = LeaseWatch(counting, b, won.append)  # type: ignore[arg-type]
    watch.step()
    assert sum(counting.reads.values()) == 32  # the first look reads each once
    counting.reads.clear()
    clock.t += LEASE_S / 3
    a.renew()
    watch.step()
    assert counting.reads == {lease_path("a"): 1}
    clock.t += LEASE_S / 10
    watch.step()
    assert counting.reads == {lease_path("a"): 1}  # nothing changed: nothing read
    while not won:  # a stops renewing: it is still claimed on time
        clock.t += LEASE_S / 10
        b.renew()
        watch.step()
    assert won == ["a"] and clock.t - 100.0 <= LEASE_S / 3 + LEASE_S + LEASE_S / 10 + 1e-6
    with pytest.raises(Unavailable):
        a.check()


class _LostAnswers:
    """A real provider whose next ``swap`` goes in, but whose answer is lost: it raises
    (a broken connection) or says the version changed (S3 retried the PUT and answered
    412 to the retry)."""

    def __init__(self, inner: LocalProvider) -> None:
        self.inner, self.name = inner, "lost-answers"
        self.lose: str = ""  # "raise" | "conflict" | "" (answers as it should)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        new = self.inner.swap(path, data, version)
        lose, self.lose = self.lose, ""
        if lose == "raise":
            raise TierUnavailable("connection reset (injected: the write went in)")
        return None if lose == "conflict" else new


@pytest.mark.parametrize("lose", ["raise", "conflict"])
def test_a_lease_write_whose_answer_was_lost_is_read_back_not_taken_for_a_takeover(
        lose: str, tmp_path: Path) -> None:
    tier = _LostAnswers(LocalProvider(str(tmp_path)))
    clock = Clock()
    a = BrokerLease(tier, "a", "a:1", "", LEASE_S, clock)  # type: ignore[arg-type]
    a.acquire()
    tier.lose = lose
    clock.t += 1
    assert a.renew(), "a renewal that went in is a renewal"
    assert not a.taken_by
    clock.t += 1
    a.commit()  # and the chain of versions goes on from it
    assert a.renew()
    a.check()
    tier.lose = lose  # a claim whose answer is lost: read back, it is the claimer's
    b = BrokerLease(tier, "b", "b:1", "", LEASE_S, clock)  # type: ignore[arg-type]
    b.acquire()
    assert claim(tier, "a", "b", clock.now_ms()) == "b"  # type: ignore[arg-type]
    with pytest.raises(TakenOver, match="taken over by b"):
        a.commit()
    assert not a.renew()


def test_a_claim_has_one_winner_and_fences_every_later_commit(tmp_path: Path) -> None:
    tier = LocalProvider(str(tmp_path))
    clock = Clock()
    a = _lease(tier, "a", clock)
    a.acquire()
    a.commit()
    assert claim(tier, "a", "b", clock.now_ms()) == "b"
    assert claim(tier, "a", "c", clock.now_ms()) == "b"  # one decision, one record
    with pytest.raises(TakenOver):
        a.commit()
    assert claim(tier, "gone", "c", clock.now_ms()) == "c"  # a broker with no lease
    with pytest.raises(TakenOver):
        BrokerLease(tier, "gone", "", "", LEASE_S, clock).acquire()


def test_a_lease_write_against_a_stalled_s3_gives_up_within_the_lease(
        s3_endpoint: str) -> None:
    """The lease's S3 client is bounded by the lease (``chronomq.providers``): against an
    S3 that accepts connections and never answers, a renewal or a commit gives up after
    at most 2/3 of a lease (with its read-back), whatever ``tier.s3_*`` allows the
    uploads (30 s by default: was a renewal that could outlast the lease)."""
    create_bucket(s3_endpoint, "lease-stall")
    with FaultProxy(s3_endpoint) as proxy:
        config = load_config(None, [*_tier(proxy.endpoint, "lease-stall", "a"),
                                    "tier.upload=true", "tier.failover=true",
                                    "tier.claim_topics=true", "tier.lease_s=3"])
        assert config.tier.s3_read_timeout_s * config.tier.s3_max_attempts > 3
        tier = make_lease_provider(config, make_provider(config))
        lease = BrokerLease(tier, "a", "a:1", "", 3.0, SystemClock())
        lease.acquire()
        proxy.set_mode("stall")
        started = time.monotonic()
        assert not lease.renew()
        with pytest.raises(TierUnavailable):
            lease.commit()
        took_s = time.monotonic() - started
        assert took_s < 2 * (2 / 3 * 3.0) + 1.0, f"two lease writes took {took_s:.1f} s"
        proxy.set_mode("pass")
        assert lease.renew() or lease.renew()  # the answer of a stalled write may be lost
        assert not lease.taken_by


def _b_watching_a(tmp_path: Path, take_over: Callable[[str], None]
                  ) -> tuple[LocalProvider, Clock, BrokerLease, BrokerLease, LeaseWatch]:
    """a and b holding leases on a local tier, b's watch after its first look."""
    tier = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b = _lease(tier, "a", clock), _lease(tier, "b", clock)
    a.acquire()
    b.acquire()
    watch = LeaseWatch(tier, b, take_over)
    watch.step()
    return tier, clock, a, b, watch


def test_a_lease_is_claimed_the_moment_it_expires_not_at_the_next_look(
        tmp_path: Path) -> None:
    # Given a and b holding leases, b watching; a's last write seen at t0
    won: list[str] = []
    tier, clock, _, b, watch = _b_watching_a(tmp_path, won.append)
    seen_at = clock.t

    # When b looks again 0.3 s before a's lease runs out (a written no more)
    clock.t = seen_at + LEASE_S - 0.3
    assert b.renew()
    assert watch.step() == []

    # Then it knows when to look: 0.3 s from now, not a whole interval later; too
    # early, nothing is claimed; on time, from what it read (no new look), a is its
    assert watch.due_in_s() == pytest.approx(0.3)
    clock.t += 0.2
    assert watch.expire() == []
    clock.t += 0.1
    assert watch.expire() == ["a"]
    assert won == ["a"]
    assert b"\"taken_by\": \"b\"" in tier.read(lease_path("a"))
    assert watch.due_in_s() is None  # nothing more to watch


def test_a_claim_from_an_old_look_is_refused_when_the_lease_was_written_since(
        tmp_path: Path) -> None:
    # Given b's last look saw a's lease, unchanged for nearly a lease
    tier, clock, a, b, watch = _b_watching_a(tmp_path, lambda _: None)
    clock.t += LEASE_S - 0.1
    assert b.renew()
    watch.step()

    # When a writes its lease (alive, slow) and b's timer fires from that old look
    assert a.renew()
    clock.t += 0.1

    # Then b's conditional claim on the version it saw is refused: a keeps its lease
    assert watch.expire() == []
    a.check()
    assert not json.loads(tier.read(lease_path("a"))).get("taken_by")


def test_a_lease_write_lost_with_its_read_back_is_renewed_at_the_next_attempt(
        tmp_path: Path) -> None:
    """Seen in the failover chaos on a saturated machine: a renewal's answer was lost
    (a read time-out), so was its read-back; the write had gone in, and every renewal
    after it, made on the version before, was refused and read back a content that was
    not its own: the broker answered no OK for minutes, its lease never renewed."""
    # Given a renewal that went in unseen, its read-back failing too
    tier = _LostAnswers(LocalProvider(str(tmp_path)))
    clock = Clock()
    a = BrokerLease(tier, "a", "a:1", "", LEASE_S, clock)  # type: ignore[arg-type]
    a.acquire()
    reads = tier.inner.read_versioned
    tier.read_versioned = _failing  # type: ignore[method-assign]
    tier.lose = "raise"
    clock.t += 1
    assert not a.renew()
    tier.read_versioned = reads  # type: ignore[method-assign]
    # When it renews again, and again
    clock.t += LEASE_S / 3
    first = a.renew()
    clock.t += LEASE_S / 3
    # Then the lease is its own again by the second attempt at the latest, and a commit
    # passes the fence
    assert first or a.renew()
    a.commit()
    assert not a.taken_by


def _failing(path: str) -> tuple[bytes, str]:
    raise TierUnavailable(f"{path}: read time-out (injected)")
