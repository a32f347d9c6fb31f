"""Topic holds: topics that exist here but answer no client yet.

A takeover (``cluster.takeover``) creates a departed broker's topics here before it has
adopted everything they carry: their groups' leases and positions, their pending delayed
messages, their recurring schedules.  Until the takeover is done, a Send, a Pop, a
Subscribe, a Cancel or Reschedule by id, or a debounce's replace on such a topic would be
answered from half of its state (a Cancel answering NOT_FOUND for a message that fires
anyway, a replace that replaces nothing).  So the topics are *held*: every path that
resolves a topic for a client (``MessageStore.check`` for sends, ``require_topic`` for
Pop and Subscribe, the timer's Cancel and Reschedule when they find nothing) raises
``Unavailable`` naming the takeover, and clients retry.  The broker's own writes (the
timer's deliveries, the adoption itself) do not pass here; revives and Nacks of the
held topics' leases wait (``pop.source.PopSource.serves``): an adopted lease the
departed broker had already replaced with a delayed retry copy is settled only when the
takeover adopts that copy (``cluster.adoption``), and revived before, the message came
twice (the failover chaos, with takeovers of 12-21 s).

A hold lives in memory; a takeover cut short by a restart holds its topics again before
the broker serves (``Takeover.restore``).  Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from store.errors import Unavailable
from store.names import split_broker_made


class TopicHolds:
    """Topic name -> why it is held (the broker being taken over)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}

    def hold(self, topics: Iterable[str], departed: str) -> None:
        with self._lock:
            for t in topics:
                self._held[t] = departed

    def release(self, topics: Iterable[str]) -> None:
        with self._lock:
            for t in topics:
                self._held.pop(t, None)

    def active(self) -> bool:
        """Whether any topic is held (a takeover is adopting state)."""
        return bool(self._held)

    def held(self) -> dict[str, str]:
        with self._lock:
            return dict(self._held)

    def held_for(self, topic: str) -> str | None:
        """The broker being taken over for which ``topic`` (or the topic a retry or
        dead-letter topic belongs to) is held; None: not held."""
        if not self._held:
            return None
        made = split_broker_made(topic)
        return self._held.get(topic) or (self._held.get(made[2]) if made else None)

    def check(self, topic: str) -> None:
        """Raise ``Unavailable`` when ``topic`` (or the topic a retry or dead-letter
        topic belongs to) is held."""
        departed = self.held_for(topic)
        if departed is not None:
            raise Unavailable(f"topic {topic!r} is being taken over from broker {departed}: "
                              "its leases and pending messages are being adopted; retry in "
                              "a moment")
