"""Delayed delivery with a manual clock, on a real store, RocksDB and CommitLog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.errors import FailedPrecondition, InvalidArgument
from store.message import FLAG_DELAYED, FLAG_TIMER_DELIVERY, Draft
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig, TimerOutcome

HOUR = 3_600_000
WINDOW = 60_000


class Env:
    """A broker whose timer is driven by hand: ``tick()`` loads and delivers at 'now'."""

    def __init__(self, root: Path, clock: ManualClock, **timer: object) -> None:
        self.root, self.clock, self.timer_settings = root, clock, timer
        cfg = BrokerConfig(store=StoreConfig(str(root / "data")),
                           timer=TimerConfig(wheel_window_ms=WINDOW, **timer))  # type: ignore[arg-type]
        self.broker = Broker(cfg, clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.timer = self.broker.timer

    def send(self, body: bytes, delay_ms: int = 0, deliver_at_ms: int = 0,
             topic: str = "t") -> str:
        now = self.clock.now_ms()
        due, flags = self.broker.sender.resolve_deliver_at(deliver_at_ms, delay_ms, now)
        d = Draft("", topic, "", "", body, b"", now, due, flags, 0)
        self.broker.sender.check(d)
        (info,) = self.broker.sender.send([d]).result(10)
        self.visible()
        return info.message_id

    def visible(self) -> None:
        assert self.broker.store.wait_visible(10)

    def tick(self) -> int:
        """What the timer thread does at 'now': load in slices, delivering in between."""
        now = self.clock.now_ms()
        self.timer.preload_due(now)  # the scheduler's job
        delivered = 0
        while True:
            complete = self.timer.load_due(now)
            delivered += self.timer.deliver_due(now)
            if complete:
                break
        self.visible()
        return delivered

    def bodies(self, group: str = "g") -> list[bytes]:
        got = self.broker.pop.pop("t", group, 32, 60)
        for p in got:
            self.broker.pop.ack(group, p.receipt_handle)
        return [p.message.body for p in got]

    def close(self) -> None:
        self.broker.stop()

    def restart(self) -> Env:
        self.close()
        return Env(self.root, self.clock, **self.timer_settings)


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    e.broker.create_topic(Topic("t", 2))
    yield e
    e.close()


def test_delivered_at_its_time_never_before(env: Env) -> None:
    mid = env.send(b"later", delay_ms=5_000)
    assert env.tick() == 0 and env.bodies() == []  # not visible while pending
    env.clock.advance(4_999)
    assert env.tick() == 0 and env.bodies() == []  # one ms early: still nothing
    env.clock.advance(1)
    assert env.tick() == 1
    got = env.broker.pop.pop("t", "g", 32, 60)
    assert [p.message.body for p in got] == [b"later"]
    m = got[0].message
    # the delivered copy keeps the id and the due time, and says it came from the timer
    assert m.message_id == mid and m.deliver_at_ms == m.born_at_ms + 5_000
    assert m.flags & FLAG_TIMER_DELIVERY and not m.flags & FLAG_DELAYED
    assert env.timer.statistics().lateness_counts[0] == 1  # 0 ms late on a manual clock


def test_past_and_current_times_are_immediate(env: Env) -> None:
    now = env.clock.now_ms()
    env.send(b"past", deliver_at_ms=now - 10_000)
    env.send(b"now", deliver_at_ms=now)
    assert sorted(env.bodies()) == [b"now", b"past"]
    assert env.timer.statistics().delivered == 0  # never went through the timer


def test_maximum_delay_is_enforced(tmp_path: Path, manual_clock: ManualClock) -> None:
    e = Env(tmp_path, manual_clock, max_delay_ms=HOUR)
    try:
        e.broker.create_topic(Topic("t", 1))
        e.send(b"ok", delay_ms=HOUR)
        with pytest.raises(InvalidArgument, match="maximum delay"):
            e.send(b"too far", delay_ms=HOUR + 1)
    finally:
        e.close()


def test_timer_disabled_refuses_future_times(tmp_path: Path, manual_clock: ManualClock) -> None:
    e = Env(tmp_path, manual_clock, enabled=False)
    try:
        e.broker.create_topic(Topic("t", 1))
        with pytest.raises(FailedPrecondition, match="turned off"):
            e.send(b"x", delay_ms=10)
    finally:
        e.close()


def test_crossing_hours_in_order(env: Env) -> None:
    # Given messages from seconds to a day ahead, sent out of order
    delays = [3 * HOUR, 5_000, 24 * HOUR, 90_000, HOUR + 1]
    for d in delays:
        env.send(str(d).encode(), delay_ms=d)
    delivered: list[bytes] = []
    # When the clock jumps ahead a minute at a time for a day
    start = env.clock.now_ms()
    while env.clock.now_ms() < start + 24 * HOUR:
        env.clock.advance(60_000)
        env.tick()
        delivered += env.bodies()
        # Then the wheel never holds more than the window's worth
        assert env.timer.statistics().pending_wheel <= len(delays)
    assert delivered == [str(d).encode() for d in sorted(delays)]


def test_cancel_in_rocksdb_and_in_the_wheel(env: Env) -> None:
    far = env.send(b"far", delay_ms=HOUR)  # stays in RocksDB
    near = env.send(b"near", delay_ms=10_000)
    env.tick()  # loads "near" into the wheel
    assert env.timer.statistics().pending_wheel == 1
    assert env.timer.cancel(far).outcome is TimerOutcome.CANCELLED
    assert env.timer.cancel(near).outcome is TimerOutcome.CANCELLED
    assert env.timer.statistics().pending_wheel == 0
    env.clock.advance(2 * HOUR)
    assert env.tick() == 0 and env.bodies() == []
    # gone: a second cancel finds nothing
    assert env.timer.cancel(far).outcome is TimerOutcome.NOT_FOUND


def test_cancel_after_delivery_and_unknown_ids(env: Env) -> None:
    mid = env.send(b"x", delay_ms=1_000)
    env.clock.advance(1_000)
    env.tick()
    assert env.timer.cancel(mid).outcome is TimerOutcome.ALREADY_DELIVERED
    now_id = env.send(b"immediate")
    assert env.timer.cancel(now_id).outcome is TimerOutcome.ALREADY_DELIVERED
    assert env.timer.cancel("0" * 32).outcome is TimerOutcome.NOT_FOUND
    assert env.timer.cancel("no-such-id").outcome is TimerOutcome.NOT_FOUND


def test_reschedule_in_each_tier(env: Env) -> None:
    a = env.send(b"a", delay_ms=HOUR)  # RocksDB -> sooner, into the wheel
    b = env.send(b"b", delay_ms=10_000)  # wheel -> later, back out of the window
    c = env.send(b"c", delay_ms=20_000)  # wheel -> now
    env.tick()
    now = env.clock.now_ms()
    assert env.timer.reschedule(a, now + 30_000).outcome is TimerOutcome.RESCHEDULED
    assert env.timer.reschedule(b, now + 2 * HOUR).outcome is TimerOutcome.RESCHEDULED
    assert env.timer.reschedule(c, now).outcome is TimerOutcome.RESCHEDULED
    assert env.tick() == 1 and env.bodies() == [b"c"]
    env.clock.advance(30_000)
    assert env.tick() == 1 and env.bodies() == [b"a"]
    env.clock.advance(HOUR)
    assert env.tick() == 0
    env.clock.advance(HOUR)
    assert env.tick() == 1 and env.bodies() == [b"b"]
    assert env.timer.reschedule(a, now).outcome is TimerOutcome.ALREADY_DELIVERED


def test_pending_timers_survive_restart(env: Env) -> None:
    env.send(b"overdue", delay_ms=1_000)
    env.send(b"soon", delay_ms=30_000)
    env.send(b"far", delay_ms=2 * HOUR)
    env.tick()
    e2 = env.restart()
    try:
        e2.clock.advance(1_000)
        assert e2.tick() == 1 and e2.bodies() == [b"overdue"]
        e2.clock.advance(29_000)
        assert e2.tick() == 1 and e2.bodies() == [b"soon"]
        e2.clock.advance(2 * HOUR)
        assert e2.tick() == 1 and e2.bodies() == [b"far"]
    finally:
        env.__dict__.update(e2.__dict__)


def test_delayed_message_for_a_deleted_topic_is_dropped(env: Env) -> None:
    env.broker.create_topic(Topic("gone", 1))
    env.send(b"x", delay_ms=1_000, topic="gone")
    env.broker.delete_topic("gone")
    env.clock.advance(1_000)
    assert env.tick() == 0
    assert env.timer.statistics().pending_wheel == 0


def test_a_backlog_loads_in_slices_without_losing_any(tmp_path: Path,
                                                      manual_clock: ManualClock) -> None:
    e = Env(tmp_path, manual_clock, load_batch=3)
    try:
        e.broker.create_topic(Topic("t", 1))
        for i in range(10):
            e.send(f"{i}".encode(), delay_ms=1_000)  # ten at the same instant
        e.send(b"later", delay_ms=5_000)
        e.clock.advance(1_000)
        assert not e.timer.load_due(e.clock.now_ms())  # 3 of 10: more to load
        assert e.tick() == 10
        assert sorted(e.bodies()) == sorted(f"{i}".encode() for i in range(10))
        e.clock.advance(4_000)
        assert e.tick() == 1 and e.bodies() == [b"later"]
    finally:
        e.close()


@pytest.mark.parametrize("how", ["sent", "rescheduled"])
def test_a_message_due_in_the_slice_being_loaded_is_not_skipped(
        env: Env, how: str) -> None:
    """The loader scans RocksDB without the lock; a message that becomes due inside the
    slice it is scanning, written after its scan began, is in neither the scan nor the
    wheel (it sorts past the cursor): it must still come at its time."""
    far = env.send(b"x", delay_ms=3 * HOUR) if how == "rescheduled" else ""
    env.tick()
    env.clock.advance(1_000)
    due = env.clock.now_ms() + WINDOW - 500  # inside the slice this load moves over
    timers = env.timer._timers
    real = timers.keys_between

    def scan_then_write(start: bytes, end: bytes) -> Iterator[bytes]:
        it = real(start, end)
        first = next(it, None)  # the scan has begun (its RocksDB iterator is made)
        if how == "sent":
            env.send(b"x", deliver_at_ms=due)
        else:
            env.timer.reschedule(far, due)
        if first is not None:
            yield first
            yield from it

    timers.keys_between = scan_then_write  # type: ignore[method-assign]
    try:
        env.timer.load_due(env.clock.now_ms())
    finally:
        del timers.keys_between
    env.clock.advance(due - env.clock.now_ms())
    assert env.tick() == 1
    assert env.bodies() == [b"x"]
