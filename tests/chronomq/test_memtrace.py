"""The broker's malloc setting and its memory sampler (``chronomq.memtrace``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chronomq import memtrace
from store.kv import KV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not memtrace.mallinfo2(),
                                reason="glibc only")


def test_a_freed_big_block_no_longer_pulls_later_ones_into_the_heap() -> None:
    # Given the broker's malloc setting
    assert memtrace.limit_fragmentation()
    # When a big block (a RocksDB memtable block, a tier read buffer) is freed
    big = bytearray(16 << 20)
    del big
    # Then a later 1 MiB block still gets a mapping of its own, returned to the OS when
    # freed (glibc's default had raised its threshold to 16 MiB: into the heap it went)
    before = memtrace.mallinfo2()["hblkhd"]
    block = bytearray(1 << 20)
    assert memtrace.mallinfo2()["hblkhd"] - before >= 1 << 20
    del block
    assert memtrace.mallinfo2()["hblkhd"] == before


def test_a_sample_splits_memory_by_allocator(tmp_path: Path) -> None:
    # Given a sampler watching one RocksDB with something in its memtable
    kv = KV(str(tmp_path / "db"))
    try:
        kv.write([(b"k%d" % i, bytes(100)) for i in range(1000)])
        trace = memtrace.MemTrace(str(tmp_path / "trace"), 3600, 0, {"db": kv._db})
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
