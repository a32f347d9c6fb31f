"""The broker process's garbage collector: set for a broker's allocation pattern, and
watched.

CPython's cyclic collector runs a young collection every 700 net allocations of container
objects (its default threshold), a middle one every tenth young one, and a full one every
tenth middle one once the objects promoted since the last full one pass a quarter of the
long-lived heap.  A broker allocates a tuple, a list or a record at nearly every step of
every message (a delivery batch of 1,000 drafts alone passes 700), and many of them live
on (the wheel's entries, the delivered-copy registry, the dispatcher's in-memory
hand-off): a hot instant set off young collections by the thousand and full ones that
walk every tracked object of the heap, each holding the GIL, so every thread (the timer,
the writer, the dispatcher, the streams) waited for them.  The figures are in
bench/RESULTS.md.

- ``tune`` raises the young threshold to ``YOUNG`` (and the middle one to ``MIDDLE``):
  collections run about a seventieth as often.  A reference cycle, which only the
  collector frees, is freed later: a young one after at most ``YOUNG`` more allocations,
  an older one at the rarer middle and full collections (``gc.collected_objects`` shows
  whether the code makes them at all).
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
