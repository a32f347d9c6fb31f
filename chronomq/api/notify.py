"""Wakes long-polling Pops and idle Subscribe streams when messages of a topic become
visible, without busy polling and without waking the waiters of other topics.

The dispatcher thread calls ``arrived(topics)``.  A waiter reads the topic's generation
*before* it looks for messages and then waits for the generation to change, so an arrival
between the look and the wait is never missed.  Each topic with waiters has its own
condition (sharing one lock), made on the first wait and dropped with the last waiter: an
arrival wakes that topic's waiters only, so a thousand parked calls on other topics cost
nothing.  Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


class ArrivalNotifier:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations: dict[str, int] = {}
        self._conditions: dict[str, tuple[threading.Condition, list[int]]] = {}
        self._closed = False

    def generation(self, topic: str) -> int:
        return self._generations.get(topic, 0)

    def arrived(self, topics: Iterable[str]) -> None:
        with self._lock:
            for t in set(topics):
                self._generations[t] = self._generations.get(t, 0) + 1
                waiting = self._conditions.get(t)
                if waiting is not None:
                    waiting[0].notify_all()

    def wait(self, topic: str, seen_generation: int, timeout_s: float,
             also: Callable[[], bool] | None = None) -> bool:
        """Block until ``topic`` has news since ``seen_generation``, ``also()`` holds
        (checked when ``wake(topic)`` is called), or timeout/close."""
        with self._lock:
            waiting = self._conditions.get(topic)
            if waiting is None:
                waiting = self._conditions[topic] = (threading.Condition(self._lock), [0])
            waiting[1][0] += 1
            try:
                return waiting[0].wait_for(
                    lambda: self._closed or self._generations.get(topic, 0) != seen_generation
                    or (also is not None and also()),
                    timeout_s)
            finally:
                waiting[1][0] -= 1
                if not waiting[1][0]:
                    del self._conditions[topic]

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

    def wake(self, topic: str) -> None:
        """Let the waiters of ``topic`` re-check their ``also`` condition."""
        with self._lock:
            waiting = self._conditions.get(topic)
            if waiting is not None:
                waiting[0].notify_all()

    def close(self) -> None:
        """Release every waiter (shutdown)."""
        with self._lock:
            self._closed = True
            for cond, _ in self._conditions.values():
                cond.notify_all()
