"""Fire times of recurring schedules: APScheduler's triggers across daylight-saving
changes, crontab's weekdays, and bad input refused with a clear message."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recurring.model import ScheduleSpec, fires, next_fire
from store.errors import InvalidArgument


def _ms(*args: int, tz: str = "UTC") -> int:
    return int(datetime(*args, tzinfo=ZoneInfo(tz)).timestamp() * 1000)  # type: ignore[misc]


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M %Z")


def _spec(**kw: object) -> ScheduleSpec:
    spec = ScheduleSpec(**{"name": "s", "topic": "t", "body": b"x", **kw})  # type: ignore[arg-type]
    spec.validate()
    return spec


def test_a_daily_time_in_the_spring_gap_fires_once_after_the_jump_berlin() -> None:
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist
    spec = _spec(cron="30 2 * * *", time_zone="Europe/Berlin")
    got = [_local(t, "Europe/Berlin") for t in
           fires(spec.trigger(), _ms(2026, 3, 27, tz="Europe/Berlin"), 4)]
    assert got == ["2026-03-27 02:30 CET", "2026-03-28 02:30 CET",
                   "2026-03-29 03:30 CEST", "2026-03-30 02:30 CEST"]


def test_a_daily_time_in_the_autumn_repeat_fires_in_both_new_york() -> None:
    # America/New_York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice
    spec = _spec(cron="30 1 * * *", time_zone="America/New_York")
    got = [_local(t, "America/New_York") for t in
           fires(spec.trigger(), _ms(2026, 10, 31, tz="America/New_York"), 4)]
    assert got == ["2026-10-31 01:30 EDT", "2026-11-01 01:30 EDT", "2026-11-01 01:30 EST",
                   "2026-11-02 01:30 EST"]


def test_nine_every_morning_for_thirty_days_across_a_change_of_offset() -> None:
    # Europe/Berlin, October 2026: CEST until the 25th, then CET
    spec = _spec(cron="0 9 * * *", time_zone="Europe/Berlin")
    ticks = fires(spec.trigger(), _ms(2026, 10, 10, tz="Europe/Berlin"), 30)
    assert len(ticks) == 30
    assert {_local(t, "Europe/Berlin")[11:16] for t in ticks} == {"09:00"}
    days = [datetime.fromtimestamp(t / 1000, ZoneInfo("Europe/Berlin")).date() for t in ticks]
    assert days == [days[0] + timedelta(days=i) for i in range(30)]
    gaps = {b - a for a, b in itertools.pairwise(ticks)}
    assert gaps == {86_400_000, 90_000_000}  # one day of 25 hours


def test_an_interval_counts_real_time_whatever_the_wall_clock_does() -> None:
    start = _ms(2026, 3, 29, 0, 30, tz="Europe/Berlin")
    spec = _spec(every_s=3600, time_zone="Europe/Berlin", start_ms=start)
    ticks = fires(spec.trigger(), start - 1, 4)
    assert [b - a for a, b in itertools.pairwise(ticks)] == [3_600_000] * 3
    assert [_local(t, "Europe/Berlin")[11:] for t in ticks] == [
        "00:30 CET", "01:30 CET", "03:30 CEST", "04:30 CEST"]


def test_weekdays_count_as_crontab_does() -> None:
    friday = _ms(2026, 11, 27)
    weekdays = _spec(cron="0 9 * * 1-5")
    assert [datetime.fromtimestamp(t / 1000, UTC).strftime("%a") for t in
            fires(weekdays.trigger(), friday, 3)] == ["Fri", "Mon", "Tue"]
    sundays = _spec(cron="0 9 * * 0")
    assert datetime.fromtimestamp(next_fire(sundays.trigger(), friday) / 1000,  # type: ignore[operator]
                                  UTC).strftime("%a") == "Sun"
    assert _spec(cron="0 9 * * 7").trigger().fields == _spec(cron="0 9 * * sun").trigger().fields  # type: ignore[attr-defined]


def test_start_and_end_bound_the_ticks() -> None:
    start, end = _ms(2026, 1, 1, 10), _ms(2026, 1, 1, 10, 3)
    spec = _spec(every_s=60, start_ms=start, end_ms=end)
    assert fires(spec.trigger(), start - 1, 10) == [start + i * 60_000 for i in range(4)]


@pytest.mark.parametrize(("fields", "says"), [
    ({"cron": "61 * * * *"}, "bad cron expression"),
    ({"cron": "* * * *"}, "five fields"),
    ({"cron": "0 9 * * 8"}, "weekday"),
    ({"cron": "0 9 * * 5-1"}, "backwards"),
    ({"cron": "* * * * *", "time_zone": "Mars/Olympus"}, "unknown time zone"),
    ({"cron": "* * * * *", "time_zone": "../../etc/passwd"}, "unknown time zone"),
    ({"every_s": 0}, "a cron expression or an interval"),
    ({"every_s": -5}, "every_s must be"),
    ({"cron": "* * * * *", "every_s": 5}, "one of them"),
    ({"cron": "* * * * *", "misfire": "sometimes"}, "misfire must be"),
    ({"cron": "* * * * *", "misfire_bound": 0}, "misfire_bound"),
    ({"cron": "* * * * *", "name": "a/b"}, "schedule name"),
    ({"cron": "* * * * *", "name": "x" * 101}, "schedule name"),
    ({"cron": "* * * * *", "body": b""}, "body"),
    ({"cron": "* * * * *", "start_ms": 10, "end_ms": 5}, "end_ms"),
])
def test_bad_schedules_are_refused_with_what_is_wrong(fields: dict[str, object],
                                                      says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        _spec(**fields)


@settings(max_examples=300, deadline=None)
@given(cron=st.one_of(st.text(max_size=40), st.lists(st.sampled_from(
           ["*", "0", "59", "60", "*/5", "1-5", "5-1", "mon-fri", "7", "8", "?", "L", "-1",
            "1,2", "*/0", "0-", "sun"]), min_size=0, max_size=7).map(" ".join)),
       zone=st.one_of(st.sampled_from(["UTC", "Europe/Berlin", "", "../x", "Nowhere/Town",
                                       "\x00", "Europe", "a" * 300, "/etc/passwd"]),
                      st.text(max_size=20)),
       every_s=st.integers(-5, 10 * 366 * 86_400 + 5))
def test_any_cron_zone_or_interval_is_a_schedule_or_a_clear_refusal(
        cron: str, zone: str, every_s: int) -> None:
    for fields in ({"cron": cron}, {"every_s": every_s}):
        try:
            spec = _spec(time_zone=zone or "UTC", **fields)
        except InvalidArgument as exc:
            assert str(exc)  # a message a user can act on, never another exception
            continue
        nxt = next_fire(spec.trigger(), _ms(2026, 1, 1))
        assert nxt is None or nxt > _ms(2026, 1, 1)
