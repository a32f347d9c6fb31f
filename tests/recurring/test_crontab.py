"""Cron expressions read as crontab(5) reads them: each man-page example's next fire
times from a fixed instant, the day-of-month OR weekday rule, the macros, and one
grammar for every field (the same text means the same thing, and malformed text is
refused naming its field, in every field alike).

Expected times are written out by hand (from a calendar: 2026-01-01 is a Thursday,
2027-01-01 a Friday); "now" is always a fixed instant, never the wall clock.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger

from recurring.crontab import FIELDS, parse
from recurring.model import ScheduleSpec, fires
from store.errors import InvalidArgument

NEW_YEAR_2026 = "2026-01-01 00:00"  # a Thursday


def _ms(text: str, tz: str = "UTC") -> int:
    moment = datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=ZoneInfo(tz))
    return int(moment.timestamp() * 1000)


def _local(ms: int, tz: str = "UTC") -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M %a")


def _next(cron: str, now: str = NEW_YEAR_2026, count: int = 4, tz: str = "UTC") -> list[str]:
    spec = ScheduleSpec(name="s", topic="t", body=b"x", cron=cron, time_zone=tz)
    spec.validate()
    return [_local(t, tz) for t in fires(spec.trigger(), _ms(now, tz), count)]


# crontab(5)'s examples (Vixie cron's and cronie's man pages), from 2026-01-01 00:00 UTC
@pytest.mark.parametrize(("cron", "expected"), [
    # five minutes after midnight, every day
    ("5 0 * * *", ["2026-01-01 00:05 Thu", "2026-01-02 00:05 Fri", "2026-01-03 00:05 Sat",
                   "2026-01-04 00:05 Sun"]),
    # 2:15 pm on the first of every month
    ("15 14 1 * *", ["2026-01-01 14:15 Thu", "2026-02-01 14:15 Sun",
                     "2026-03-01 14:15 Sun", "2026-04-01 14:15 Wed"]),
    # 10 pm on weekdays
    ("0 22 * * 1-5", ["2026-01-01 22:00 Thu", "2026-01-02 22:00 Fri",
                      "2026-01-05 22:00 Mon", "2026-01-06 22:00 Tue"]),
    # 23 minutes after midnight, 2 am, 4 am, ..., every day
    ("23 0-23/2 * * *", ["2026-01-01 00:23 Thu", "2026-01-01 02:23 Thu",
                         "2026-01-01 04:23 Thu", "2026-01-01 06:23 Thu"]),
    # 5 after 4 every Sunday
    ("5 4 * * sun", ["2026-01-04 04:05 Sun", "2026-01-11 04:05 Sun",
                     "2026-01-18 04:05 Sun", "2026-01-25 04:05 Sun"]),
    # midnight and noon on the first of every other month (now is that midnight: after it)
    ("0 0,12 1 */2 *", ["2026-01-01 12:00 Thu", "2026-03-01 00:00 Sun",
                        "2026-03-01 12:00 Sun", "2026-05-01 00:00 Fri"]),
    # 4 am on the second week of each month (8th to 14th)
    ("0 4 8-14 * *", ["2026-01-08 04:00 Thu", "2026-01-09 04:00 Fri",
                      "2026-01-10 04:00 Sat", "2026-01-11 04:00 Sun"]),
    # midnight on the 1st, the 15th AND every Wednesday
    ("0 0 1,15 * 3", ["2026-01-07 00:00 Wed", "2026-01-14 00:00 Wed",
                      "2026-01-15 00:00 Thu", "2026-01-21 00:00 Wed",
                      "2026-01-28 00:00 Wed", "2026-02-01 00:00 Sun"]),
    # 4:30 am on the 1st and 15th of each month, plus every Friday
    ("30 4 1,15 * 5", ["2026-01-01 04:30 Thu", "2026-01-02 04:30 Fri",
                       "2026-01-09 04:30 Fri", "2026-01-15 04:30 Thu",
                       "2026-01-16 04:30 Fri", "2026-01-23 04:30 Fri"]),
])
def test_each_crontab_man_page_example_fires_as_cron_would(cron: str,
                                                           expected: list[str]) -> None:
    assert _next(cron, count=len(expected)) == expected


def test_nine_on_the_first_or_a_monday_fires_on_either() -> None:
    # Given 0 9 1 * 1: both the day of month and the weekday are restricted
    # When asked from Wednesday 2027-01-20
    got = _next("0 9 1 * 1", now="2027-01-20 00:00")
    # Then every Monday fires, and 2027-02-01 (a Monday and the 1st) fires once
    assert got == ["2027-01-25 09:00 Mon", "2027-02-01 09:00 Mon", "2027-02-08 09:00 Mon",
                   "2027-02-15 09:00 Mon"]
    # and the 1st fires when it is not a Monday (2027-01-01 is a Friday)
    assert _next("0 9 1 * 1", now="2026-12-30 00:00") == [
        "2027-01-01 09:00 Fri", "2027-01-04 09:00 Mon", "2027-01-11 09:00 Mon",
        "2027-01-18 09:00 Mon"]


def test_a_field_starting_with_a_star_is_unrestricted_so_the_days_and_as_vixie_cron() -> None:
    # */2 in the day of month starts with '*': Vixie cron (and cronie) then require both,
    # odd days that are Mondays
    assert _next("0 0 */2 * 1") == ["2026-01-05 00:00 Mon", "2026-01-19 00:00 Mon",
                                    "2026-02-09 00:00 Mon", "2026-02-23 00:00 Mon"]
    # one field restricted, the other '*': that field alone
    assert _next("0 0 15 * *", count=2) == ["2026-01-15 00:00 Thu", "2026-02-15 00:00 Sun"]
    assert _next("0 0 * * 3", count=2) == ["2026-01-07 00:00 Wed", "2026-01-14 00:00 Wed"]


def test_the_or_rule_keeps_the_spring_gap_and_autumn_repeat_rules() -> None:
    # America/New_York, 2026-11-01 is a Sunday and the 1st; 01:30 happens twice
    assert _next("30 1 1 * 0", now="2026-10-31 00:00", tz="America/New_York") == [
        "2026-11-01 01:30 Sun", "2026-11-01 01:30 Sun", "2026-11-08 01:30 Sun",
        "2026-11-15 01:30 Sun"]
    ticks = fires(_spec("30 1 1 * 0", "America/New_York").trigger(),
                  _ms("2026-10-31 00:00", "America/New_York"), 2)
    assert ticks[1] - ticks[0] == 3_600_000  # 01:30 EDT, then 01:30 EST
    # Europe/Berlin, 2026-03-29 (the 29th, a Sunday): 02:30 does not exist
    assert _next("30 2 29 * 1", now="2026-03-28 00:00", tz="Europe/Berlin") == [
        "2026-03-29 03:30 Sun", "2026-03-30 02:30 Mon", "2026-04-06 02:30 Mon",
        "2026-04-13 02:30 Mon"]


def test_an_or_half_that_never_fires_is_left_out() -> None:
    # the 31st of February never comes: Mondays in February do (2026-02-01 is a Sunday)
    assert _next("0 0 31 2 1", count=5) == [
        "2026-02-02 00:00 Mon", "2026-02-09 00:00 Mon", "2026-02-16 00:00 Mon",
        "2026-02-23 00:00 Mon", "2027-02-01 00:00 Mon"]
    # one CronTrigger, not an OrTrigger with a half that scans to the year 9999 (0.1 s)
    # at each next fire time
    assert isinstance(_spec("0 0 31 2 1").trigger(), CronTrigger)
    assert isinstance(_spec("0 0 1-31 * 1").trigger(), CronTrigger)  # every day
    assert _next("0 0 1-31 * 1", count=2) == ["2026-01-02 00:00 Fri", "2026-01-03 00:00 Sat"]


def _spec(cron: str, tz: str = "UTC") -> ScheduleSpec:
    spec = ScheduleSpec(name="s", topic="t", body=b"x", cron=cron, time_zone=tz)
    spec.validate()
    return spec


@pytest.mark.parametrize(("macro", "expected"), [
    ("@yearly", ["2027-01-01 00:00 Fri", "2028-01-01 00:00 Sat"]),
    ("@annually", ["2027-01-01 00:00 Fri", "2028-01-01 00:00 Sat"]),
    ("@monthly", ["2026-02-01 00:00 Sun", "2026-03-01 00:00 Sun"]),
    ("@weekly", ["2026-01-04 00:00 Sun", "2026-01-11 00:00 Sun"]),
    ("@daily", ["2026-01-02 00:00 Fri", "2026-01-03 00:00 Sat"]),
    ("@midnight", ["2026-01-02 00:00 Fri", "2026-01-03 00:00 Sat"]),
    ("@hourly", ["2026-01-01 01:00 Thu", "2026-01-01 02:00 Thu"]),
    ("@DAILY", ["2026-01-02 00:00 Fri", "2026-01-03 00:00 Sat"]),
])
def test_macros_are_their_crontab_five_fields(macro: str, expected: list[str]) -> None:
    assert _next(macro, count=2) == expected


@pytest.mark.parametrize(("cron", "says"), [
    ("@reboot", "@reboot is not accepted"),
    ("@fortnightly", "@yearly"),   # names what is accepted
    ("@daily *", "@daily"),
])
def test_reboot_and_unknown_macros_are_refused(cron: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        _spec(cron)


# one grammar: the same text in every field; malformed text refused naming the field
FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "weekday")
OUT_OF_RANGE = {"minute": ["60"], "hour": ["24"], "day-of-month": ["0", "32"],
                "month": ["0", "13"], "weekday": ["8"]}
MALFORMED = ["1-", "-1", "5-1", "*/0", "1/0", "1-5/0", "1/", "/2", "*/", ",", "1,,2", "1,",
             ",1", "1-2-3", "**", "*-5", "5-*", "?", "L", "1#2", "x", "1.5", "+1",
             "0" * 5000, "*/mon", "1/-2"]


def _with(position: int, text: str) -> str:
    fields = ["0", "0", "*", "*", "*"]
    fields[position] = text
    return " ".join(fields)


@pytest.mark.parametrize("position", range(5), ids=FIELD_NAMES)
@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_fields_are_refused_naming_the_field_in_every_field(position: int,
                                                                      text: str) -> None:
    with pytest.raises(InvalidArgument, match=f": {FIELD_NAMES[position]} field"):
        _spec(_with(position, text))


@pytest.mark.parametrize("position", range(5), ids=FIELD_NAMES)
def test_out_of_range_values_are_refused_naming_the_field(position: int) -> None:
    name = FIELD_NAMES[position]
    for text in OUT_OF_RANGE[name]:
        for form in (text, f"{text}-{text}", f"1,{text}", f"{text}/2"):
            with pytest.raises(InvalidArgument, match=f": {name} field .*out of range"):
                _spec(_with(position, form))


def test_a_trailing_dash_is_refused_in_the_weekday_as_in_the_day() -> None:
    # it was read as Monday in the weekday and refused in the day
    for cron in ("0 0 * * 1-", "0 0 1- * *"):
        with pytest.raises(InvalidArgument, match="1-"):
            _spec(cron)


@pytest.mark.parametrize(("stepped", "listed"), [
    ("5/15 * * * *", "5,20,35,50 * * * *"),        # a/n is a-max/n
    ("0 1/6 * * *", "0 1,7,13,19 * * *"),
    ("0 0 1/10 * *", "0 0 1,11,21,31 * *"),
    ("0 0 1 2/3 *", "0 0 1 2,5,8,11 *"),
    ("0 0 * * 1/2", "0 0 * * 1,3,5,0"),            # weekday counts 0-7: 1,3,5,7
    ("0 0 * * */2", "0 0 * * 0,2,4,6"),
    ("*/20 * * * *", "0-59/20 * * * *"),
    ("0 0 * * 5-7", "0 0 * * 0,5,6"),              # 7 is Sunday, in a range too
    ("0 0 * * 0", "0 0 * * 7"),
    ("0 0 * * Mon-FRI", "0 0 * * 1-5"),            # names, any case
    ("0 0 1 jan-mar,Dec *", "0 0 1 1-3,12 *"),
    ("0 0 * * sun", "0 0 * * 0"),
])
def test_the_same_grammar_gives_the_same_answer_in_every_field(stepped: str,
                                                               listed: str) -> None:
    assert _next(stepped, count=12) == _next(listed, count=12)


def test_a_weekday_step_is_a_step_as_the_minutes_is() -> None:
    # weekday 1/2 was Monday only, while minute 5/15 was a step
    assert [d[-3:] for d in _next("0 0 * * 1/2", count=4)] == ["Fri", "Sun", "Mon", "Wed"]


@pytest.mark.parametrize("cron", ["0 0 * mon *", "0 0 jan * *", "jan * * * *",
                                  "0 sun * * *", "0 0 * * jan", "0 0 * sun *"])
def test_names_belong_to_their_own_field(cron: str) -> None:
    with pytest.raises(InvalidArgument, match="field"):
        _spec(cron)


def test_parse_gives_the_values_each_field_selects() -> None:
    tab = parse("*/15 9-17 1,15 jan-mar/2 1-7/3")
    assert tab.minute == frozenset({0, 15, 30, 45})
    assert tab.hour == frozenset(range(9, 18))
    assert tab.day == frozenset({1, 15})
    assert tab.month == frozenset({1, 3})
    assert tab.weekday == frozenset({1, 4, 0})  # 7 is Sunday, 0
    assert tab.day_or_weekday
    assert not parse("0 0 */2 * 1").day_or_weekday
    assert parse("@weekly") == parse("0 0 * * 0")
    assert [f.name for f in FIELDS] == list(FIELD_NAMES)
