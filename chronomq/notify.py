"""Wakes long-polling Pops when messages of a topic become visible, without busy polling.

The dispatcher thread calls ``arrived(topics)``; waiters on the asyncio loop take the
topic's current event *before* they look for messages, then wait on it, so an arrival
between the look and the wait is never missed.  Thread-safe for ``arrived``; the other
methods run on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class ArrivalNotifier:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[str, asyncio.Event] = {}

    def event(self, topic: str) -> asyncio.Event:
        ev = self._events.get(topic)
        if ev is None:
            ev = self._events[topic] = asyncio.Event()
        return ev

    def arrived(self, topics: Iterable[str]) -> None:
        """Call from any thread."""
        names = set(topics)
        if names:
            self._loop.call_soon_threadsafe(self._wake, names)

    def _wake(self, topics: set[str]) -> None:
        for t in topics:
            ev = self._events.pop(t, None)
            if ev is not None:
                ev.set()

    @staticmethod
    async def wait(event: asyncio.Event, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
