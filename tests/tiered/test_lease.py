"""Broker leases with a manual clock on a real provider (local directory): acquire and
renew, expiry judged by the watcher's own clock, one winner among survivors, the least
loaded first, fencing strictly before a takeover can happen, a taken-over broker
refused for good."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.errors import Unavailable
from tiered.lease import BrokerLease, LeaseWatch, TakenOver, lease_path, margin_s, successor
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


def test_an_expired_lease_has_one_winner_and_the_holder_is_fenced_first(
        tmp_path: Path) -> None:
    tier = LocalProvider(str(tmp_path))
    clock = Clock()
    a, b, c = (_lease(tier, n, clock, load) for n, load in (("a", 5), ("b", 1), ("c", 2)))
    for lease in (a, b, c):
        lease.acquire()
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
