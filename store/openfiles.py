"""The broker's open-file budget: how many ConsumeQueue descriptors the store may cache,
checked against the process's RLIMIT_NOFILE before anything is opened.

A broker's descriptors, and what bounds each kind::

    ConsumeQueue files     store.max_open_files (the FileCache; 0: what the limit leaves,
                           at most AUTO_MAX_CQ_FILES)
    RocksDB databases      ROCKSDB_DATABASES x (store.kv.ROCKSDB_MAX_OPEN_FILES table
                           files + ROCKSDB_FIXED_FILES: WAL, MANIFEST, LOG, LOCK, ...)
    CommitLog segments     one per segment on disk (kept open), plus the next one
    everything else        RESERVED_OTHER: sockets of gRPC clients, epoll and pipes, the
                           topic log, checkpoints, tier files, Python's own

When the soft limit is below what the budget wants and the hard limit allows more, the
soft limit is raised (as the Go runtime does for every program); when even the hard limit
is too low for the smallest working cache, the start fails with ``OpenFilesLimit``
naming RLIMIT_NOFILE and the value needed, before anything is opened.

Not thread-safe (called once, at start).
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass

from store.errors import InvalidArgument, StoreError
from store.kv import ROCKSDB_MAX_OPEN_FILES

log = logging.getLogger(__name__)

ROCKSDB_DATABASES = 3  # the key index, the POP checkpoints, the timer store
ROCKSDB_FIXED_FILES = 12  # per database, besides table files
RESERVED_OTHER = 256
MIN_CQ_FILES = 64  # below this the cache would thrash on a handful of busy queues
AUTO_MAX_CQ_FILES = 4096


class OpenFilesLimit(StoreError):
    """Raised when RLIMIT_NOFILE is too low for the configured caches."""


@dataclass(frozen=True, slots=True)
class OpenFilesPlan:
    limit: int  # RLIMIT_NOFILE's soft limit after any raise
    reserved: int  # descriptors kept for everything but the ConsumeQueue cache
    cq_files: int  # the ConsumeQueue FileCache's size


def reserved_files(commitlog_segments: int) -> int:
    """Descriptors for everything but the ConsumeQueue cache (module docstring)."""
    rocksdb = ROCKSDB_DATABASES * (ROCKSDB_MAX_OPEN_FILES + ROCKSDB_FIXED_FILES)
    return rocksdb + commitlog_segments + 1 + RESERVED_OTHER


def plan_open_files(max_open_files: int, commitlog_dir: str) -> OpenFilesPlan:
    """Size the ConsumeQueue cache: ``max_open_files`` (0: derived from the limit) next
    to what the rest of the broker needs; raise the soft limit if that helps; raise
    ``OpenFilesLimit`` if it cannot."""
    if max_open_files < 0:
        raise InvalidArgument("store.max_open_files must not be negative (0: automatic)")
    reserved = reserved_files(_segments(commitlog_dir))
    want = reserved + (max_open_files or AUTO_MAX_CQ_FILES)
    need = reserved + (max_open_files or MIN_CQ_FILES)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            log.info("raised RLIMIT_NOFILE's soft limit from %d to %d", soft, raised)
            soft = raised
    limit = soft if soft != resource.RLIM_INFINITY else want
    if limit < need:
        what = (f"store.max_open_files = {max_open_files}" if max_open_files
                else f"the smallest ConsumeQueue file cache ({MIN_CQ_FILES})")
        raise OpenFilesLimit(
            f"RLIMIT_NOFILE is {limit} (hard limit {_text(hard)}), but the broker needs "
            f"{need} open files: {what} plus {reserved} for RocksDB, CommitLog segments and "
            f"sockets; raise it (ulimit -n {need}, or LimitNOFILE={need} in a systemd unit)"
            + (" or lower store.max_open_files" if max_open_files else ""))
    cq_files = max_open_files or min(AUTO_MAX_CQ_FILES, limit - reserved)
    return OpenFilesPlan(limit, reserved, cq_files)


def _segments(commitlog_dir: str) -> int:
    try:
        return sum(1 for n in os.listdir(commitlog_dir) if n.endswith(".log"))
    except FileNotFoundError:
        return 0


def _text(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
