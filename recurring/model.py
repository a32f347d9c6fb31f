"""A recurring schedule and its fire times.

A schedule names a topic, a cron expression (crontab(5): five fields or a macro) or a
fixed interval in whole seconds, an IANA time zone, the message to send at each tick
(body, key, tag, properties), an optional start and end, and a misfire policy for ticks
missed while no broker ran: ``skip`` (none of them), ``once`` (the latest one), ``all``
(each, oldest first, at most ``misfire_bound``).

The cron expression is read as crontab(5) reads it (``recurring/crontab.py``: the
grammar, the macros, day of month OR weekday).  Fire times come from APScheduler's
triggers (``CronTrigger``, an ``OrTrigger`` of two for the OR rule, and
``IntervalTrigger``), so time zones and daylight-saving changes follow its rules: a
local time that does not exist (the spring gap) fires once, at the same distance after
the gap's start (``30 2 * * *`` in Europe/Berlin on the day clocks go from 02:00 to
03:00 fires at 03:30 CEST); a local time that happens twice (the autumn repeat) fires
twice (``30 1 * * *`` in America/New_York fires at 01:30 EDT and at 01:30 EST); an
interval counts real time, whatever the wall clock does.  A tick is named by its
instant in UTC milliseconds, and its message's id is ``<name>@<tick ms>``, or
``<name>~<generation>@<tick ms>`` for a name created again after a delete (``tick_id``:
the generation tells the new schedule's ticks from the old one's; ``~`` is never in a
name, so no other schedule's ids can be the same).

With ``jitter_ms`` a tick is delivered at its instant plus an offset in
``[0, jitter_ms)`` (``jitter_offset_ms``: a blake2b hash of the name, the generation and
the tick, so a tick sent again keeps its time, and schedules on the same minute spread
over the window); the id still names the tick, never the offset.  A tick sent by hand
(TriggerSchedule) is ``<name>!<ms>`` (``trigger_id``; ``!`` is in no name nor in a tick's
id, so it never meets a scheduled tick).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger

from recurring import crontab
from store.errors import InvalidArgument
from store.message import (
    MAX_KEY_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TAG_BYTES,
    encode_properties,
)
from store.names import check_name

MISFIRE = ("skip", "once", "all")
MAX_MISFIRE_BOUND = 10_000
MAX_BODY_BYTES = 64 << 10  # a schedule's message: kept in the schedule itself
MAX_INTERVAL_S = 10 * 366 * 86_400
MAX_NAME_BYTES = 100  # a tick's id ``<name>~<generation>@<ms>``: at most 128 characters,
MAX_GENERATION = 9_999_999  # 100 + 1 + 7 + 1 + 19 (a time below 2**63 ms); then wraps to 1
MAX_JITTER_MS = 3_600_000
RECENT_TICKS = 5  # sent ticks a schedule remembers (``recent``)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a user creates (see the module docstring); validated on creation."""

    name: str
    topic: str
    cron: str = ""
    every_s: int = 0
    time_zone: str = "UTC"
    body: bytes = b""
    key: str = ""
    tag: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    start_ms: int = 0  # 0: from now
    end_ms: int = 0  # 0: no end
    misfire: str = "once"
    misfire_bound: int = 100
    jitter_ms: int = 0  # 0: each tick delivered at its instant

    def validate(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        """Raise ``InvalidArgument`` naming what is wrong (builds the trigger too)."""
        check_schedule_name(self.name)
        check_name(self.topic, "topic")
        if bool(self.cron) == bool(self.every_s):
            raise InvalidArgument("give a cron expression or an interval (every_s), one of "
                                  "them")
        if self.every_s and not 1 <= self.every_s <= MAX_INTERVAL_S:
            raise InvalidArgument(f"every_s must be between 1 and {MAX_INTERVAL_S} seconds")
        if not self.body:
            raise InvalidArgument("a schedule needs a message body")
        if len(self.body) > max_body_bytes:
            raise InvalidArgument(f"the body is {len(self.body)} bytes, over the maximum of "
                                  f"{max_body_bytes} for a schedule's message")
        if len(self.key.encode()) > MAX_KEY_BYTES or len(self.tag.encode()) > MAX_TAG_BYTES:
            raise InvalidArgument("key or tag too long")
        encode_properties(self.properties, MAX_PROPERTIES_BYTES)
        if self.misfire not in MISFIRE:
            raise InvalidArgument(f"misfire must be one of {', '.join(MISFIRE)}")
        if not 1 <= self.misfire_bound <= MAX_MISFIRE_BOUND:
            raise InvalidArgument(f"misfire_bound must be between 1 and {MAX_MISFIRE_BOUND}")
        if self.start_ms < 0 or self.end_ms < 0 or (self.end_ms and
                                                    self.end_ms <= self.start_ms):
            raise InvalidArgument("end_ms must be after start_ms (0: none)")
        if not 0 <= self.jitter_ms <= MAX_JITTER_MS:
            raise InvalidArgument(f"jitter_ms must be between 0 and {MAX_JITTER_MS}")
        if self.every_s and self.jitter_ms >= self.every_s * 1000:
            raise InvalidArgument("jitter_ms must be less than the interval (every_s)")
        self.trigger()

    def zone(self) -> ZoneInfo:
        """The time zone: only a name of the IANA database (never a path read as one)."""
        if self.time_zone not in _zone_names():
            raise InvalidArgument(f"unknown time zone {self.time_zone[:64]!r} (an IANA name "
                                  "such as Europe/Berlin)")
        try:
            return ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise InvalidArgument(f"unknown time zone {self.time_zone[:64]!r}") from exc

    def trigger(self) -> BaseTrigger:
        zone = self.zone()
        start = _dt(self.start_ms) if self.start_ms else None
        end = _dt(self.end_ms) if self.end_ms else None
        if self.every_s:
            return IntervalTrigger(seconds=self.every_s, start_date=start or _dt(0),
                                   end_date=end, timezone=zone)
        return crontab.trigger(self.cron, zone, start, end)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["body"] = self.body.hex()
        return out

    @staticmethod
    def from_json(raw: dict[str, Any]) -> ScheduleSpec:
        return ScheduleSpec(**{**raw, "body": bytes.fromhex(raw["body"])})


def check_schedule_name(name: str, what: str = "schedule name") -> None:
    """Raise ``InvalidArgument`` unless ``name`` is a schedule's name."""
    if not name or len(name) > MAX_NAME_BYTES or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"{what} {name[:MAX_NAME_BYTES + 1]!r}: 1 to {MAX_NAME_BYTES} characters of "
            "letters, digits, '.', '_' and '-', starting with a letter or digit")


