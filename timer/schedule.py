"""What is due when: counts of pending delayed messages per minute, hour and day, for
the console's Schedule page.

Read from the timer store's small values only: every pending message has exactly one of
an ``i`` value (in RocksDB or the wheel; the wheel holds nothing RocksDB does not) or an
``f`` value (parked for, or in, a TimerFlatFile), each 16 bytes (due time, CommitLog
offset).  No record body is read, no TimerFlatFile object fetched.  The cost is one
RocksDB iteration over those values (``bench/bench_console.py`` measures it; figures in
bench/RESULTS.md), so ``TimerService.schedule`` caches the answer and the
scan stops at ``limit`` entries (then ``partial`` says the counts cover only those).
Memory: the counts (60 + 72 + one per day with messages, at most ~3,700 for ten years).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from timer.store import TimerStore

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
MINUTES = 60
HOURS = 72


@dataclass(frozen=True, slots=True)
class Schedule:
    now_ms: int
    minute_start_ms: int  # now, floored to the minute (UTC)
    minutes: list[int]  # minute i: [minute_start_ms + i min, + 1 min)
    hour_start_ms: int  # now, floored to the hour
    hours: list[int]  # hour i: [hour_start_ms + i h, + 1 h)
    days: list[tuple[int, int]]  # (UTC day start, count) of every day from today on with any
    overdue: int  # due before minute_start_ms and not yet delivered
    total: int
    scanned: int
    partial: bool  # the scan stopped at its limit: the counts cover ``scanned`` entries
    took_ms: float


def due_schedule(timers: TimerStore, now_ms: int, limit: int = 2_000_000) -> Schedule:
    started = time.perf_counter()
    minute0 = now_ms - now_ms % MINUTE_MS
    hour0 = now_ms - now_ms % HOUR_MS
    day0 = now_ms - now_ms % DAY_MS
    minutes = Counter[int]()
    hours = Counter[int]()
    days = Counter[int]()
    overdue = scanned = 0
    for due in timers.pending_due_times(limit):
        scanned += 1
        if due < minute0:
            overdue += 1
            continue
        m = (due - minute0) // MINUTE_MS
        if m < MINUTES:
            minutes[m] += 1
        h = (due - hour0) // HOUR_MS
        if h < HOURS:
            hours[h] += 1
        days[(due - day0) // DAY_MS] += 1
    return Schedule(
        now_ms=now_ms, minute_start_ms=minute0, minutes=[minutes[i] for i in range(MINUTES)],
        hour_start_ms=hour0, hours=[hours[i] for i in range(HOURS)],
        days=[(day0 + d * DAY_MS, n) for d, n in sorted(days.items())],
        overdue=overdue, total=scanned, scanned=scanned, partial=scanned >= limit,
        took_ms=round((time.perf_counter() - started) * 1000, 3))
