"""At most once per id, acks honoured, across a takeover (issue 37, item 5), on real
brokers in one process, a real local-directory tier (durable-ack) and RocksDB.

A consumer holds receipt handles broker A signed; a producer sent a client-chosen id to
A and lost the answer.  A is lost (its lease claimed while it still runs: the tier's
fence stops it; its open key-index file never reached the tier) or stopped (everything
sealed), and B takes it over.  At B the old handles settle their leases (Ack, Nack,
ChangeInvisibleTime, DeadLetter: no redelivery of what was settled) and the resend is
answered duplicate (stored once); only beyond the dedupe window is an id new again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chronomq.broker import Broker
from chronomq.client import message
from chronomq.config import BrokerConfig, TierConfig
from cluster.handover import CLOCK_SLACK_MS, RESEND_HORIZON_MS, InheritedIds
from cluster.takeover import Takeover
from pop.handle import HandleCodec, InvalidReceiptHandle, ReceiptHandle
from pop.model import AlreadyRequeued, dlq_topic
from store.clock import ManualClock
from store.errors import ChronomqError
from store.message import Draft, Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from tests.conftest import RunningServer, broker_config

LEASE_S = 60  # the leases A gives
EXTENDED_S = 600  # what ChangeInvisibleTime at B gives one of them
DAY_MS = 24 * 3600 * 1000  # the default dedupe window


def _broker(root: Path, name: str, clock: ManualClock) -> Broker:
    """A broker whose every OK waits for the tier (what A answered is what B finds), the
    tier's dispatcher running; timer and revive driven by hand."""
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1, upload_timeout_s=10)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / name)), tier=tier), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    return b


class Pair:
    """Brokers A and B on one tier.  ``a_gone``: A stops (its index sealed) or, ``lost``,
    goes on running until B's claim fences it (its open index file never sealed)."""

    def __init__(self, root: Path, clock: ManualClock, lost: bool) -> None:
        self.a = _broker(root, "a", clock)
        self.b = _broker(root, "b", clock)
        self.lost = lost
        self._a_running = True

    def a_gone(self) -> None:
        if not self.lost:
            self.a.stop()
            self._a_running = False

    def stop(self) -> None:
        self.b.stop()
        if self._a_running:
            self.a.stop()


@pytest.fixture(params=["lost", "stopped"])
def pair(request: pytest.FixtureRequest, tmp_path: Path, manual_clock: ManualClock
         ) -> Iterator[Pair]:
    p = Pair(tmp_path, manual_clock, request.param == "lost")
    try:
        yield p
    finally:
        p.stop()


def _send(b: Broker, mid: str, topic: str = "t") -> bool:
    """One Send as the gRPC front makes it (submitted, then ``stored``: the OK);
    whether it was answered duplicate."""
    now = b.clock.now_ms()
    submission = b.sender.submit([Draft(mid, topic, "", "", mid.encode(), b"", now, now, 0)], now)
    b.sender.stored(submission)
    return submission.duplicate[0]


def _pop_all(b: Broker, group: str, topic: str = "t") -> list[str]:
    got: list[str] = []
    while batch := b.pop.pop(topic, group, 32, LEASE_S):
        got += [p.message.message_id for p in batch]
        b.pop.ack_many(group, [p.receipt_handle for p in batch])
    return got


