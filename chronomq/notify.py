"""Wakes long-polling Pops when messages of a topic become visible, without busy polling.

The dispatcher thread calls ``arrived(topics)``.  A waiter reads the topic's generation
*before* it looks for messages and then waits for the generation to change, so an arrival
between the look and the wait is never missed.  Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


class ArrivalNotifier:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generations: dict[str, int] = {}
        self._closed = False

    def generation(self, topic: str) -> int:
        return self._generations.get(topic, 0)

    def arrived(self, topics: Iterable[str]) -> None:
        with self._cond:
            for t in set(topics):
                self._generations[t] = self._generations.get(t, 0) + 1
            self._cond.notify_all()

    def wait(self, topic: str, seen_generation: int, timeout_s: float,
             also: Callable[[], bool] | None = None) -> bool:
        """Block until ``topic`` has news since ``seen_generation``, ``also()`` holds
        (checked when ``wake`` is called), or timeout/close."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or self._generations.get(topic, 0) != seen_generation
                or (also is not None and also()),
                timeout_s)

    def poll(self, topic: str, wait_s: float, fetch: Callable[[], Sequence[T]],
             active: Callable[[], bool]) -> Sequence[T]:
        """Long polling: ``fetch()`` now, and again on every arrival on ``topic``, until it
        returns something, ``wait_s`` has passed, ``active()`` turns false or the notifier
        is closed (shutdown: long polls answer at once)."""
        deadline = time.monotonic() + wait_s
        while True:
            seen = self.generation(topic)
            got = fetch()
            left = deadline - time.monotonic()
            if got or left <= 0 or not active() or self._closed:
                return got
            self.wait(topic, seen, left)

    def wake(self) -> None:
        """Let every waiter re-check its ``also`` condition."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Release every waiter (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
