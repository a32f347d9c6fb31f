"""Journal snapshots bound what a takeover replays (``pop.leasejournal.Snapshots``), on
real brokers in one process, a real local-directory tier and RocksDB.

Broker A's consumers pop and ack one message at a time, so its state stream grows by a
record per Pop and per Ack; every ``tier.journal_snapshot_records`` a snapshot of its
book goes into the journal and, once the tier holds it, ``a/state/snapshot.json`` points
at it.  Broker B takes A over from the tier: it replays the state stream from that
snapshot only, yet its groups stand exactly where A's stood (nothing acked comes again,
leases in flight come back after their invisible time).  A pointer that names no
snapshot is not trusted: the whole journal is replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pop.leasejournal
from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from pop.flowcontrol import KeyLimits
from store.clock import ManualClock
from store.journal import SNAPSHOT_POINTER, read_snapshot_pointer, snapshot_pointer
from store.message import Message, draft_of
from store.names import STATE_STREAM
from store.store import StoreConfig
from store.topics import Topic
from testkit.wait import wait_until
from tests.tiered.test_tiered_pop import _pop_all
from tiered.errors import TierNotFound

EVERY = 40


def _broker(root: Path, name: str, clock: ManualClock,
            key_limits: dict[str, KeyLimits] | None = None) -> Broker:
    """A broker whose every OK waits for the tier (durable-ack: what A answered is what
    B finds), the tier's dispatcher running; timer and revive driven by hand."""
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1,
                      journal_snapshot_records=EVERY)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / name)), tier=tier,
                            key_limits=key_limits or {}), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    return b


def _pointer(b: Broker) -> int | None:
    try:
        return read_snapshot_pointer(b.tier.read(f"a/{SNAPSHOT_POINTER}"))
    except TierNotFound:
        return None


def _run_a(root: Path, clock: ManualClock) -> tuple[Broker, list[str], set[str], set[str]]:
    """A with 200 messages: 120 acked one at a time, 10 leased (60 s), the rest new."""
    a = _broker(root, "a", clock)
    a.create_topic(Topic("t", 2))
    sent = [i.message_id for i in a.sender.send([draft_of(Message("", "t", f"m{i}".encode()))
                                                 for i in range(200)]).result(10)]
    acked: set[str] = set()
    assert a.snapshots is not None
    for _ in range(120):
        (p,) = a.pop.pop("t", "g", 1, 30)
        a.pop.ack("g", p.receipt_handle)
        acked.add(p.message.message_id)
        a.snapshots.step()
    leased = {p.message.message_id for p in a.pop.pop("t", "g", 10, 60)}
    snapshots = a.snapshots

    def pointed() -> bool:  # the latest snapshot is in the tier and pointed at
        snapshots.step()
        return snapshots.pointed >= 0 and _pointer(a) == snapshots.pointed
    wait_until(pointed, 10, "the tier's pointer to name the latest snapshot")
    return a, sent, acked, leased


@pytest.mark.parametrize("pointer", ["snapshot", "damaged"])
def test_a_takeover_replays_the_journal_from_the_latest_snapshot(
        pointer: str, tmp_path: Path, manual_clock: ManualClock) -> None:
    a, sent, acked, leased = _run_a(tmp_path, manual_clock)
    records = a.journal.records()
    assert records >= 240  # a Pop and an Ack each
    at = _pointer(a)
    assert at is not None and records - 2 * EVERY <= at < records  # a recent one
    a.stop()  # (as if lost: B reads only the tier)
    if pointer == "damaged":  # names a record that starts no snapshot
        a.tier.write(f"a/{SNAPSHOT_POINTER}", snapshot_pointer(at + 1))
    b = _broker(tmp_path, "b", manual_clock)
    try:
        r = b.takeover("a", force=True)
        assert r.done and r.groups == 1
        replayed_state = r.journal_records
        if pointer == "snapshot":
            assert replayed_state < records - at + 10  # from the snapshot on, plus the
            # timer stream (empty here)
        else:
            assert replayed_state >= records  # the whole state stream
        # B's group stands where A's stood: the acked never come, the leased after 60 s
        got = _pop_all(b, "g")
        assert not set(got) & acked
        assert sorted(got) == sorted(set(sent) - acked - leased)
        manual_clock.advance(61_000)
        b.pop.revive_due()
        again = _pop_all(b, "g")
        assert sorted(again) == sorted(leased)
        assert b.store.queue_bounds(STATE_STREAM, 0)[1] > 0  # B journals its own
    finally:
        b.stop()


