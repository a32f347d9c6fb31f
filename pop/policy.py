"""Retry policy of a consumer group: back-off schedule, jitter and maximum attempts.

A message a consumer releases without a delay (Nack) becomes visible again after the
group's back-off for its attempt: ``backoff_ms[attempt - 1]`` (the last step repeats),
stretched by a random factor in ``[1, 1 + jitter)`` so that a burst of failures does
not come back as one burst.  Jitter only ever lengthens a delay: a retry never comes
back earlier than its schedule says.  After ``max_attempts`` deliveries a message goes
to the group's dead-letter topic instead of coming back.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from store.errors import InvalidArgument

DEFAULT_BACKOFF_MS: tuple[int, ...] = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000,
    3_600_000, 7_200_000,
)
MAX_BACKOFF_MS = 7_200_000
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)\s*$")


def parse_duration_ms(text: str) -> int:
    """``"250ms"``, ``"5s"``, ``"2m"``, ``"1h"`` -> milliseconds."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidArgument(f"duration {text!r} is not a number with ms, s, m or h")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_backoff(text: str) -> tuple[int, ...]:
    """``"1s, 5s, 1m"`` -> ``(1000, 5000, 60000)``."""
    steps = tuple(parse_duration_ms(part) for part in text.split(","))
    if not steps or any(s <= 0 or s > MAX_BACKOFF_MS for s in steps):
        raise InvalidArgument("every back-off step must be between 1 ms and 2 h")
    return steps


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 16
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 1000:
            raise InvalidArgument("max_attempts must be between 1 and 1000")
        if not self.backoff_ms or any(s <= 0 or s > MAX_BACKOFF_MS for s in self.backoff_ms):
            raise InvalidArgument("every back-off step must be between 1 ms and 2 h")
        if not 0 <= self.jitter <= 1:
            raise InvalidArgument("jitter must be between 0 and 1")

    def backoff(self, attempt: int, rnd: random.Random | None = None) -> int:
        """The delay before delivery ``attempt + 1``, after ``attempt`` (>= 1) failed."""
        base = self.backoff_ms[min(max(attempt, 1), len(self.backoff_ms)) - 1]
        if not self.jitter:
            return base
        stretch = (rnd or random).random() * self.jitter
        return min(base + int(base * stretch), MAX_BACKOFF_MS)  # the cap is 2 h
