"""CallBudget: how many calls may wait at once, so idle streams and parked long polls never
take the threads short calls need.

A gRPC server here runs every call on a thread of its pool, and a waiting call (a
Subscribe or SendStream stream, a long-polling Pop or ReceiveMessage) keeps its thread
while it waits.  So the pool is sized ``worker_threads`` (short calls) plus the two
budgets (``max_streams``, ``max_long_polls``), and a waiting call first takes a place in
its budget: the whole server's, and its connection's (``max_waiting_per_connection``,
so one client cannot take them all).  With no place left the call is refused at once
with RESOURCE_EXHAUSTED naming the setting; it never queues behind the others.
Thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from store.errors import ResourceExhausted

STREAM, LONG_POLL = "stream", "long poll"


class CallBudget:
    def __init__(self, max_streams: int, max_long_polls: int, per_connection: int,
                 section: str = "server") -> None:
        self._limits = {STREAM: (max_streams, f"{section}.max_streams"),
                        LONG_POLL: (max_long_polls, f"{section}.max_long_polls")}
        self._per_connection = per_connection
        self._section = section
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._by_peer: Counter[str] = Counter()
        self.refused = 0

    @contextmanager
    def hold(self, kind: str, peer: str) -> Iterator[None]:
        """A place for one waiting call of ``kind`` from connection ``peer`` while the
        block runs; ``ResourceExhausted`` when there is none."""
        limit, setting = self._limits[kind]
        with self._lock:
            if self._open[kind] >= limit:
                self.refused += 1
                raise ResourceExhausted(f"{self._open[kind]} {kind}s are open, the most "
                                        f"this server takes ({setting} = {limit}); retry "
                                        "later or raise it")
            if self._by_peer[peer] >= self._per_connection:
                self.refused += 1
                raise ResourceExhausted(
                    f"this connection has {self._by_peer[peer]} streams and long polls "
                    f"open, the most one connection may hold ({self._section}."
                    f"max_waiting_per_connection = {self._per_connection})")
            self._open[kind] += 1
            self._by_peer[peer] += 1
        try:
            yield
        finally:
            with self._lock:
                self._open[kind] -= 1
                self._by_peer[peer] -= 1
                if not self._by_peer[peer]:
                    del self._by_peer[peer]

    def figures(self, prefix: str) -> dict[str, float]:
        with self._lock:
            return {f"{prefix}.open_streams": self._open[STREAM],
                    f"{prefix}.parked_long_polls": self._open[LONG_POLL],
                    f"{prefix}.refused_waits": self.refused}
