"""An OK-duplicate stands for its original (issue 37, finding 5): a resend of a client-chosen
id is answered OK only once the original is as durable as its own OK would have needed
(with ``tier.durable_ack``: in the tier) and the fence lets this broker answer OK at all.

Real parts: brokers with RocksDB, a CommitLog and a tier (in memory, its writes refused by
``FaultyProvider`` when a test says so), real leases; gRPC on 127.0.0.1 for the fence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

import chronomq.broker
from chronomq.broker import Broker
from chronomq.client import RpcError, message
from chronomq.config import BrokerConfig
from cluster.lease import claim
from store.clock import ManualClock
from store.errors import FailedPrecondition, Unavailable
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from tests.conftest import RunningServer, broker_config
from tests.tiered.faults import FaultyProvider
from tiered.config import TierConfig
from tiered.dispatcher import RETRY_MAX_MS
from tiered.errors import TierUnavailable
from tiered.providers.memory import MemoryProvider

MID = "order-1"  # client-chosen
UPLOAD_TIMEOUT_S = 0.5  # how long an OK waits for the tier before TierUnavailable
LEASE_S = 60  # renewed every 20 s (real time): none comes while a test runs


class Faulty(FaultyProvider):
    """``FaultyProvider`` with the conditional writes of the lease (passed through: the
    tests here fail the uploads, not the lease)."""

    def create(self, path: str, data: bytes) -> bool:
        return self.inner.create(path, data)

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        return self.inner.read_versioned(path)

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        return self.inner.swap(path, data, version)


class Env:
    """A durable-ack broker, its clock driven by hand, its tier ``faulty`` (kept across
    ``restart``); the tier's dispatcher runs on its thread."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = ManualClock()
        self.faulty = Faulty(MemoryProvider())
        monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: self.faulty)
        tier = TierConfig(provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
                          upload_timeout_s=UPLOAD_TIMEOUT_S)
        self.config = BrokerConfig(store=StoreConfig(str(root / "data")), tier=tier)
        self.broker = self._open()
        self.broker.create_topic(Topic("t", 1))

    def _open(self) -> Broker:
        b = Broker(self.config, self.clock)
        b.open()
        b.start(timer_thread=False)
        assert b.tiered is not None
        b.tiered.start()
        return b

    def send(self, message_id: str = MID) -> bool:
        """Send one message through the path every front takes; True: a duplicate."""
        now = self.clock.now_ms()
        b = self.broker
        submission = b.sender.submit([Draft(message_id, "t", "", "", b"body", b"", now, now, 0, 0)],
                                     now)
        b.sender.stored(submission)
        return submission.duplicate[0]

    def in_tier(self, message_id: str = MID) -> bool:
        """Whether the tier holds the record with ``message_id`` (what a broker taking
        this one over reads)."""
        b = self.broker
        assert b.tiered is not None
        (m,) = b.store.query_by_message_id(message_id)
        return b.tiered.durable_position() > m.commit_offset

    def recover_tier(self) -> None:
        self.faulty.refuse = ""
        self.clock.advance(RETRY_MAX_MS)  # past the back-off of the failed commits

    def restart(self) -> None:
        self.broker.stop()
        self.broker = self._open()

    def close(self) -> None:
        self.faulty.refuse = ""  # so that stopping drains
        self.broker.stop()


@contextmanager
def leased_broker(root: Path, clock: ManualClock) -> Iterator[Broker]:
    """A durable-ack broker holding its lease in the tier (``tier.failover``, renewed by
    hand: none comes while a test runs), with a topic ``t``; stopped after."""
    tier = TierConfig(provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
                      claim_topics=True, failover=True, lease_s=LEASE_S)
    broker = Broker(BrokerConfig(store=StoreConfig(str(root / "data")), tier=tier), clock)
    broker.open()
    broker.start(timer_thread=False)
    assert broker.tiered is not None
    broker.tiered.start()
    try:
        broker.start_failover("127.0.0.1:1", "")
        assert broker.lease is not None
        broker.create_topic(Topic("t", 1))
        yield broker
    finally:
        broker.stop()


def lose_the_lease(broker: Broker, clock: ManualClock, how: str) -> type[Exception]:
    """Make ``broker`` unable to answer OK: ``taken-over`` (another broker claims it and
    its next renewal finds the claim) or ``lease-lapsed`` (no renewal in time).  Returns
    the error a change gets from then on."""
    assert broker.lease is not None
    if how == "taken-over":
        assert claim(broker.tier, "broker-0", "broker-1", clock.now_ms()) == "broker-1"
        assert not broker.lease.renew()  # it finds the claim
        return FailedPrecondition
    clock.advance(LEASE_S * 1000)  # no renewal came in time
    return Unavailable


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    e = Env(tmp_path, monkeypatch)
    yield e
    e.close()


@pytest.mark.parametrize("restart", [False, True], ids=["same-broker", "after-restart"])
def test_a_resend_is_not_ok_while_the_tier_lacks_the_original(env: Env,
                                                              restart: bool) -> None:
    # Given a durable-ack broker whose tier refuses every write
    env.faulty.refuse = "/"
    # When the first send of an id is stored locally but cannot reach the tier
    with pytest.raises(TierUnavailable):
        env.send()
    assert not env.in_tier()
    if restart:  # the id is no longer remembered in memory: the index finds it
        env.restart()
    # Then its resend fails the same way while the tier still lacks the original
    with pytest.raises(TierUnavailable):
        env.send()
    assert not env.in_tier()
    # When the tier recovers, the resend is a duplicate, answered once the tier has it
    env.recover_tier()
    assert env.send() is True
    assert env.in_tier()
    assert len(env.broker.store.query_by_message_id(MID)) == 1  # stored once


@pytest.mark.parametrize("fence", ["taken-over", "lease-lapsed"])
def test_a_duplicate_passes_the_fence(tmp_path: Path, fence: str) -> None:
    # Given a broker holding its lease in the tier (tier.failover), an id sent OK
    clock = ManualClock()
    with leased_broker(tmp_path, clock) as broker:
        now = clock.now_ms()
        draft = Draft(MID, "t", "", "", b"body", b"", now, now, 0, 0)
        first = broker.sender.submit([draft], now)
        broker.sender.stored(first)
        assert first.duplicate == [False]
        # When the broker may answer no OK any more
        refused = lose_the_lease(broker, clock, fence)
        # Then the resend is refused like any change, not answered OK-duplicate
        again = broker.sender.submit([draft], clock.now_ms())
        assert again.duplicate == [True]
        with pytest.raises(refused):
            broker.sender.stored(again)


def test_a_duplicate_of_a_broker_taken_over_is_refused_over_grpc(tmp_path: Path) -> None:
    # Given a serving broker with tier.failover and durable-ack, an id sent OK
    config = broker_config(tmp_path / "data")
    config = replace(config, tier=TierConfig(
        provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
        claim_topics=True, failover=True, lease_s=LEASE_S))
    running = RunningServer(config)
    try:
        with running.client() as c:
            c.create_topic("t", queue_count=1)
            (out,) = c.send([message("t", b"body", message_id=MID)])
            assert out.ok and not out.duplicate
            # When another broker takes it over (its next renewal finds the claim)
            broker = running.server.broker
            assert broker.lease is not None
            assert claim(broker.tier, "broker-0", "broker-1",
                         running.server.clock.now_ms()) == "broker-1"
            assert not broker.lease.renew()
            # Then the resend is refused, naming the new owner
            with pytest.raises(RpcError) as refused:
                c.send([message("t", b"body", message_id=MID)])
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "broker-1" in str(refused.value)
    finally:
        running.stop()
