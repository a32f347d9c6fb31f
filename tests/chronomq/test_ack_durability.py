"""An ack answered OK is durable, also when it repeats one (issue 37: seen in the failover
chaos as "redelivered after an OK ack").  With ``tier.durable_ack``, an Ack whose write could
not reach the tier fails; the client sends it again; the entry is already marked acked in
this process, so the second Ack was answered OK at once: no write of its own, no wait for
the first one's, no fencing check.  A broker cut off from S3 thus answered OK to acks its
successor never saw, and the successor revived those leases.

Real parts: a broker with RocksDB, a CommitLog and a tier (in memory, its writes refused
by ``FaultyProvider`` when a test says so; ``test_duplicate_durability.Env``), real leases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store.clock import ManualClock
from store.message import Draft
from tests.chronomq.test_duplicate_durability import Env, leased_broker, lose_the_lease
from tiered.errors import TierUnavailable


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    e = Env(tmp_path, monkeypatch)
    yield e
    e.close()


def test_an_ack_again_is_not_ok_while_the_first_is_not_in_the_tier(env: Env) -> None:
    # Given a durable-ack broker, a message sent OK and leased (both in the tier)
    env.send()
    pop = env.broker.pop
    (got,) = pop.pop("t", "g", 1, 60)
    handle = got.receipt_handle
    # When the tier refuses every write: the ack is marked here, its record cannot go up
    env.faulty.refuse = "/"
    with pytest.raises(TierUnavailable):
        pop.ack_many("g", [handle])
    # Then the client's retry of that ack is not OK either while the tier lacks it
    with pytest.raises(TierUnavailable):
        pop.ack_many("g", [handle])
    # And once the tier recovers, the retry is answered OK (the first ack's record is in)
    env.recover_tier()
    assert pop.ack_many("g", [handle]) == [None]
    assert pop.ack_many("g", [handle]) == [None]  # and again: idempotent


@pytest.mark.parametrize("fence", ["taken-over", "lease-lapsed"])
def test_an_ack_again_passes_the_fence(tmp_path: Path, fence: str) -> None:
    # Given a broker holding its lease (tier.failover, durable-ack), a message leased and
    # acked OK
    clock = ManualClock()
    with leased_broker(tmp_path, clock) as broker:
        now = clock.now_ms()
        draft = Draft("m", "t", "", "", b"body", b"", now, now, 0, 0)
        broker.sender.stored(broker.sender.submit([draft], now))
        (got,) = broker.pop.pop("t", "g", 1, 600)
        assert broker.pop.ack_many("g", [got.receipt_handle]) == [None]
        # When the broker may answer no OK any more
        refused = lose_the_lease(broker, clock, fence)
        # Then an ack again is refused like any change, not answered OK
        with pytest.raises(refused):
            broker.pop.ack_many("g", [got.receipt_handle])
