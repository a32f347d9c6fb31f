"""What is due when (timer.schedule): counts per minute, hour and day of the pending
messages, wherever they wait (wheel, RocksDB, parked, a TimerFlatFile), through cancel,
reschedule, delivery and preload; manual clock, real RocksDB, a local-directory tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from store.clock import ManualClock
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig
from timer.schedule import DAY_MS, HOUR_MS, MINUTE_MS, due_schedule

START = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS + 10 * HOUR_MS + 15_000  # 10:00:15


class Env:
    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.clock = clock
        self.broker = Broker(BrokerConfig(
            store=StoreConfig(str(root / "data")), timer=TimerConfig(flat_batch_ms=0),
            tier=TierConfig(provider="local", local_dir=str(root / "tier"))), clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.broker.create_topic(Topic("t", 1))
        self.timer = self.broker.timer

    def send(self, delay_ms: int, n: int = 1) -> list[str]:
        now = self.clock.now_ms()
        due, flags = self.broker.sender.resolve_deliver_at(0, delay_ms, now)
        infos = self.broker.sender.send([Draft("", "t", "", "", b"x", b"", now, due, flags, 0, b"")
                                         for _ in range(n)]).result(10)
        assert self.broker.store.wait_visible(10)
        self.timer.write_parked()  # far-future ones go into their TimerFlatFile now
        return [i.message_id for i in infos]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, ManualClock(START))
    yield e
    e.broker.stop()


def test_counts_per_minute_hour_and_day_wherever_messages_wait(env: Env) -> None:
    env.send(30_000, 3)  # this minute + 1 (10:00:45)
    five_min = env.send(5 * MINUTE_MS)  # 10:05:15
    ninety = env.send(90 * MINUTE_MS)  # 11:30:15, in RocksDB
    env.send(5 * HOUR_MS, 2)  # 15:00:15, beyond rocks_horizon_ms: in a TimerFlatFile
    env.send(3 * DAY_MS)  # three days out, parked too
    assert env.timer.statistics().parked_unwritten == 0  # written to the tier
    assert env.broker.flat_files.statistics().objects >= 1

    s = due_schedule(env.broker.timer_store, env.clock.now_ms())
    assert (s.total, s.overdue, s.partial) == (8, 0, False)
    assert s.minute_start_ms == START - 15_000 and s.hour_start_ms == START - 15_000
    assert {i: n for i, n in enumerate(s.minutes) if n} == {0: 3, 5: 1}
    assert {i: n for i, n in enumerate(s.hours) if n} == {0: 4, 1: 1, 5: 2}
    day0 = START - START % DAY_MS
    assert s.days == [(day0, 7), (day0 + 3 * DAY_MS, 1)]

    # cancel and reschedule move the counts; the cached answer lasts max_age_ms
    first = env.timer.schedule()
    assert env.timer.cancel(five_min[0]).outcome.name == "CANCELLED"
    assert env.timer.reschedule(ninety[0], START + 10 * MINUTE_MS).outcome.name == "RESCHEDULED"
    assert env.timer.schedule() is first
    env.clock.advance(5_000)
    s = env.timer.schedule()
    assert s is not first
    assert {i: n for i, n in enumerate(s.minutes) if n} == {0: 3, 10: 1}
    assert {i: n for i, n in enumerate(s.hours) if n} == {0: 4, 5: 2}

    # delivered: gone; due but not yet delivered: overdue
    env.clock.advance(60_000)  # 10:01:20
    now = env.clock.now_ms()
    env.timer.load_due(now)
    s = due_schedule(env.broker.timer_store, now)
    assert (s.overdue, s.total) == (3, 7)
    while not env.timer.load_due(now):
        env.timer.deliver_due(now)
    env.timer.deliver_due(now)
    assert env.broker.store.wait_visible(10)
    s = due_schedule(env.broker.timer_store, now)
    assert (s.overdue, s.total) == (0, 4)

    # the 15:00 bucket preloaded into RocksDB: counted once, not twice
    env.clock.advance(4 * HOUR_MS)  # 14:01:20: its bucket starts within preload_ahead_ms
    assert env.timer.preload_due(env.clock.now_ms()) == 2
    s = due_schedule(env.broker.timer_store, env.clock.now_ms())
    # left: the 10:10 one (due, not delivered: overdue), the 15:00 pair, the far one
    assert (s.total, s.overdue) == (4, 1)
    assert {i: n for i, n in enumerate(s.hours) if n} == {1: 2, 68: 1}  # 3 days - 4 h
    assert s.days == [(day0, 2), (day0 + 3 * DAY_MS, 1)]


def test_the_scan_stops_at_its_limit(env: Env) -> None:
    env.send(MINUTE_MS, 10)
    s = due_schedule(env.broker.timer_store, env.clock.now_ms(), limit=4)
    assert (s.partial, s.scanned, s.total, sum(s.minutes)) == (True, 4, 4, 4)
    s = due_schedule(env.broker.timer_store, env.clock.now_ms())
    assert (s.partial, s.total, s.minutes[1]) == (False, 10, 10)
