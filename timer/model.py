"""The vocabulary of the timer: its configuration, what a Cancel or Reschedule did, and
its figures.  Immutable data only: thread-safe.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

TEN_YEARS_MS = 10 * 366 * 86_400_000
LATENESS_BOUNDS_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


@dataclass(frozen=True, slots=True)
class TimerConfig:
    enabled: bool = True
    wheel_window_ms: int = 60_000  # how far ahead the in-memory wheel holds entries
    max_delay_ms: int = TEN_YEARS_MS
    delivery_batch: int = 1000  # messages appended per CommitLog batch on delivery
    load_batch: int = 20_000  # entries moved from RocksDB to the wheel per loader step
    load_interval_ms: int = 1000  # how often the loader tops up the wheel
    rocks_horizon_ms: int = 2 * 3_600_000  # due later than this: parked in a TimerFlatFile
    bucket_ms: int = 3_600_000  # width of one TimerFlatFile
    preload_ahead_ms: int = 3_600_000  # a bucket moves into RocksDB this long before it starts
    preload_interval_ms: int = 60_000  # how often the preload job runs
    flat_batch_bytes: int = 1 << 20  # a TimerFlatFile object is written at this size ...
    flat_batch_ms: int = 1000  # ... or this age, whichever comes first


class TimerOutcome(enum.Enum):
    CANCELLED = 1
    RESCHEDULED = 2
    ALREADY_DELIVERED = 3
    NOT_FOUND = 4


@dataclass(frozen=True, slots=True)
class TimerChange:
    """What a Cancel or Reschedule did: ``CANCELLED``/``RESCHEDULED`` when ``changed`` (the
    pending messages it reached) is at least 1, else why none was reached."""

    outcome: TimerOutcome
    changed: int


@dataclass(frozen=True, slots=True)
class TimerStats:
    pending_wheel: int
    pending_rocksdb: int
    next_due_ms: int
    delivered: int
    cancelled: int
    rescheduled: int
    last_delivery_ms: int  # when the latest delivered batch was appended
    flat_buckets: int  # TimerFlatFile buckets on the tier
    flat_objects: int
    flat_damaged_objects: int  # TimerFlatFile objects found cut or damaged (since start)
    parked_unwritten: int  # far-future messages (in RocksDB) waiting for their
    #                        TimerFlatFile write
    lateness_bounds_ms: tuple[int, ...]
    lateness_counts: tuple[int, ...]  # one per bound (<= bound) plus one for beyond
