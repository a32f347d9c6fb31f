"""The bucket fences a stale broker (``cluster.lease``, ``tiered.durable``), on real brokers
in one process, a real local-directory tier and RocksDB.

Broker A runs with ``tier.durable_ack`` and no timing fence at all (no ``tier.failover``:
its clock never tells it anything).  A successor claims A's lease in the bucket while A
goes on serving: from that claim on, A's tier commits fail, so A answers no OK (Send,
Pop, Ack), writes nothing more to the tier, and every OK it gave is at the successor.
A broker started under a name whose data its directory does not hold, with nobody to
take that name over (no ``tier.failover``), refuses to start and leaves its lease alone;
once taken over it rejoins (``tests/chronomq/test_rejoin.py``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from cluster.layout import lease_path
from cluster.lease import claim
from store.clock import ManualClock
from store.errors import FailedPrecondition
from store.message import Draft, Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from tests.tiered.test_tiered_pop import _pop_all


def _broker(root: Path, name: str, clock: ManualClock, data: str = "") -> Broker:
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1,
                      upload_timeout_s=10)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / (data or name))), tier=tier), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    return b


def _send(b: Broker, mid: str) -> None:
    """One Send as the gRPC front makes it: submitted, then ``stored`` (the OK)."""
    now = b.clock.now_ms()
    d = Draft(mid, "t", "", "", mid.encode(), b"", now, now, 0)
    b.sender.stored(b.sender.submit([d], now))


def test_a_broker_whose_lease_was_claimed_answers_no_ok_whatever_its_clock(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    a = _broker(tmp_path, "a", manual_clock)
    try:
        a.create_topic(Topic("t", 2))
        _send(a, "before")
        (leased,) = a.pop.pop("t", "g", 1, 60)
        assert a.lease is not None and not a.lease.watched  # no timing fence at all
        assert claim(a.tier, "a", "b", manual_clock.now_ms()) == "b"  # a successor's claim
        with pytest.raises(FailedPrecondition, match="taken over by b"):
            _send(a, "after")
        with pytest.raises(FailedPrecondition, match="taken over by b"):
            a.pop.ack("g", leased.receipt_handle)
        with pytest.raises(FailedPrecondition, match="taken over by b"):
            a.pop.pop("t", "g", 1, 60)
        objects = a.tier.list("a/")
        for i in range(5):  # refused; and nothing more reaches the tier
            with pytest.raises(FailedPrecondition):
                _send(a, f"later-{i}")
        a.tiered.commit(force=True)
        assert a.tier.list("a/") == objects
        assert b'"taken_by": "b"' in a.tier.read(lease_path("a"))
    finally:
        a.stop()


def test_every_ok_of_a_broker_taken_over_mid_stream_is_at_its_successor(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """A producer sends to A one message at a time while B takes A over: each send A
    answered OK is at B (B pops it), whenever the takeover fell; after it, A refuses."""
    a = _broker(tmp_path, "a", manual_clock)
    b = _broker(tmp_path, "b", manual_clock)
    ok: list[str] = []
    refused: list[str] = []
    stop = threading.Event()
    halfway = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            mid = f"m{i:05d}"
            try:
                _send(a, mid)
                ok.append(mid)
            except FailedPrecondition:
                refused.append(mid)
                if len(refused) >= 20:
                    return
            i += 1
            if i == 30:
                halfway.set()

    try:
        a.create_topic(Topic("t", 2))
        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        assert halfway.wait(30)
        b.takeover("a", force=True)
        producer.join(60)
        stop.set()
        assert len(refused) >= 20, "A never refused after its takeover"
        at_b = set(_pop_all(b, "g"))
        lost = [m for m in ok if m not in at_b]
        assert not lost, f"{len(lost)} of {len(ok)} sends A answered OK are not at B: {lost[:5]}"
        assert not at_b & set(refused[1:]), "refused sends (after the first) reached B"
    finally:
        stop.set()
        a.stop()
        b.stop()


def test_a_broker_reborn_with_an_empty_data_directory_refuses_and_leaves_its_lease(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    a = _broker(tmp_path, "a", manual_clock)
    a.create_topic(Topic("t", 1))
    a.sender.send([draft_of(Message("", "t", b"x"))]).result(10)
    a.stop()
    lease_before = a.tier.read_versioned(lease_path("a"))
    with pytest.raises(FailedPrecondition, match="holds none of it"):
        _broker(tmp_path, "a", manual_clock, data="a-new-machine")
    assert a.tier.read_versioned(lease_path("a")) == lease_before  # survivors may take it
    again = _broker(tmp_path, "a", manual_clock)  # with its data directory: it starts
    again.stop()


def test_a_broker_that_never_uploaded_is_taken_over_with_nothing_to_carry(
        tmp_path: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    """Its lease is claimed, so it cannot come back under its name, and the takeover is
    done (was: an ERROR traceback, "has no queues in the tier", at every attempt)."""
    tier = TierConfig(provider="local", local_dir=str(tmp_path / "tier"), broker_name="a",
                      upload=True, durable_ack=True)
    a = Broker(BrokerConfig(store=StoreConfig(str(tmp_path / "a")), tier=tier), manual_clock)
    a.open()  # it died before its dispatcher ever ran: nothing but its lease in the tier
    assert not a.tier.list("a/meta/")
    b = _broker(tmp_path, "b", manual_clock)
    try:
        result = b.takeover("a", force=True)
        assert result.done and result.topics == []
        assert b'"taken_by": "b"' in b.tier.read(lease_path("a"))
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
    finally:
        b.stop()
        a.stop()
