"""The broker process's garbage collector: set for a broker's allocation pattern, and
watched.

CPython's cyclic collector runs a young collection every 700 net allocations of container
objects (its default threshold), and a full one whenever the long-lived heap has grown by
a quarter since the last.  A broker allocates a tuple, a list or a record at nearly every
step of every message, and many of them live on (the wheel's entries, the delivered-copy
registry, the dispatcher's in-memory hand-off): at a hot instant it ran hundreds of young
collections a second and full collections that walk every tracked object of the heap,
each holding the GIL, so every thread (the timer, the writer, the dispatcher, the streams)
waits for them.  The figures are in bench/RESULTS.md.

- ``tune`` raises the young threshold to ``YOUNG``: collections run a seventieth as
  often; the garbage that only the collector can free (reference cycles) waits longer,
  at most ``YOUNG`` allocations' worth, which is small next to what a broker holds.
- ``freeze`` moves what startup built (the configuration, the topics, the recovered
  state) into the permanent generation, which no collection walks again.
- ``CollectorWatch`` counts collections by generation, their pauses and the objects they
  freed, for Stats and ``/metrics`` (``gc.*``): a long pause shows as a tail of delivery
  lateness, and a growing count of freed objects as cycles the code keeps making.

``serve`` calls these for the process it owns; library users (tests, tools that embed a
broker) keep their interpreter's settings.
"""

from __future__ import annotations

import gc
import time
from typing import Any

YOUNG = 50_000  # net container allocations between young collections (CPython: 700)
MIDDLE = 20  # young collections between middle ones (CPython: 10)
OLD = 10  # middle collections between full ones, when the heap grew by a quarter


class CollectorWatch:
    """Collections by generation, and their total and longest pause.  Called by the
    collector itself (which holds the GIL), so it needs no lock."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_s = 0.0
        self.longest_s = 0.0
        self.collected = 0  # objects freed by collections (cycles), not by reference counts
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.collections[info["generation"]] += 1
        self.collected += info["collected"]
        self.pause_s += pause
        self.longest_s = max(self.longest_s, pause)

    def figures(self) -> dict[str, float]:
        young, middle, full = self.collections
        return {"gc.collections_young": young, "gc.collections_middle": middle,
                "gc.collections_full": full, "gc.pause_seconds": self.pause_s,
                "gc.longest_pause_s": self.longest_s, "gc.collected_objects": self.collected,
                "gc.frozen_objects": gc.get_freeze_count()}


def tune() -> CollectorWatch:
    """Set the thresholds (``YOUNG``, ``MIDDLE``, ``OLD``) and start watching."""
    gc.set_threshold(YOUNG, MIDDLE, OLD)
    watch = CollectorWatch()
    gc.callbacks.append(watch)
    return watch


def freeze() -> None:
    """Collect once, then leave everything alive now out of every later collection."""
    gc.collect()
    gc.freeze()
