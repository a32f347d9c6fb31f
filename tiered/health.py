"""How far behind the tier is: the dispatcher's counters (``TierStats``) and the upload
lag as a reader of the tier (a mount, a broker taking this one over) sees it.

The lag is the age of the oldest record not yet readable from the tier: the record at
the checkpoint, a batch still buffering, or an uploaded batch whose metadata copy is not
in the tier yet (``tiered.uploads.Mirror``'s floor: until it is, a mount sees only what
is below it).  Ages of batches are on the monotonic clock; a record's on the wall clock
(its ``store_at_ms``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from store.clock import Clock
from store.commitlog import CommitLog
from store.errors import StoreError

_STORE_AT = struct.Struct(">Q")  # a record's store_at_ms, at byte 32 (store.message)


@dataclass(frozen=True, slots=True)
class TierStats:
    position: int  # CommitLog offset below which everything is in the tier, readable by a mount
    uploaded_records: int  # since start
    uploaded_bytes: int  # records and entries
    upload_batches: int  # committed queue batches
    failed_uploads: int  # since start: batches, index files, metadata copies not taken
    queues: int
    index_files: int
    expired_objects: int
    reused_records: int  # taken as the store's dispatcher decoded them, not decoded again
    damaged_objects: int = 0  # tier objects found short, missing or with a bad record
    last_upload_ms: int = 0  # wall time of the last successful upload (0: none yet)
    upload_lag_bytes: int = 0  # CommitLog confirmed offset - position
    upload_lag_s: float = 0.0  # age of the oldest record not yet in the tier (0: caught up)
    consecutive_failures: int = 0  # commits in a row with a failed upload (0: all went up)
    commits: int = 0  # since start: commits that uploaded something
    commit_seconds: float = 0.0  # their time, uploads to metadata copies (the lease's after)


def upload_lag(commitlog: CommitLog, checkpoint: int, buffering: float | None,
               floor: tuple[int, float] | None, clock: Clock) -> tuple[int, float]:
    """(position a reader of the tier sees, upload lag in seconds).  ``buffering``: when
    the oldest batch not up yet began (monotonic ms); ``floor``: the oldest uploaded batch
    whose metadata copy is missing (CommitLog offset, monotonic ms)."""
    position, lag_s = checkpoint, 0.0
    if checkpoint < commitlog.confirmed_offset:
        try:
            head = commitlog.read(checkpoint, 32 + _STORE_AT.size)
            lag_s = max(0.0, (clock.now_ms() - _STORE_AT.unpack_from(head, 32)[0]) / 1000)
        except (StoreError, OSError):  # passed meanwhile (a rewind, a roll): unknown
            pass
    if buffering is not None:  # a batch not up yet: at least its age (its first record
        # may be unreadable here: a roll, or local retention after a copy was made)
        lag_s = max(lag_s, (clock.monotonic_ms() - buffering) / 1000)
    if floor is not None:  # (local retention may have taken the record at the floor)
        position = min(position, floor[0])
        lag_s = max(lag_s, (clock.monotonic_ms() - floor[1]) / 1000)
    return position, lag_s
