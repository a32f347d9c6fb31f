"""Misfire per outage (issue 53, finding 3): a schedule's misfire policy applies to every
tick missed since its last recorded one, however many ticks that is and however many
engine steps the catch-up takes.  A broker on a manual clock (real RocksDB, the real
engine, timer and POP) is stopped, left down three days, restarted, and driven as its
threads would drive it; the ticks a consumer gets are checked one by one.  Then the
same rule for cron schedules against a walk of every tick, and kill -9 in the middle of
the step that meets the outage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronomq.broker import Broker
from chronomq.client import ChronomqClient
from recurring import engine
from recurring.book import ScheduleState
from recurring.model import ScheduleSpec, next_fire
from store.clock import ManualClock
from store.crashpoint import CRASH_EXIT_CODE
from store.topics import Topic
from testkit.process import LIBFAKETIME, ServerProcess
from tests.conftest import broker_config, run_timer

S = 1_800_000_000_000  # a whole minute: ticks of every_s = 1 and 10 fall on it
SEC, MIN, DAY = 1_000, 60_000, 86_400_000
DOWN = 3 * DAY
KEPT = {"skip": 0, "once": 1, "all": 100}  # misfires sent, misfire_bound = 100


class Outage:
    """A broker on ``clock`` over ``root`` that can be stopped and started again."""

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root, self.clock = root, clock
        self.broker = self._start()
        self.got: dict[str, int] = {}  # message id -> the clock when a consumer got it

    def _start(self) -> Broker:
        b = Broker(broker_config(self.root / "data"), self.clock)
        b.open()
        b.start(timer_thread=False)
        return b

    def restart_after(self, down_ms: int) -> None:
        self.broker.stop()
        self.clock.advance(down_ms)
        self.broker = self._start()

    def run(self, ms: int) -> int:
        """Move the clock, then do what the schedules thread does (step while a tick is
        due within ``AHEAD_MS``: it loops at once after a step) and what the timer
        thread does; consume what is visible.  Returns the engine's steps."""
        now = self.clock.advance(ms)
        b = self.broker
        steps = 0
        while any(not s.paused and s.next_ms is not None and
                  s.next_ms <= now + engine.AHEAD_MS for s in b.schedules.book.states()):
            b.schedules.fire_due(now)
            steps += 1
            assert steps <= 100, "the engine never catches up"
        b.timer.write_parked(force=True)
        b.timer.preload_due(now)
        run_timer(b, now)
        while batch := b.pop.pop("t", "g", 32, 60):
            for p in batch:
                assert p.message.message_id not in self.got, "a tick came twice"
                self.got[p.message.message_id] = now
            b.pop.ack_many("g", [p.receipt_handle for p in batch])
        return steps

    def ticks(self) -> list[int]:
        """The ticks consumed, in order; none came before its time."""
        out = sorted(int(i.rsplit("@", 1)[1]) for i in self.got)
        assert all(self.got[f"s@{t}"] >= t for t in out), "a tick came early"
        return out


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[Outage]:
    o = Outage(tmp_path, ManualClock(S))
    o.broker.create_topic(Topic("t", 2))
    yield o
    o.broker.stop()


@pytest.mark.parametrize(("misfire", "every_s", "came_after"), [
    # the outage's ticks a consumer gets in the five seconds after it: those kept, then
    # 66 (7) within the minute (before issue 53, a step of 10,000 ticks: all 2,666 and
    # 307, once 92 and 10)
    ("skip", 1, 66), ("once", 1, 67), ("all", 1, 166),
    ("skip", 10, 7), ("once", 10, 8), ("all", 10, 107)])