def test_handles_a_signed_settle_their_leases_at_b(pair: Pair,
                                                   manual_clock: ManualClock) -> None:
    # Given A: 6 messages, all leased by group g for 60 s
    a, b = pair.a, pair.b
    a.create_topic(Topic("t", 2))
    a.sender.send([draft_of(Message("", "t", f"m{i}".encode())) for i in range(6)]).result(10)
    leased = a.pop.pop("t", "g", 6, LEASE_S)
    assert len(leased) == 6
    acked, extended, nacked, dead, late, untouched = leased
    pair.a_gone()

    # When B takes A over and the consumer settles with the handles A gave
    b.takeover("a", force=True)
    manual_clock.advance(1_000)
    b.pop.ack("g", acked.receipt_handle)
    b.pop.ack("g", acked.receipt_handle)  # twice: fine, as at A
    renewed = b.pop.change_invisible_time("g", extended.receipt_handle, EXTENDED_S)
    assert b.pop.release_many("g", [(nacked.receipt_handle, 0)]) == [None]
    assert b.pop.dead_letter_many("g", [(dead.receipt_handle, "poison")]) == [None]

    # Then: a settled handle is stale afterwards, as at A; a forged one is refused
    with pytest.raises(AlreadyRequeued):
        b.pop.ack("g", nacked.receipt_handle)
    m = late.message
    forged = HandleCodec(b"x" * 32).encode("g", ReceiptHandle(
        "t", m.queue_id, m.queue_offset, m.queue_offset, 2**40, 1))
    with pytest.raises(InvalidReceiptHandle):
        b.pop.ack("g", forged)
    # only the released message comes back before the leases end
    b.pop.revive_due()
    assert _pop_all(b, "g") == [nacked.message.message_id]
    assert _pop_all(b, "ops", dlq_topic("g", "t")) == [dead.message.message_id]
    # the consumer acks one more with A's handle just before its lease ends
    manual_clock.advance((LEASE_S - 2) * 1000)
    b.pop.ack("g", late.receipt_handle)
    # the leases run out: the one never settled comes back; acked, extended (600 s) and
    # dead-lettered ones do not
    manual_clock.advance(2_000)
    b.pop.revive_due()
    manual_clock.advance(1_000)
    b.pop.revive_due()
    assert _pop_all(b, "g") == [untouched.message.message_id]
    # the extended one only after its new invisible time, unless acked with its new handle
    b.pop.ack("g", renewed)
    manual_clock.advance(EXTENDED_S * 1000)
    b.pop.revive_due()
    assert _pop_all(b, "g") == []


def test_a_resend_after_the_takeover_is_a_duplicate(pair: Pair,
                                                    manual_clock: ManualClock) -> None:
    # Given A accepted order-1 and order-2 (their answers lost on the way back)
    a, b = pair.a, pair.b
    a.create_topic(Topic("t", 2))
    assert not _send(a, "order-1")
    assert not _send(a, "order-2")
    manual_clock.advance(60_000)
    pair.a_gone()

    # When B takes A over and the producer sends them again there, and a new one
    b.takeover("a", force=True)
    manual_clock.advance(5_000)
    assert _send(b, "order-1")  # answered duplicate
    assert _send(b, "order-1")  # and again (remembered, or looked up)
    assert not _send(b, "order-3")
    assert _send(b, "order-3")  # B's own dedupe as before

    # Then each is delivered once
    assert sorted(_pop_all(b, "g")) == ["order-1", "order-2", "order-3"]
    # beyond the resend horizon (10 minutes after the takeover) an id A stored is new
    manual_clock.advance(RESEND_HORIZON_MS + CLOCK_SLACK_MS)
    assert not _send(b, "order-2")
    assert _pop_all(b, "g") == ["order-2"]


def _server(root: Path, name: str) -> RunningServer:
    return RunningServer(replace(broker_config(root / name), tier=TierConfig(
        provider="local", local_dir=str(root / "tier"), broker_name=name, upload=True,
        durable_ack=True, durable_ack_ms=1)))


def test_over_grpc_a_resend_and_an_ack_after_the_takeover(tmp_path: Path) -> None:
    # Given a producer's order-1 accepted by A (the answer lost), a consumer's lease of it
    a = _server(tmp_path, "a")
    try:
        with a.client() as c:
            c.create_topic("t", 2)
            (sent,) = c.send([message("t", b"pay", message_id="order-1")])
            assert sent.ok and not sent.duplicate
            (leased,) = c.pop("t", "g", 1, LEASE_S)
    finally:
        a.stop()
    # When B takes A over; the producer sends order-1 again, the consumer acks there
    b = _server(tmp_path, "b")
    try:
        with b.client() as c:
            c.takeover("a", force=True)
            (again,) = c.send([message("t", b"pay", message_id="order-1")])
            assert again.ok and again.duplicate
            assert c.ack("g", [leased.receipt_handle]) == [""]
            # Then nothing is left to deliver: stored once, acked once
            assert c.pop("t", "g", 32, LEASE_S) == []
            assert c.pop("t", "other", 32, LEASE_S)[0].message_id == "order-1"
            assert c.pop("t", "other", 32, LEASE_S) == []
    finally:
        b.stop()


