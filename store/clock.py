"""Injected time.  Nothing in the project calls ``time.time()`` directly.

``SystemClock`` is the real one; ``ManualClock`` lets tests cross hours instantly with
``advance(ms)`` / ``set(ms)``.  Both are thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds."""
        ...

    def monotonic_ms(self) -> float:
        """A clock that never goes backwards, in milliseconds (for waits and deadlines)."""
        ...


class SystemClock:
    """The machine's clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return _boottime() * 1000.0


def _boottime() -> float:
    """Seconds of a clock that never goes back and, unlike ``time.monotonic`` on Linux,
    goes on while the machine is suspended (CLOCK_BOOTTIME): a lease judged on it never
    counts a suspended machine's time as not passed."""
    return time.clock_gettime(_BOOTTIME)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class ManualClock:
    """A clock that moves only when told to; for tests.  Thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def monotonic_ms(self) -> float:
        return float(self.now_ms())

    def advance(self, delta_ms: int) -> int:
        """Move forward by ``delta_ms`` and return the new time."""
        if delta_ms < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now_ms += delta_ms
            return self._now_ms

    def set(self, at_ms: int) -> None:
        """Jump to ``at_ms`` (never backwards)."""
        with self._lock:
            if at_ms < self._now_ms:
                raise ValueError("a clock does not go backwards")
            self._now_ms = at_ms