def test_three_days_down_the_policy_applies_to_the_whole_outage(
        outage: Outage, misfire: str, every_s: int, came_after: int) -> None:
    every = every_s * SEC
    outage.broker.schedules.book.create(
        ScheduleSpec("s", "t", every_s=every_s, body=b"tick", misfire=misfire), S)
    # Given a minute of ticks sent on time (those up to a second ahead included)
    outage.run(MIN)
    before = list(range(S + every, S + MIN + SEC + 1, every))
    # When the broker is down three days and then runs five seconds
    outage.restart_after(DOWN)
    back = outage.clock.now_ms()
    for ms in (0, SEC, SEC, SEC, SEC, SEC):
        outage.run(ms)
    # Then of the 259,200 (25,920) ticks missed, more than a minute old when it came
    # back, the policy sent the latest one (skip: none; all: the latest 100), and the
    # ticks within the minute came as they are
    cutoff = back - engine.MISFIRE_GRACE_MS
    kept = list(range(cutoff - KEPT[misfire] * every, cutoff, every))
    since = list(range(cutoff, outage.clock.now_ms() + 1, every))
    assert outage.ticks() == sorted({*before, *kept, *since})
    assert len(outage.ticks()) == len(before) + came_after
    (state,) = outage.broker.schedules.book.states()
    assert state.fired == len({*before, *kept, *since}) + (1 if every_s == 1 else 0)
    assert state.next_ms == (outage.clock.now_ms() + SEC) // every * every + every


def test_the_outage_is_caught_up_in_one_step_however_many_ticks(outage: Outage) -> None:
    outage.broker.schedules.book.create(
        ScheduleSpec("s", "t", every_s=1, body=b"tick", misfire="all", misfire_bound=3), S)
    outage.run(MIN)
    outage.restart_after(DOWN)
    # 259,200 ticks missed: one step decides them all, sends three and the minute's
    assert outage.run(0) == 1
    assert outage.run(SEC) == 1  # then one step a second, as before the outage
    back = outage.clock.now_ms() - SEC
    cutoff = back - engine.MISFIRE_GRACE_MS
    assert outage.ticks() == [*range(S + SEC, S + MIN + 2 * SEC, SEC),
                              *range(cutoff - 3 * SEC, back + 2 * SEC, SEC)]


def test_an_outage_within_the_grace_sends_every_tick(outage: Outage) -> None:
    outage.broker.schedules.book.create(
        ScheduleSpec("s", "t", every_s=1, body=b"tick", misfire="skip"), S)
    outage.run(MIN)
    outage.restart_after(MIN - 2 * SEC)  # 58 s down: no tick is a misfire
    outage.run(0)
    assert outage.ticks() == list(range(S + SEC, outage.clock.now_ms() + 1, SEC))


def test_a_second_outage_is_judged_on_its_own(outage: Outage) -> None:
    outage.broker.schedules.book.create(
        ScheduleSpec("s", "t", every_s=10, body=b"tick", misfire="once"), S)
    outage.run(MIN)
    outage.restart_after(DAY)
    outage.run(0)
    first = outage.clock.now_ms() - engine.MISFIRE_GRACE_MS
    outage.restart_after(DAY)
    outage.run(0)
    second = outage.clock.now_ms() - engine.MISFIRE_GRACE_MS
    got = outage.ticks()
    # one misfire before each outage's minute of grace: the latest of each
    assert [t for t in got if S + MIN + SEC < t < first] == [first - 10 * SEC]
    assert [t for t in got if first + MIN + SEC < t < second] == [second - 10 * SEC]


# ---------------------------------------------------------------- any rule, any outage

YEAR = 365 * DAY
RULES = [  # (a rule, the longest outage tried: about 10,000 ticks or fewer)
    ({"every_s": 1}, 3 * 3_600_000), ({"every_s": 7}, DAY), ({"every_s": 3600}, YEAR),
    ({"every_s": 10, "start_ms": S + 3_333}, DAY), ({"every_s": 60, "end_ms": S + 5 * DAY},
                                                    6 * DAY),
    ({"cron": "* * * * *"}, 7 * DAY), ({"cron": "*/7 * * * *"}, 30 * DAY),
    ({"cron": "* 9 * * *"}, 60 * DAY),
    ({"cron": "0 9 * * 1-5", "time_zone": "Europe/Berlin"}, 2 * YEAR),
    ({"cron": "30 2 * * *", "time_zone": "Europe/Berlin"}, 2 * YEAR),
    ({"cron": "30 1 * * *", "time_zone": "America/New_York"}, 2 * YEAR),
    ({"cron": "0 0 1 * *"}, 20 * YEAR), ({"cron": "0 9 1 * 1"}, 20 * YEAR),
]


