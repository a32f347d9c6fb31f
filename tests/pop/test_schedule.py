"""ReviveSchedule on its own, driven by a manual clock."""

from __future__ import annotations

import threading

from pop.model import Deadline
from pop.schedule import ReviveSchedule
from store.clock import ManualClock


def _deadline(start: int, at_ms: int) -> Deadline:
    return ("G", "t", 0, start, at_ms)


def test_deadlines_come_due_at_their_time_in_batches(manual_clock: ManualClock) -> None:
    now = manual_clock.now_ms()
    schedule = ReviveSchedule(manual_clock)
    late, early = _deadline(0, now + 5_000), _deadline(1, now + 1_000)
    schedule.add([late, early])
    assert len(schedule) == 2
    assert schedule.take_due(now + 999, 10) == []
    assert schedule.take_due(now + 1_000, 10) == [early]
    many = [_deadline(10 + i, now + 2_000) for i in range(5)]
    schedule.add(many)
    first = schedule.take_due(now + 6_000, 3)  # a batch at most
    rest = schedule.take_due(now + 6_000, 10)
    assert len(first) == 3 and sorted(first + rest) == sorted([*many, late])
    assert len(schedule) == 0


def test_a_deadline_already_due_comes_first(manual_clock: ManualClock) -> None:
    now = manual_clock.now_ms()
    schedule = ReviveSchedule(manual_clock)
    manual_clock.advance(60_000)
    schedule.take_due(manual_clock.now_ms(), 10)  # the wheel moves to the clock
    past = _deadline(0, now)
    soon = _deadline(1, manual_clock.now_ms() + 10)  # one tick later: on the wheel
    schedule.add([soon])
    schedule.add([past])
    assert len(schedule) == 2
    assert schedule.take_due(manual_clock.now_ms() + 10, 1) == [past]
    assert schedule.take_due(manual_clock.now_ms() + 10, 1) == [soon]


def test_removed_deadlines_never_fire(manual_clock: ManualClock) -> None:
    now = manual_clock.now_ms()
    schedule = ReviveSchedule(manual_clock)
    keep, drop = _deadline(0, now + 100), _deadline(1, now + 100)
    schedule.add([keep, drop])
    schedule.remove([drop, _deadline(9, now)])  # an absent one is ignored
    assert len(schedule) == 1
    assert schedule.take_due(now + 100, 10) == [keep]


def test_a_failed_revive_is_added_again_at_a_later_time(manual_clock: ManualClock) -> None:
    now = manual_clock.now_ms()
    schedule = ReviveSchedule(manual_clock)
    d = _deadline(0, now)
    schedule.add([d], at_ms=now + 1_000)
    assert schedule.take_due(now + 999, 10) == []
    assert schedule.take_due(now + 1_000, 10) == [d]


def test_wait_due_returns_when_due_and_when_closed(manual_clock: ManualClock) -> None:
    schedule = ReviveSchedule(manual_clock)
    schedule.add([_deadline(0, manual_clock.now_ms() + 50)])
    manual_clock.advance(50)
    assert schedule.wait_due() is True  # due on the clock: no sleep
    schedule.take_due(manual_clock.now_ms(), 10)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(schedule.wait_due()))
    waiter.start()  # nothing scheduled: it sleeps until closed
    schedule.close()
    waiter.join(5)
    assert results == [False]
    schedule.pause(30)  # closed: returns at once
    schedule.open()
    schedule.add([_deadline(1, manual_clock.now_ms())])
    assert schedule.wait_due() is True