def _snapshotting(root: Path, clock: ManualClock, **settings: Any
                  ) -> tuple[Broker, pop.leasejournal.Snapshots]:
    """Broker a (durable-ack, ``settings`` of its tier) with topic t of 40 messages; its
    journal's snapshots are stepped by hand."""
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name="a",
                      upload=True, durable_ack=True, durable_ack_ms=1, **settings)
    a = Broker(BrokerConfig(store=StoreConfig(str(root / "a")), tier=tier), clock)
    a.open()
    a.start(timer_thread=False)
    assert a.tiered is not None and a.snapshots is not None
    a.tiered.start()
    try:
        a.create_topic(Topic("t", 1))
        a.sender.send([draft_of(Message("", "t", f"m{i}".encode()))
                       for i in range(40)]).result(10)
    except BaseException:
        a.stop()
        raise
    return a, a.snapshots


def test_a_snapshot_comes_by_time_too_once_enough_records_came(
        tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a broker snapshotting by records only after 1,000,000, and by time every 60 s
    monkeypatch.setattr(pop.leasejournal, "BY_TIME_RECORDS", 20)
    a, snapshots = _snapshotting(tmp_path, manual_clock, journal_snapshot_records=1_000_000,
                                 journal_snapshot_s=60)
    try:

        def pointed() -> bool:
            snapshots.step()
            return snapshots.pointed >= 0
        first = snapshots.pointed  # (-1: the empty book at start needs none)

        def pop_ack(n: int) -> None:
            for _ in range(n):
                (p,) = a.pop.pop("t", "g", 1, 30)
                a.pop.ack("g", p.receipt_handle)
                snapshots.step()

        # When records come for less than a minute: no snapshot by time
        pop_ack(15)
        manual_clock.advance(59_000)
        for _ in range(5):
            snapshots.step()
        assert snapshots.pointed == first
        assert _pointer(a) == (None if first < 0 else first)
        # and a minute has passed but too few records came: none either
        manual_clock.advance(2_000)
        snapshots.step()
        assert snapshots.pointed == first
        # When enough came a minute after the last snapshot: one, pointed at in the tier
        pop_ack(10)
        wait_until(lambda: pointed() and snapshots.pointed > first, 10,
                   "a snapshot by time to be pointed at")
        assert _pointer(a) == snapshots.pointed
    finally:
        a.stop()


def test_with_the_defaults_a_takeover_replays_about_five_seconds_of_the_journal(
        tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the failover chaos (fourteenth session, lease 5 s): with a snapshot every
    15 s a takeover read up to ~1,600 journal records after its claim (one small object
    per durable-ack commit; 1-2 s of a single failure's unavailability), and the
    warm-up begun half a lease before the claim had not read them all by then.  By
    default (``tier.journal_snapshot_s``) a snapshot comes 5 s after the last, once
    enough records came (here ``BY_TIME_RECORDS`` is 20, to be quick)."""
    monkeypatch.setattr(pop.leasejournal, "BY_TIME_RECORDS", 20)
    a, snapshots = _snapshotting(tmp_path, manual_clock)  # the defaults
    try:
        first = snapshots.pointed
        # Given 30 Pops and Acks (60 records) since the last snapshot
        for _ in range(30):
            (p,) = a.pop.pop("t", "g", 1, 30)
            a.pop.ack("g", p.receipt_handle)
            snapshots.step()
        assert snapshots.pointed == first
        # When 5 s have passed, Then the next step snapshots the book: a takeover replays
        # the journal from there
        manual_clock.advance(5_000)

        def pointed() -> bool:
            snapshots.step()
            return snapshots.pointed > first
        wait_until(pointed, 10, "a snapshot 5 s after the last")
        wait_until(lambda: _pointer(a) == snapshots.pointed, 10,
                   "the tier's pointer to name it")
    finally:
        a.stop()