def _walked(state: ScheduleState, now_ms: int) -> tuple[list[int], int | None]:
    """What the engine should send: every tick from ``next_ms`` walked one by one, the
    misfire policy applied to all those more than the grace old."""
    ticks, nxt = [], state.next_ms
    while nxt is not None and nxt <= now_ms + engine.AHEAD_MS:
        ticks.append(nxt)
        nxt = next_fire(state.trigger(), nxt)
    missed = [t for t in ticks if t < now_ms - engine.MISFIRE_GRACE_MS]
    keep = {"skip": 0, "once": 1, "all": state.spec.misfire_bound}[state.spec.misfire]
    kept = missed[-keep:] if keep else []
    return kept + ticks[len(missed):], nxt


@settings(max_examples=60, deadline=None)
@given(rule=st.sampled_from(RULES), misfire=st.sampled_from(["skip", "once", "all"]),
       bound=st.integers(1, 30), down=st.floats(0, 1), late_ms=st.integers(0, 2 * MIN),
       since_ms=st.integers(0, DAY))
@example(rule=RULES[0], misfire="once", bound=1, down=1.0, late_ms=0, since_ms=0)
@example(rule=RULES[0], misfire="all", bound=30, down=1.0, late_ms=0, since_ms=0)
@example(rule=RULES[5], misfire="all", bound=30, down=1.0, late_ms=0, since_ms=0)
def test_any_rule_sends_what_a_walk_of_every_tick_gives(
        rule: tuple[dict[str, object], int], misfire: str, bound: int, down: float,
        late_ms: int, since_ms: int) -> None:
    fields, longest_ms = rule
    spec = ScheduleSpec(**{"name": "s", "topic": "t", "body": b"x",  # type: ignore[arg-type]
                           "misfire": misfire, "misfire_bound": bound, **fields})
    spec.validate()
    first = next_fire(spec.trigger(), S + since_ms)
    assert first is not None
    state = ScheduleState(spec, first)
    # Given the schedule's next tick is ``first`` and the engine's step comes this late
    now = first + int(down * longest_ms) + late_ms
    # Then it sends what walking every tick and applying the policy gives
    assert engine.ticks_due(state, now) == _walked(state, now)


# ---------------------------------------------------------------- kill -9 at the step


@pytest.mark.slow
@pytest.mark.skipif(not LIBFAKETIME, reason="needs libfaketime (apt-get install faketime)")
def test_a_crash_in_the_step_that_meets_the_outage(tmp_path: Path) -> None:
    """kill -9 after the outage's ticks are durable, before the schedule moves past
    them: the restart sends them again (stored once) and never the outage's older
    ticks; every tick after the kept ones comes, once."""
    data, every = tmp_path / "data", 10 * SEC
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("t", queue_count=1)
            c.create_schedule("s", "t", b"tick", every_s=10, misfire="all", misfire_bound=3)
    finally:
        assert srv.terminate() == 0
    stopped = int(time.time() * 1000)
    # Given three days down; the broker that comes back dies in its first step (before
    # or after it says it listens)
    before = int(time.time() * 1000) + DOWN
    try:
        srv = ServerProcess(data, "server.crash_at=schedule.after_send:1",
                            clock_ahead_s=DOWN // SEC)
    except RuntimeError as exc:
        assert "crash point schedule.after_send reached" in str(exc)
    else:
        assert srv.wait_exit() == CRASH_EXIT_CODE
    crashed = int(time.time() * 1000) + DOWN
    # When it comes back again
    srv = ServerProcess(data, clock_ahead_s=DOWN // SEC)
    try:
        with ChronomqClient(srv.target) as c:
            got: list[str] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                batch = c.pop("t", "g", max_messages=32, wait_ms=500)
                got += [m.message_id for m in batch]
                if batch:
                    c.ack("g", [m.receipt_handle for m in batch])
    finally:
        # kill -9, as test_clock_skew_processes.py ends its own: under libfaketime a
        # SIGTERM did not always end the server (its main thread stayed in its wait for
        # the signal: 2 runs of 8 here)
        srv.kill9()
    # Then no tick twice; after what the first broker sent, the outage's latest three
    # (as the first step after it judged them: before its minute of grace) and every
    # tick since, none missing
    assert len(got) == len(set(got))
    ticks = sorted(int(i.rsplit("@", 1)[1]) for i in got)
    outage = [t for t in ticks if t > stopped + SEC]
    assert outage == list(range(outage[0], outage[-1] + 1, every))
    grace = engine.MISFIRE_GRACE_MS
    assert before - grace - 3 * every <= outage[0] < crashed - grace - 2 * every