def tick_id(name: str, generation: int, tick_ms: int) -> str:
    """The message id of a schedule's tick (see the module docstring)."""
    return f"{name}@{tick_ms}" if generation == 0 else f"{name}~{generation}@{tick_ms}"


def trigger_id(name: str, generation: int, now_ms: int) -> str:
    """The message id of a tick sent by hand at ``now_ms`` (see the module docstring)."""
    return f"{name}!{now_ms}" if generation == 0 else f"{name}~{generation}!{now_ms}"


def jitter_offset_ms(name: str, generation: int, tick_ms: int, jitter_ms: int) -> int:
    """The tick's delivery offset in ``[0, jitter_ms)``: the same for the same tick."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.blake2b(f"{name}~{generation}@{tick_ms}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_ms


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def next_fire(trigger: BaseTrigger, after_ms: int) -> int | None:
    """The first tick strictly after ``after_ms`` (None: the schedule has ended)."""
    now = _dt(after_ms) + timedelta(milliseconds=1)
    nxt = trigger.get_next_fire_time(None, now)
    return _ms(nxt) if nxt is not None else None


def fires(trigger: BaseTrigger, after_ms: int, count: int) -> list[int]:
    """The next ``count`` ticks strictly after ``after_ms``."""
    out: list[int] = []
    at = after_ms
    while len(out) < count:
        nxt = next_fire(trigger, at)
        if nxt is None:
            break
        out.append(nxt)
        at = nxt
    return out


def encode_state(spec: ScheduleSpec, next_ms: int | None, paused: bool, fired: int,
                 last_error: str, generation: int = 0, last_ms: int = 0,
                 recent: list[tuple[int, str]] | None = None) -> bytes:
    return json.dumps({"spec": spec.to_json(), "next_ms": next_ms, "paused": paused,
                       "fired": fired, "last_error": last_error, "generation": generation,
                       "last_ms": last_ms, "recent": [list(r) for r in recent or []]},
                      sort_keys=True).encode()