def test_an_ack_that_comes_while_the_takeover_runs_is_refused_or_holds(
        pair: Pair, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given A: one message leased by g for 60 s, A gone
    a, b = pair.a, pair.b
    a.create_topic(Topic("t", 1))
    assert not _send(a, "m-1")
    (leased,) = a.pop.pop("t", "g", 1, LEASE_S)
    pair.a_gone()

    # When the consumer acks with A's handle at B while B's takeover runs (between
    # serving A's backlog and adopting A's leases)
    answers: list[str] = []
    positions = Takeover._positions

    def ack_meanwhile(self: Takeover, *args: Any) -> Any:
        try:
            b.pop.ack("g", leased.receipt_handle)
            answers.append("ok")
        except (InvalidReceiptHandle, AlreadyRequeued, ChronomqError) as exc:
            answers.append(type(exc).__name__)
        return positions(self, *args)

    monkeypatch.setattr(Takeover, "_positions", ack_meanwhile)
    assert b.takeover("a", force=True).done

    # Then that Ack either was refused (the consumer tries again, or the message comes
    # back after its lease) or it holds: never "ok" and the message delivered again
    assert len(answers) == 1
    manual_clock.advance((LEASE_S + 1) * 1000)
    b.pop.revive_due()
    again = _pop_all(b, "g")
    if answers == ["ok"]:
        assert again == [], "acked OK, then delivered again"
    else:
        assert again == ["m-1"]


def test_an_ack_at_b_of_a_lease_a_gave_back_is_not_ok(
        pair: Pair, manual_clock: ManualClock) -> None:
    # Given A: a message leased by g for 60 s, then released by its consumer (Nack: a
    # copy for redelivery), and A gone
    a, b = pair.a, pair.b
    a.create_topic(Topic("t", 1))
    assert not _send(a, "m-1")
    (leased,) = a.pop.pop("t", "g", 1, LEASE_S)
    assert a.pop.release_many("g", [(leased.receipt_handle, 0)]) == [None]
    with pytest.raises(AlreadyRequeued):  # at A: given back, the ack is refused
        a.pop.ack("g", leased.receipt_handle)
    pair.a_gone()
    assert b.takeover("a", force=True).done

    # When the consumer acks with that handle at B (still within its invisible time)
    try:
        b.pop.ack("g", leased.receipt_handle)
        acked = True
    except ChronomqError:
        acked = False

    # Then B does not answer OK for a lease it does not hold: the message comes again
    assert not acked, "B answered OK to an ack of a lease A had given back"
    assert _pop_all(b, "g") == ["m-1"]


@pytest.mark.parametrize("how", ["revived", "released with a delay", "dead-lettered"])
def test_a_lease_a_replaced_just_before_it_was_lost_comes_once_at_b(
        tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    # Given A: a message leased by g, its lease run out and revived (the retry copy in
    # the retry queue) or given back for later (the copy pending in the timer), and A
    # lost before the lease's mark reached the tier (the failover chaos run of
    # 2026-11-27, cycle 2, bench/RESULTS.md)
    p = Pair(tmp_path, manual_clock, lost=True)
    try:
        a, b = p.a, p.b
        a.create_topic(Topic("t", 1))
        assert not _send(a, "m-1")
        (leased,) = a.pop.pop("t", "g", 1, LEASE_S)
        monkeypatch.setattr(a.pop._requeuer, "_mark_done", lambda *_: None)  # never made
        if how == "revived":
            manual_clock.advance((LEASE_S + 1) * 1000)
            assert a.pop.revive_due() == 1
        elif how == "dead-lettered":  # by its consumer (the DeadLetter RPC)
            assert a.pop.dead_letter_many("g", [(leased.receipt_handle, "bad")]) == [None]
        else:
            assert a.pop.release_many("g", [(leased.receipt_handle, 30_000)]) == [None]
        assert a.tiered is not None
        a.tiered.wait_durable(a.store.commitlog.confirmed_offset, 30)
        # When B takes A over and its leases run out there
        assert b.takeover("a", force=True).done
        got: list[str] = []
        for _ in range(4):
            manual_clock.advance(3_600_000)
            b.pop.revive_due()
            now = manual_clock.now_ms()
            b.timer.load_due(now)
            b.timer.deliver_due(now)
            assert b.store.wait_visible(10)
            got += _pop_all(b, "g")
        # Then the message comes once (dead-lettered: never again), and the dead-letter
        # topic holds it once
        assert got == ([] if how == "dead-lettered" else ["m-1"])
        if how == "dead-lettered":
            assert _pop_all(b, "d", dlq_topic("g", "t")) == ["m-1"]
    finally:
        p.stop()


def test_sends_are_accepted_while_the_recent_ids_are_indexed(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover waited for the key-index warm-up of every broker it holds before it
    accepted any send; in a long chain that took 6-17 s of the failover chaos's
    unavailability, though only a send with a client-chosen id looks ids up.  The
    warm-up runs beside: the takeover is done and plain sends are OK while it runs, and
    a resend of an id A stored waits for the index and is a duplicate."""
    a, b = pair.a, pair.b
    a.create_topic(Topic("t", 1))
    assert not _send(a, "order-1")
    pair.a_gone()
    release = threading.Event()
    started = threading.Event()
    warm = InheritedIds.warm

    def slow_warm(self: InheritedIds, now_ms: int) -> None:
        started.set()
        assert release.wait(30)
        warm(self, now_ms)

    monkeypatch.setattr(InheritedIds, "warm", slow_warm)
    try:
        assert b.takeover("a", force=True).done  # not waiting for the warm-up
        assert started.wait(10) and not release.is_set()
        b.sender.send([draft_of(Message("", "t", b"plain"))]).result(10)  # accepted
    finally:
        release.set()
    assert _send(b, "order-1")  # A's id: a duplicate here
    assert not _send(b, "order-2")


def test_in_a_chain_the_next_taker_reads_the_recent_ids_the_first_kept(
        tmp_path: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture
        ) -> None:
    """Each broker of a chain indexed the last minute of every broker it held again:
    the ids' warm-up grew with the chain (8-15 s in the failover chaos).  The first
    taker keeps what it read in the tier (``tiered.recentids``); the next one reads
    that, and a resend of an id any broker of the chain accepted is still a
    duplicate."""
    # Given A accepted order-1, B took A over and accepted order-2 (answers lost), each
    # lost (running until its successor's claim fences it: its open key index unsealed)
    brokers = [_broker(tmp_path, n, manual_clock) for n in "abc"]
    a, b, c = brokers
    try:
        a.create_topic(Topic("t", 2))
        assert not _send(a, "order-1")
        assert b.takeover("a", force=True).done
        assert _send(b, "order-1")  # (waits for the index of A's last minute)
        assert (tmp_path / "tier" / "a" / "index" / "recent-ids").exists()
        manual_clock.advance(1_000)
        assert not _send(b, "order-2")
        # When C takes B over, and the producer sends both again there
        with caplog.at_level("INFO", "tiered.mountindex"):
            assert c.takeover("b", force=True).done
            assert _send(c, "order-1")
            assert _send(c, "order-2")
        # Then A's last minute came from what B kept, B's was read from its queues
        assert "mount of a: 1 record(s) no sealed key-index file covers, from its " \
            "recent ids in the tier" in caplog.text
        assert "mount of b: indexed" in caplog.text
        # and each is delivered once
        assert sorted(_pop_all(c, "g")) == ["order-1", "order-2"]
    finally:
        for broker in reversed(brokers):
            broker.stop()
