"""CreateTopic and DeleteTopic pass the fence after their change is durable, not before
(issue 51, 2): a successor that claims the broker's lease while a change is on its way
to the tier gets it answered with an error, never OK.

Real parts: a durable-ack broker holding its lease in the tier (``tier.failover``),
RocksDB, a CommitLog, the tier in memory.  The successor's claim is made by
``ClaimOnCopy``, a provider that makes it (the real ``cluster.lease.claim``) at the
moment the catalogue's copy is written: after the fence's first check, before the OK.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import chronomq.broker
from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from cluster.lease import TakenOver, claim
from cluster.ownership import owner_of
from store.clock import ManualClock
from store.store import StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.providers.memory import MemoryProvider

LEASE_S = 60  # renewed every 20 s (real time): none comes while a test runs


class ClaimOnCopy(MemoryProvider):
    """A memory tier where, once ``armed``, the next write of the broker's catalogue
    copy is preceded by a successor's claim of its lease."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock, self.armed = clock, False

    def write(self, path: str, data: bytes) -> None:
        if self.armed and path.endswith("/topics.json"):
            self.armed = False
            assert claim(self, "broker-0", "broker-1", self.clock.now_ms()) == "broker-1"
        super().write(path, data)


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    clock = ManualClock()
    tier = ClaimOnCopy(clock)
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: tier)
    config = BrokerConfig(store=StoreConfig(str(tmp_path / "data")), tier=TierConfig(
        provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
        claim_topics=True, failover=True, lease_s=LEASE_S))
    b = Broker(config, clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    try:
        b.start_failover("127.0.0.1:1", "")
        b.mounts.claim_topics("127.0.0.1:1")
        yield b
    finally:
        b.stop()


def _claim_during_the_copy(b: Broker) -> None:
    tier = b.tier
    assert isinstance(tier, ClaimOnCopy)
    tier.armed = True


def test_a_create_the_broker_was_taken_over_during_is_not_ok(broker: Broker) -> None:
    # Given the fence lets changes through (its first check passes)
    broker.create_topic(Topic("before", 1))
    # When a successor claims the lease while the create's copy goes to the tier
    _claim_during_the_copy(broker)
    # Then the create is refused (the fence after the copy), not answered OK
    with pytest.raises(TakenOver, match="broker-1"):
        broker.create_topic(Topic("orders", 1))


def test_a_delete_the_broker_was_taken_over_during_is_not_ok(broker: Broker) -> None:
    broker.create_topic(Topic("orders", 1))
    _claim_during_the_copy(broker)
    with pytest.raises(TakenOver, match="broker-1"):
        broker.delete_topic("orders")
    # and its owner record is left for the successor to release (it is not in the
    # copy the successor reads: ``TopicOwners.release_departed``)
    owner = owner_of(broker.tier, "orders")
    assert owner is not None and owner.broker == "broker-0"
