"""Rejoin (``cluster.rejoin``) with a manual clock on a real provider (a local
directory) and real data directories: a broker taken over, or started empty under a name
whose state is in the tier, waits for the takeover of its old incarnation, sets its old
data aside (never deleted) and runs as a new incarnation under a prefix of its own; a
lease write at start rides out a tier that fails for a while (``tier.start_timeout_s``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.layout import broker_prefix, catalogue_path, lease_path, takeover_record
from cluster.lease import BrokerLease, TakenOver, claim, read_lease
from cluster.rejoin import Rejoin, read_incarnation, set_aside
from store.clock import ManualClock
from store.errors import FailedPrecondition, Unavailable
from tiered.errors import TierUnavailable
from tiered.providers.local import LocalProvider

LEASE_S = 10.0


def _started(tier: LocalProvider, data: Path, clock: ManualClock, incarnation: int = 0,
             watched: bool = True) -> None:
    """A broker that ran: its lease, its catalogue in the tier, its data directory."""
    prefix = broker_prefix("a", incarnation)
    BrokerLease(tier, prefix, "", "", LEASE_S, clock, watched, "a", incarnation).acquire()
    tier.write(catalogue_path(prefix), b'{"version": 1, "topics": []}')
    tier.write(f"{prefix}/meta/t/0.json", b"{}")
    (data / "tiered" / "queues").mkdir(parents=True)
    (data / "commitlog").mkdir()
    (data / "commitlog" / "0.log").write_bytes(b"records")
    (data / "disk-reserve").write_bytes(b"\0")


def _rejoin(tier: LocalProvider, data: Path, clock: ManualClock,
            on_sleep: Callable[[], None] = lambda: None) -> Rejoin:
    def sleep(seconds: float) -> None:  # the manual clock moves; the tier may change
        clock.advance(int(seconds * 1000))
        on_sleep()
    return Rejoin(tier, "a", str(data), clock, start_timeout_s=60, rejoin_timeout_s=120,
                  sleep=sleep)


def _done(tier: LocalProvider, prefix: str) -> None:
    tier.write(takeover_record(prefix), json.dumps({"by": "b", "done": True}).encode())


def test_a_broker_not_taken_over_runs_as_before(tmp_path: Path) -> None:
    tier, clock, data = LocalProvider(str(tmp_path / "tier")), ManualClock(), tmp_path / "a"
    _started(tier, data, clock)
    assert _rejoin(tier, data, clock).resolve() == 0
    assert (data / "commitlog" / "0.log").exists()  # nothing moved
    assert read_incarnation(str(data)) == 0


def test_a_broker_taken_over_waits_for_the_takeover_sets_its_data_aside_and_runs_anew(
        tmp_path: Path) -> None:
    # Given a taken over while it was away, the takeover still running
    tier, clock, data = LocalProvider(str(tmp_path / "tier")), ManualClock(), tmp_path / "a"
    _started(tier, data, clock)
    assert claim(tier, "a", "b", clock.now_ms()) == "b"
    polls: list[float] = []

    def takeover_goes_on() -> None:
        polls.append(clock.monotonic_ms())
        if len(polls) == 20:  # ten seconds later it finishes
            _done(tier, "a")
    # When a starts again with its data directory
    incarnation = _rejoin(tier, data, clock, takeover_goes_on).resolve()
    # Then it waited for the done record, and runs as incarnation 1 under a new prefix
    assert len(polls) == 20
    assert incarnation == 1 and broker_prefix("a", 1) == "a--1"
    assert read_incarnation(str(data)) == 1
    aside = data / "incarnations" / "0"
    assert (aside / "commitlog" / "0.log").read_bytes() == b"records"  # set aside
    assert (aside / "tiered" / "queues").is_dir()
    assert sorted(p.name for p in data.iterdir()) == ["disk-reserve", "incarnation",
                                                      "incarnations"]
    view, _ = read_lease(tier, "a")
    assert view is not None and view.taken_by == "b"  # the old lease: the successor's


def test_an_empty_broker_under_a_name_with_state_waits_for_a_survivor(
        tmp_path: Path) -> None:
    tier, clock = LocalProvider(str(tmp_path / "tier")), ManualClock()
    _started(tier, tmp_path / "lost", clock)
    data = tmp_path / "new-machine"
    lease_before = tier.read_versioned(lease_path("a"))

    def survivor() -> None:  # the watch claims a's expired lease, then finishes
        if clock.monotonic_ms() > 12_000 + ManualClock().monotonic_ms():
            claim(tier, "a", "b", clock.now_ms())
            _done(tier, "a")
    # the lease is left alone while it waits: a survivor must be able to claim it
    checked: list[bool] = []

    def check_then_survive() -> None:
        if not checked:
            checked.append(tier.read_versioned(lease_path("a")) == lease_before)
        survivor()
    assert _rejoin(tier, data, clock, check_then_survive).resolve() == 1
    assert checked == [True]
    view, _ = read_lease(tier, "a")
    assert view is not None and view.taken_by == "b"  # the survivor's claim, not its own
    assert read_incarnation(str(data)) == 1


def test_an_empty_broker_whose_old_self_nobody_takes_over_says_what_to_run(
        tmp_path: Path) -> None:
    tier, clock = LocalProvider(str(tmp_path / "tier")), ManualClock()
    _started(tier, tmp_path / "lost", clock, watched=False)  # no tier.failover
    lease_before = tier.read_versioned(lease_path("a"))
    with pytest.raises(FailedPrecondition, match="chronomq takeover a`"):
        _rejoin(tier, tmp_path / "new", clock).resolve()
    assert tier.read_versioned(lease_path("a")) == lease_before


def test_a_lone_broker_replaced_empty_claims_its_old_self_once_its_lease_expired(
        tmp_path: Path) -> None:
    """No survivor (a one-broker cluster): after two leases of an unchanged lease the
    new life claims the old one itself; its lease watch runs the takeover."""
    tier, clock = LocalProvider(str(tmp_path / "tier")), ManualClock()
    _started(tier, tmp_path / "lost", clock)
    start = clock.monotonic_ms()
    assert _rejoin(tier, tmp_path / "new", clock).resolve() == 1
    assert clock.monotonic_ms() - start >= 2 * LEASE_S * 1000  # survivors went first
    view, _ = read_lease(tier, "a")
    assert view is not None and view.taken_by == "a--1"


def test_an_empty_broker_never_claims_an_old_self_that_still_renews(
        tmp_path: Path) -> None:
    """Another process still runs under the name (a duplicate pod): its lease keeps
    changing, so nobody claims it; the empty one gives up after the rejoin time-out."""
    tier, clock = LocalProvider(str(tmp_path / "tier")), ManualClock()
    _started(tier, tmp_path / "lost", clock)
    alive = BrokerLease(tier, "a", "", "", LEASE_S, clock, True, "a", 0)
    alive.acquire()
    with pytest.raises(FailedPrecondition, match="rejoin_timeout_s"):
        _rejoin(tier, tmp_path / "new", clock, alive.renew).resolve()
    view, _ = read_lease(tier, "a")
    assert view is not None and not view.taken_by


def test_incarnations_follow_each_other(tmp_path: Path) -> None:
    tier, clock, data = LocalProvider(str(tmp_path / "tier")), ManualClock(), tmp_path / "a"
    _started(tier, data, clock)
    claim(tier, "a", "b", clock.now_ms())
    _done(tier, "a")
    assert _rejoin(tier, data, clock).resolve() == 1
    BrokerLease(tier, "a--1", "", "", LEASE_S, clock, True, "a", 1).acquire()
    (data / "tiered" / "queues").mkdir(parents=True)
    tier.write(catalogue_path("a--1"), b"{}")
    tier.write("a--1/meta/t/0.json", b"{}")
    claim(tier, "a--1", "c", clock.now_ms())
    _done(tier, "a--1")
    # an empty disk now: the newest incarnation counts, not the first
    assert _rejoin(tier, tmp_path / "empty", clock).resolve() == 2
    BrokerLease(tier, "a--2", "", "", LEASE_S, clock, True, "a", 2).acquire()  # it runs
    assert _rejoin(tier, data, clock).resolve() == 3  # the disk of incarnation 1
    assert (data / "incarnations" / "0").is_dir() and (data / "incarnations" / "1").is_dir()


def test_a_move_aside_cut_short_goes_on_into_the_same_folder(tmp_path: Path) -> None:
    data = tmp_path / "a"
    (data / "incarnations" / "0.partial" / "commitlog").mkdir(parents=True)  # moved
    (data / "pop").mkdir()  # not moved yet
    moved = set_aside(str(data), 0)
    assert moved == str(data / "incarnations" / "0")
    assert sorted(p.name for p in (data / "incarnations" / "0").iterdir()) == [
        "commitlog", "pop"]


class _Slow:
    """A real provider that fails its first ``n`` requests (S3 making its first volume:
    read time-outs), then answers."""

    def __init__(self, inner: LocalProvider, n: int) -> None:
        self.inner, self.n = inner, n

    def _maybe_fail(self) -> None:
        if self.n > 0:
            self.n -= 1
            raise TierUnavailable("read timeout (injected)")

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        self._maybe_fail()
        return self.inner.read_versioned(path)

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        self._maybe_fail()
        return self.inner.swap(path, data, version)


def test_a_lease_acquired_at_start_rides_out_a_slow_tier_within_its_deadline(
        tmp_path: Path) -> None:
    tier, clock = _Slow(LocalProvider(str(tmp_path)), 5), ManualClock()

    def sleep(seconds: float) -> None:
        clock.advance(int(seconds * 1000))
    lease = BrokerLease(tier, "a", "", "", LEASE_S, clock)  # type: ignore[arg-type]
    lease.acquire(60.0, sleep)  # five failures, then it answers
    lease.check()
    tier.n = 1000  # a tier that never answers: given up within the deadline
    again = BrokerLease(tier, "a", "", "", LEASE_S, clock)  # type: ignore[arg-type]
    start = clock.monotonic_ms()
    with pytest.raises(Unavailable, match="start_timeout_s"):
        again.acquire(60.0, sleep)
    assert clock.monotonic_ms() - start <= 60_000
    tier.n = 0
    claim(tier.inner, "a", "b", clock.now_ms())
    with pytest.raises(TakenOver):  # taken over: never retried
        BrokerLease(tier, "a", "", "", LEASE_S, clock).acquire(60.0, sleep)  # type: ignore[arg-type]


def test_a_claim_of_its_old_self_cut_short_by_a_crash_is_not_waited_for(
        tmp_path: Path) -> None:
    """The new life claimed its old self, then crashed before its own lease: started
    again it becomes that life at once (its watch runs the takeover), instead of waiting
    out ``tier.rejoin_timeout_s`` for a takeover nobody else runs."""
    tier, clock = LocalProvider(str(tmp_path / "tier")), ManualClock()
    _started(tier, tmp_path / "old-disk", clock)
    assert claim(tier, "a", "a--1", clock.now_ms()) == "a--1"
    start = clock.monotonic_ms()
    assert _rejoin(tier, tmp_path / "new", clock).resolve() == 1
    # and so does the old life's disk, attached again meanwhile
    assert _rejoin(tier, tmp_path / "old-disk", clock).resolve() == 1
    assert clock.monotonic_ms() == start
