"""Timer snapshots and system-stream deletion (``cluster.timersnapshot``), on real brokers
in one process, a real local-directory tier and RocksDB, a manual clock.

Broker A delivers a history of delayed messages (some cancelled, some rescheduled) while
others stay pending, near and far; its compactor folds the committed delayed and timer
streams into timer snapshots, and tier retention deletes the system streams' segments
below them.  B takes A over: it reads the snapshot and the tails only, and the ledger
holds exactly (every pending message comes, at its time or its rescheduled time, never
early; nothing delivered, cancelled or acked comes again).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from cluster.timersnapshot import read_pointer
from store.clock import ManualClock
from store.message import FLAG_DELAYED, Draft
from store.names import DELAYED_STREAM, TIMER_STREAM
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig

HOUR_MS = 3_600_000


def _broker(root: Path, name: str, clock: ManualClock, every: int) -> Broker:
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1,
                      journal_snapshot_records=every, segment_bytes=32 << 10)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / name)), tier=tier,
                            timer=TimerConfig(delivery_batch=50)), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    return b


def _dispatched(b: Broker) -> None:
    """Wait until the store's dispatcher has handed everything on (the timer's store,
    the ConsumeQueues): it runs on its own thread."""
    assert b.store.dispatcher is not None
    assert b.store.dispatcher.wait_dispatched(b.store.commitlog.confirmed_offset, 30)


def _tick(b: Broker, clock: ManualClock) -> None:
    _dispatched(b)
    now = clock.now_ms()
    while not b.timer.load_due(now):
        b.timer.deliver_due(now)
    while b.timer.deliver_due(now):
        pass
    _dispatched(b)


def _drain(b: Broker) -> dict[str, int]:
    """Pop and ack everything visible: id -> when it came (the clock's time)."""
    got: dict[str, int] = {}
    while batch := b.pop.pop("t", "g", 32, 60):
        got.update({p.message.message_id: b.clock.now_ms() for p in batch})
        b.pop.ack_many("g", [p.receipt_handle for p in batch])
    return got


def _caught_up(b: Broker) -> None:
    """Wait until the tier holds everything in the CommitLog (the dispatcher's thread
    commits; a test must not commit beside it)."""
    assert b.tiered is not None
    b.tiered.wait_durable(b.store.commitlog.confirmed_offset, 30)


def _stream_objects(b: Broker, stream: str) -> int:
    return len(b.tier.list(f"a/data/{stream}/"))


def _send_delayed(b: Broker, ids: list[str], due_ms: int) -> None:
    now = b.clock.now_ms()
    due, flags = b.sender.resolve_deliver_at(due_ms, 0, now)
    b.sender.send([Draft(i, "t", "", "", i.encode(), b"", now, due, flags) for i in ids]).result(10)


@pytest.mark.parametrize("compact", [True, False])
def test_a_takeover_after_a_long_history_reads_the_snapshot_and_keeps_every_promise(
        compact: bool, tmp_path: Path, manual_clock: ManualClock) -> None:
    a = _broker(tmp_path, "a", manual_clock, every=200 if compact else 0)
    assert a.compactor is not None and a.tiered is not None
    a.create_topic(Topic("t", 2))
    start = manual_clock.now_ms()
    near = [f"near-{i}" for i in range(60)]
    far = [f"far-{i}" for i in range(40)]
    _send_delayed(a, near, start + 2 * HOUR_MS)
    _send_delayed(a, far, start + 80 * HOUR_MS)  # parked in TimerFlatFiles
    delivered: dict[str, int] = {}
    for round_ in range(12):  # the history: 1,200 delayed messages delivered and acked
        now = manual_clock.now_ms()
        _send_delayed(a, [f"h{round_}-{i}" for i in range(100)], now + 1_000)
        manual_clock.advance(1_000)
        _tick(a, manual_clock)
        delivered |= _drain(a)
        _caught_up(a)
        a.compactor.step()
    assert len(delivered) == 1_200
    cancelled, moved = near[:10], near[10:20]
    for mid in cancelled:
        assert a.timer.cancel(mid, "t").changed == 1
    moved_to = start + 3 * HOUR_MS
    for mid in moved:
        assert a.timer.reschedule(mid, moved_to, "t").changed == 1
    _send_delayed(a, ["late-0", "late-1"], start + 2 * HOUR_MS)  # after the last snapshot
    _caught_up(a)
    if compact:
        assert a.compactor.step(force=True)
        pointer = read_pointer(a.tier, "a")
        assert pointer is not None and pointer.records == 92  # only what is pending
        assert pointer.delayed_from >= 1_300
        before = _stream_objects(a, DELAYED_STREAM) + _stream_objects(a, TIMER_STREAM)
        a.run_retention()
        after = _stream_objects(a, DELAYED_STREAM) + _stream_objects(a, TIMER_STREAM)
        assert after < before / 2, f"system stream objects {before} -> {after}"
    a.stop()

    b = _broker(tmp_path, "b", manual_clock, every=200)
    try:
        result = b.takeover("a", force=True)
        assert result.done and result.pending == 92  # 60 + 40 + 2 - 10 cancelled
        if compact:
            assert b.takeovers.results["a"].journal_records < 100
        seen: dict[str, int] = {}
        while manual_clock.now_ms() < start + 81 * HOUR_MS:
            manual_clock.advance(HOUR_MS // 4)
            b.timer.preload_due(manual_clock.now_ms())
            _tick(b, manual_clock)
            seen |= _drain(b)
        expected = {*near[10:], *far, "late-0", "late-1"}
        assert set(seen) == expected, (sorted(expected - set(seen))[:5],
                                       sorted(set(seen) - expected)[:5])
        assert all(seen[m] >= moved_to for m in moved), "a rescheduled message came early"
        assert all(seen[m] >= start + 2 * HOUR_MS for m in near[20:])
        assert all(seen[m] >= start + 80 * HOUR_MS for m in far)
    finally:
        b.stop()

RETRIED = [f"m{i}" for i in range(12)]


def _lease_all(b: Broker) -> set[str]:
    """Pop everything visible (invisible 30 s) and settle none of it."""
    got: set[str] = set()
    while batch := b.pop.pop("t", "g", 32, 30):
        got |= {p.message.message_id for p in batch}
    return got


@pytest.mark.parametrize("snapshot", [True, False])
@pytest.mark.parametrize("copies_pending", [True, False])
def test_retry_copies_left_unsettled_come_again_after_a_takeover(
        snapshot: bool, copies_pending: bool, tmp_path: Path,
        manual_clock: ManualClock) -> None:
    """A leases messages, lets the leases run out, revives them (retry copies, delayed by
    the back-off), delivers the copies and leases them again unsettled, revives those
    too, runs a timer snapshot (or not), and is taken over by B: every message comes
    again at B.  Written after a NOT_BACK seen once in the failover chaos (a retry copy
    left unsettled on a Subscribe stream, its broker killed 8 s later, never delivered
    again); this in-process form of it passes, so that one's cause lies elsewhere
    (bench/RESULTS.md)."""
    a = _broker(tmp_path, "a", manual_clock, every=100_000)
    assert a.compactor is not None
    a.create_topic(Topic("t", 2))
    now = manual_clock.now_ms()
    a.sender.send([Draft(i, "t", "", "", i.encode(), b"", now, now, 0) for i in RETRIED]
                  ).result(10)
    _dispatched(a)
    assert _lease_all(a) == set(RETRIED)  # attempt 1, unsettled
    manual_clock.advance(31_000)
    a.pop.revive_due()  # retry copies, due after the first back-off (1 s)
    manual_clock.advance(1_500)
    _tick(a, manual_clock)
    assert _lease_all(a) == set(RETRIED)  # attempt 2, from the retry topic, unsettled
    manual_clock.advance(31_000)
    a.pop.revive_due()  # copies again, due 5 s on
    if not copies_pending:  # delivered into the retry topic, not leased yet
        manual_clock.advance(6_000)
        _tick(a, manual_clock)
    _caught_up(a)
    if snapshot:
        a.compactor.step(force=True)  # (nothing to fold when no copy is a delayed record)
    _caught_up(a)
    a.stop()

    b = _broker(tmp_path, "b", manual_clock, every=100_000)
    try:
        assert b.takeover("a", force=True).done
        seen: set[str] = set()
        for _ in range(12):
            manual_clock.advance(5_000)
            b.pop.revive_due()
            _tick(b, manual_clock)
            seen |= set(_drain(b))
        assert seen == set(RETRIED), sorted(set(RETRIED) - seen)
    finally:
        b.stop()


def test_the_adoption_of_a_broker_that_wrote_nothing_folds_into_a_snapshot(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """A broker that died before it uploaded anything (a new incarnation killed at once,
    seen in the failover chaos) is taken over with nothing pending.  The taker's timer
    snapshots then failed every second, for good ("cannot fold the adoption ... broker
    'e' has no queues in the tier"), so its delayed and timer streams were never
    compacted again.  Its adoption folds in as the nothing it holds."""
    e = _broker(tmp_path, "e", manual_clock, every=200)
    e.stop()
    assert e.tier.list("e/meta/") == []  # nothing of it in the tier
    b = _broker(tmp_path, "b", manual_clock, every=200)
    try:
        result = b.takeover("e", force=True)
        assert result.done and result.pending == 0
        assert b.compactor is not None
        b.create_topic(Topic("t", 1))
        _send_delayed(b, ["x", "y"], manual_clock.now_ms() + HOUR_MS)
        _caught_up(b)
        assert b.compactor.step(force=True)
        pointer = read_pointer(b.tier, "b")
        assert pointer is not None and pointer.records == 2
    finally:
        b.stop()


def test_a_snapshot_comes_every_journal_snapshot_s_once_enough_records_came(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """By records alone (``tier.journal_snapshot_records``, 100,000) a broker's timer
    snapshots came hours apart, and a takeover read every small object of its streams
    since (572 timer records of two minutes took 2 s in the failover chaos)."""
    a = _broker(tmp_path, "a", manual_clock, every=100_000)
    try:
        a.create_topic(Topic("t", 1))
        assert a.compactor is not None

        def sent(n: int) -> None:
            now = manual_clock.now_ms()
            a.sender.send([Draft("", "t", "", "", b"x", b"", now, now + HOUR_MS,
                                 FLAG_DELAYED) for _ in range(n)]).result(10)
            _caught_up(a)

        every_ms = int(a.config.tier.journal_snapshot_s * 1000)  # (the default)
        # Given 150 delayed records, that long after the start
        sent(150)
        assert not a.compactor.step()  # sooner: none yet
        manual_clock.advance(every_ms)
        # When the compactor steps, Then a snapshot is written, holding them
        assert a.compactor.step()
        assert read_pointer(a.tier, "a").records == 150  # type: ignore[union-attr]
        # and the next only that long later (and once 100 records, half of 150, came)
        sent(100)
        manual_clock.advance(every_ms - 1_000)
        assert not a.compactor.step()
        manual_clock.advance(1_000)
        assert a.compactor.step()
        assert read_pointer(a.tier, "a").records == 250  # type: ignore[union-attr]
    finally:
        a.stop()
