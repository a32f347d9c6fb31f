"""LeaseCounts: the lease book's counters, for ``PopStats`` and ``GroupStats``.

Messages popped and acked in all, and per (group, user topic) the entries revived
(their lease ran out), released (Nack) and dead-lettered.  In memory only: a restart
counts from zero, as every figure of ``statistics()`` does.  The lease book
(``pop.leasebook``) counts as it marks entries done; what is open or waiting it reads
from its leases, not from here.

Thread-safe: one lock of its own, held for the counting only.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Literal

Outcome = Literal["released", "revived"]


class LeaseCounts:
    """Counters of popped, acked, revived, released and dead-lettered.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._popped = self._acked = 0
        self._revived: Counter[tuple[str, str]] = Counter()
        self._released: Counter[tuple[str, str]] = Counter()
        self._dead: Counter[tuple[str, str]] = Counter()

    def popped(self, n: int) -> None:
        with self._lock:
            self._popped += n

    def acked(self, n: int) -> None:
        with self._lock:
            self._acked += n

    def requeued(self, pair: tuple[str, str], outcome: Outcome, dead: bool) -> None:
        """One entry of (group, user topic) went back: dead-lettered, else ``outcome``."""
        with self._lock:
            counter = self._dead if dead else \
                self._released if outcome == "released" else self._revived
            counter[pair] += 1

    def totals(self) -> tuple[int, int, int, int, int]:
        """Popped, acked, revived, released and dead-lettered, over every group."""
        with self._lock:
            return (self._popped, self._acked, sum(self._revived.values()),
                    sum(self._released.values()), sum(self._dead.values()))

    def of(self, pair: tuple[str, str]) -> tuple[int, int]:
        """Redelivered (revived or released) and dead-lettered of (group, user topic)."""
        with self._lock:
            return self._revived[pair] + self._released[pair], self._dead[pair]
