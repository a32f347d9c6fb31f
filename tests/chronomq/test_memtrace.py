"""The broker's malloc setting and its memory sampler (``chronomq.memtrace``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chronomq import memtrace
from store.kv import KV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not memtrace.mallinfo2(),
                                reason="glibc only")


_PROBE = """
import sys
from chronomq import memtrace
if sys.argv[1] == "limit":
    assert memtrace.limit_fragmentation()
big = bytearray(16 << 20)  # a RocksDB memtable block, a tier read buffer
del big
before = memtrace.mallinfo2()["hblkhd"]
block = bytearray(1 << 20)
print(memtrace.mallinfo2()["hblkhd"] - before)
"""


def _mapped_after_a_big_free(setting: str) -> int:
    """Bytes a 1 MiB block got as a mapping of its own, after a 16 MiB block was freed
    (a fresh process: the setting is process-wide)."""
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    return int(out.stdout)


def test_a_freed_big_block_no_longer_pulls_later_ones_into_the_heap() -> None:
    # Given glibc's default, a freed 16 MiB block raises its mmap threshold: a later
    # 1 MiB block comes from the heap, where it stays when freed
    assert _mapped_after_a_big_free("default") == 0
    # When the broker's setting is on, the same block gets a mapping of its own,
    # returned to the OS when freed
    assert _mapped_after_a_big_free("limit") >= 1 << 20


def test_a_sample_splits_memory_by_allocator(tmp_path: Path) -> None:
    # Given a sampler watching one RocksDB with something in its memtable
    kv = KV(str(tmp_path / "db"))
    try:
        kv.write([(b"k%d" % i, bytes(100)) for i in range(1000)])
        trace = memtrace.MemTrace(str(tmp_path / "trace"), 3600, 0, {"db": kv})
        (tmp_path / "trace").mkdir()
        # When it samples
        line = trace.sample()
    finally:
        kv.close()
    # Then the line names the process, glibc and RocksDB figures, and is in stats.jsonl
    assert line["anon_kb"] > 0 and line["threads"] >= 1
    assert line["malloc"]["arena"] > 0
    assert line["rocksdb"]["db"]["memtables"] > 100_000
    written = (tmp_path / "trace" / "stats.jsonl").read_text().splitlines()
    assert json.loads(written[-1]) == line


def test_off_unless_asked_for() -> None:
    assert memtrace.start_from_env({}, object()) is None
