"""memtrace: the broker's glibc malloc setting, and opt-in memory diagnostics of a running
broker (for ``bench/bench_soak.py``).

``limit_fragmentation`` (called by ``serve`` before anything else) fixes glibc's mmap
threshold at ``MMAP_THRESHOLD_BYTES``.  glibc otherwise raises the threshold to the size
of each large block it frees (up to 32 MiB): after the first RocksDB memtable block or
4-8 MiB read buffer was freed, every later block of up to that size came from the heaps
instead, and freed ones stayed there.  Measured (bench/bench_soak.py, 500 msgs/s, 7-8 min):
heaps 147 MB with 52 MB free-but-kept and rising, against 31 MB with 5 MB free with the
threshold fixed; the large blocks now go back to the OS when freed.

The diagnostics are off unless the process that runs ``chronomq serve`` sets one of
these environment variables (a debugging switch like Python's own
``PYTHONTRACEMALLOC``; ``serve`` reads them once, library code never does)::

    CHRONOMQ_MEMSTATS=<dir>       every interval, append one JSON line to <dir>/stats.jsonl
    CHRONOMQ_TRACEMALLOC=<dir>    the same, and also trace Python allocations and dump a
                                  tracemalloc snapshot to <dir>/snap-<n:04d>.pickle
    CHRONOMQ_MEMTRACE_INTERVAL_S  seconds between samples (default 60)
    CHRONOMQ_TRACEMALLOC_FRAMES   frames kept per allocation (default 1)

A line of ``stats.jsonl`` splits the resident memory into what each allocator holds, so a
growth can be put where it belongs::

    t_s            seconds since the sampler started
    rss_kb         VmRSS / RssAnon / Threads from /proc/self/status
    anon_kb, threads
    malloc         glibc mallinfo2(): arena (bytes the heaps took from the OS), hblkhd
                   (mmapped chunks), uordblks (in use), fordblks (free but kept:
                   fragmentation), keepcost
    rocksdb        per database: memtables, block cache, table readers (bytes)
    traced_bytes   Python objects alive (tracemalloc; 0 when not tracing), and the
    traced_peak    most alive at once since the previous line

The sampler is one daemon thread (``memtrace``); taking a snapshot holds the GIL for a
while, so tracing slows the broker down.  Thread-safe (one thread owns all its state).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
import tracemalloc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from store.kv import KV

if TYPE_CHECKING:
    from chronomq.broker import Broker

log = logging.getLogger(__name__)

_ROCKSDB_PROPERTIES = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "block_cache": "rocksdb.block-cache-usage",
    "table_readers": "rocksdb.estimate-table-readers-mem",
}


MMAP_THRESHOLD_BYTES = 256 << 10
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def limit_fragmentation(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve blocks of ``threshold_bytes`` or more with their own mapping, returned to
    the OS on free, and keep glibc from raising that threshold (see the module
    docstring).  False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes))


_MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def mallinfo2() -> dict[str, int]:
    """glibc's heap figures (empty where glibc or ``mallinfo2`` is missing)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in _MALLINFO2_FIELDS}


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, RssAnon, RssFile (kB) and Threads of a process, from /proc."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                out[name] = int(value.split()[0])
    return out


def rocksdb_figures(dbs: Mapping[str, KV]) -> dict[str, dict[str, int]]:
    """Memory figures of each open RocksDB, by name."""
    out: dict[str, dict[str, int]] = {}
    for name, db in dbs.items():
        try:
            out[name] = {k: db.property_int(p) for k, p in _ROCKSDB_PROPERTIES.items()}
        except Exception:  # closed meanwhile: diagnostics never fail the broker
            continue
    return out


class MemTrace:
    """The sampler thread (see the module docstring)."""

    def __init__(self, directory: str, interval_s: float, frames: int,
                 dbs: Mapping[str, KV]) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.frames = frames  # 0: no tracemalloc, figures only
        self._dbs = dict(dbs)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._snapshots = 0
        self._thread = threading.Thread(target=self._run, name="memtrace", daemon=True)

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        if self.frames and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:
                log.exception("memtrace sample failed")

    def sample(self) -> dict[str, Any]:
        """Write one stats line (and a snapshot when tracing); returns the line."""
        status = proc_status()
        line: dict[str, Any] = {
            "t_s": round(time.monotonic() - self._t0, 1), "rss_kb": status.get("VmRSS", 0),
            "anon_kb": status.get("RssAnon", 0), "threads": status.get("Threads", 0),
            "malloc": mallinfo2(), "rocksdb": rocksdb_figures(self._dbs),
        }
        line["traced_bytes"], line["traced_peak"] = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        if self.frames:
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            snap.dump(os.path.join(self.directory, f"snap-{self._snapshots:04d}.pickle"))
            line["snapshot"] = self._snapshots
            self._snapshots += 1
        with open(os.path.join(self.directory, "stats.jsonl"), "a", encoding="ascii") as f:
            f.write(json.dumps(line) + "\n")
        return line


def start_from_env(environ: Mapping[str, str], broker: Broker) -> MemTrace | None:
    """Start the sampler when ``environ`` asks for it (see the module docstring)."""
    traced = environ.get("CHRONOMQ_TRACEMALLOC", "")
    directory = traced or environ.get("CHRONOMQ_MEMSTATS", "")
    if not directory:
        return None
    frames = int(environ.get("CHRONOMQ_TRACEMALLOC_FRAMES", "1")) if traced else 0
    trace = MemTrace(directory, float(environ.get("CHRONOMQ_MEMTRACE_INTERVAL_S", "60")),
                     frames, broker.databases())
    trace.start()
    log.warning("memtrace on: %s every %.0f s (tracemalloc %s)", directory, trace.interval_s,
                f"{frames} frames" if frames else "off")
    return trace
