"""Crontab expressions: the grammar of crontab(5), read here, and fire times from
APScheduler.

What is accepted (and nothing else; anything else is ``InvalidArgument`` naming the
field and what is wrong with it)::

    expression := macro | minute hour day-of-month month weekday   (blanks between)
    field      := item ("," item)*
    item       := ("*" | value | value "-" value) ["/" step]
    value      := digits | name            (names: month and weekday fields only)

    field          range  names
    minute         0-59
    hour           0-23
    day-of-month   1-31
    month          1-12   jan..dec
    weekday        0-7    sun..sat         (0 and 7 are both Sunday)

    macro      := @yearly | @annually   0 0 1 1 *
                | @monthly              0 0 1 * *
                | @weekly               0 0 * * 0
                | @daily | @midnight    0 0 * * *
                | @hourly               0 * * * *

- The same grammar in every field.  ``a-b`` is a range (never backwards); ``*`` is the
  field's whole range; ``/n`` steps through the range it follows, from its start
  (``*/15`` is 0,15,30,45); ``a/n`` means ``a-max/n`` (minute ``5/15`` is 5,20,35,50,
  weekday ``1/2`` is 1,3,5,7: Monday, Wednesday, Friday, Sunday).  A step is 1 to the
  field's number of values.  Names are three letters, in any case, and may end a range
  (``mon-fri``) but not be a step.  Macros are in any case too.
- Day of month OR weekday, as Vixie cron: when both fields are restricted, a day
  matching either fires (``0 9 1 * 1``: every 1st and every Monday); when either field
  is unrestricted, a day must match both (``0 9 * * 1``: Mondays).  A field is
  unrestricted when it starts with ``*``: so ``*/2`` in the day of month is, and
  ``0 0 */2 * 1`` fires on odd days that are Mondays, as Vixie cron and cronie do.
- ``@reboot`` is refused: a broker's schedule has fire times, not a daemon's start.

Why a parser of our own: APScheduler's ``CronTrigger`` has its own grammar (weekday 0 is
Monday, ``1-`` and ``5/15`` mean different things in different fields, day of month AND
weekday always), so we read the crontab here, into the set of values each field
selects, and hand APScheduler only plain lists of those values.  Fire times, time zones
and daylight saving stay APScheduler's (see ``recurring/model.py``): the OR rule is an
``OrTrigger`` of two ``CronTrigger`` s, one for the days of month and one for the
weekdays, whose earliest next time wins (a day matching both fires once); a single
``CronTrigger`` when one half covers every day or its days of month never occur.

Pure functions and frozen values: thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

from store.errors import InvalidArgument

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
          "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_LONGEST = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # days of each month, at most
_DIGITS = re.compile(r"[0-9]{1,4}")  # a longer number is out of range anyway
_SHOWN = 80  # characters of the user's text quoted back in a message


@dataclass(frozen=True, slots=True)
class Field:
    """One of the five fields: its name, its range and its names (``names[i]`` is the
    value ``low + i``)."""

    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()


FIELDS = (
    Field("minute", 0, 59),
    Field("hour", 0, 23),
    Field("day-of-month", 1, 31),
    Field("month", 1, 12, MONTHS),
    Field("weekday", 0, 7, WEEKDAYS),
)
MINUTE, HOUR, DAY, MONTH, WEEKDAY = FIELDS


@dataclass(frozen=True, slots=True)
class Crontab:
    """What an expression selects: the values of each field (weekday 0-6, Sunday 0), and
    whether a day fires on its day of month OR its weekday (both restricted)."""

    minute: frozenset[int]
    hour: frozenset[int]
    day: frozenset[int]
    month: frozenset[int]
    weekday: frozenset[int]
    day_or_weekday: bool


class _Refused(ValueError):
    """Raised inside the parser for a field's text; ``parse`` adds the expression and
    the field's name."""


def parse(expr: str) -> Crontab:
    """The crontab ``expr`` (five fields or a macro), or ``InvalidArgument`` naming the
    field and what is wrong with it."""
    text = expr.strip()
    if text.startswith("@"):
        text = _macro(expr, text)
    parts = text.split()
    if len(parts) != len(FIELDS):
        raise _bad(expr, f"five fields (minute hour day-of-month month weekday) or a "
                         f"macro ({', '.join(MACROS)}), not {len(parts)} fields")
    values = [_values(expr, part, field) for part, field in zip(parts, FIELDS, strict=True)]
    minute, hour, day, month, weekday = values
    return Crontab(minute, hour, day, month, frozenset(d % 7 for d in weekday),
                   day_or_weekday=not parts[2].startswith("*")
                   and not parts[4].startswith("*"))


def trigger(expr: str, zone: tzinfo, start: datetime | None,
            end: datetime | None) -> BaseTrigger:
    """APScheduler's trigger for the crontab ``expr`` in ``zone``, bounded by ``start``
    and ``end`` (None: from now, no end)."""
    tab = parse(expr)
    common = {"minute": _listed(tab.minute, MINUTE), "hour": _listed(tab.hour, HOUR),
              "month": _listed(tab.month, MONTH), "start_date": start, "end_date": end,
              "timezone": zone}
    try:
        triggers = [CronTrigger(day=day, day_of_week=weekday, **common)
                    for day, weekday in _day_rules(tab)]
    except (ValueError, TypeError) as exc:  # the values were checked: not expected
        raise _bad(expr, str(exc)) from exc
    return triggers[0] if len(triggers) == 1 else OrTrigger(triggers)


def _day_rules(tab: Crontab) -> list[tuple[str, str]]:
    """APScheduler's (day, day_of_week) of each trigger, the days fired being their
    union.  A half of the OR rule that covers every day, or whose days of month never
    occur in its months (``31 2``), is not given to APScheduler as an ``OrTrigger``:
    one that never fires makes each next fire time scan to the year 9999 (0.1 s)."""
    day, weekday = _listed(tab.day, DAY), _weekdays(tab.weekday)
    if not tab.day_or_weekday:
        return [(day, weekday)]
    if "*" in (day, weekday):
        return [("*", "*")]
    if min(tab.day) > max(_LONGEST[m - 1] for m in tab.month):
        return [("*", weekday)]
    return [(day, "*"), ("*", weekday)]


def _macro(expr: str, text: str) -> str:
    word = text.lower()
    if word == "@reboot":
        raise _bad(expr, "@reboot is not accepted: it runs once when a cron daemon "
                         "starts, and a schedule has fire times; give five fields or "
                         f"one of {', '.join(MACROS)}")
    if word not in MACROS:
        raise _bad(expr, f"the macros are {', '.join(MACROS)} (a macro stands alone)")
    return MACROS[word]


def _values(expr: str, text: str, field: Field) -> frozenset[int]:
    try:
        return frozenset(value for item in text.split(",") for value in _item(item, field))
    except _Refused as exc:
        raise _bad(expr, f"{field.name} field {text[:_SHOWN]!r}: {exc}") from None


def _item(item: str, field: Field) -> range:
    """The values of one list item: ``*``, ``a``, ``a-b``, each with an optional ``/n``."""
    span, slash, step_text = item.partition("/")
    step = _step(step_text, field) if slash else 1
    if span == "*":
        return range(field.low, field.high + 1, step)
    low_text, dash, high_text = span.partition("-")
    first = _value(low_text, field)
    # a is a-a, and a/n is a-max/n
    last = _value(high_text, field) if dash else (field.high if slash else first)
    if last < first:
        raise _Refused(f"the range {span!r} runs backwards (write the lower end first)")
    return range(first, last + 1, step)


def _value(text: str, field: Field) -> int:
    if text.lower() in field.names:
        return field.low + field.names.index(text.lower())
    if not _DIGITS.fullmatch(text):
        raise _Refused(_what_is_wrong(text, field))
    value = int(text)
    if not field.low <= value <= field.high:
        raise _Refused(f"{value} is out of range {field.low}-{field.high}")
    return value


def _what_is_wrong(text: str, field: Field) -> str:
    names = f" or a name ({field.names[0]}..{field.names[-1]})" if field.names else ""
    if not text:
        return f"a number{names} is missing (an item is *, a, a-b, each with /step)"
    if text.isascii() and text.isdigit():  # more digits than _DIGITS takes
        return f"{text[:8]}... is too long a number (at most 4 digits)"
    return f"{text[:_SHOWN]!r} is not a number {field.low}-{field.high}{names}"


def _step(text: str, field: Field) -> int:
    count = field.high - field.low + 1
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= count:
        raise _Refused(f"the step {text[:_SHOWN]!r} must be a number from 1 to {count}")
    return int(text)


def _listed(values: frozenset[int], field: Field) -> str:
    """``values`` as APScheduler reads them: ``*`` for the whole range, else runs of
    consecutive values (``1-5,9``)."""
    if len(values) == field.high - field.low + 1:
        return "*"
    runs: list[list[int]] = []
    for value in sorted(values):
        if runs and runs[-1][1] + 1 == value:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _weekdays(days: frozenset[int]) -> str:
    """Weekdays (Sunday 0) as APScheduler's names: its numbers start at Monday."""
    if len(days) == len(WEEKDAYS):
        return "*"
    return ",".join(WEEKDAYS[d] for d in sorted(days))


def _bad(expr: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"bad cron expression {expr[:_SHOWN]!r}: {why}")
