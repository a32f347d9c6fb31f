"""TieredIndex: compacted hash-slot files in the tier, one ranged read per file for a
lookup, catalogue recovery, no duplicates on replay, expiry."""

from __future__ import annotations

import shutil
from pathlib import Path

from store.clock import ManualClock
from store.message import DispatchInfo
from tests.tiered.faults import FaultyProvider
from tiered.index import ENTRY, HEADER, SLOT, TieredIndex, compact, id_digest, key_digest
from tiered.provider import Provider
from tiered.providers.memory import MemoryProvider


def _fill(index: TieredIndex, first: int, n: int, keys: int) -> None:
    """Records ``first`` .. ``first + n - 1`` of two queues, as one dispatcher step."""
    covered = index.covered
    for qid in (0, 1):
        index.add_batch("t", qid, 0, [
            DispatchInfo(100 * i, 100, 0, qid, i // 2, 1000 + i, 0, f"id{i}", "t",
                         f"k{i % keys}", "")
            for i in range(first, first + n) if i % 2 == qid], covered)


def test_compaction_makes_each_slot_contiguous() -> None:
    entries = [(key_digest("t", f"k{i % 50}"), 0, i, i) for i in range(800)]
    data, slots = compact(entries)
    assert slots == 50 and len(data) == HEADER.size + slots * SLOT.size + 800 * ENTRY.size
    slot_of = {e[0] >> 32: (e[0] & 0xFFFFFFFF) % slots for e in entries}
    at = HEADER.size + slots * SLOT.size
    total = 0
    for s in range(slots):
        first, count = SLOT.unpack_from(data, HEADER.size + s * SLOT.size)
        assert first == total  # slots follow each other with no gaps
        total += count
        for j in range(first, first + count):  # and hold only their own entries
            assert slot_of[ENTRY.unpack_from(data, at + j * ENTRY.size)[0]] == s
    assert total == 800


def test_lookup_costs_one_ranged_read_per_file(tmp_path: Path,
                                               manual_clock: ManualClock) -> None:
    provider = FaultyProvider(MemoryProvider())
    index = TieredIndex(provider, "b0", str(tmp_path / "idx"), manual_clock, max_entries=400).open()
    for f in range(3):  # three sealed files of 200 records (400 entries) each
        _fill(index, 200 * f, 200, keys=20)
        assert index.seal_due()
        assert index.seal() is not None
    files = index.snapshot()
    assert len(files) == 3 and index.sealed_end == 200 * 3 * 100
    provider.reads = 0
    hits = index.lookup(key_digest("t", "k7"), files)
    assert provider.reads == 3  # one per file: the slot comes from the local copy
    assert sorted(h.store_at_ms - 1000 for h in hits) == list(range(7, 600, 20))
    assert all((h.topic, h.queue_id, h.queue_offset) == ("t", (h.store_at_ms - 1000) % 2,
                                                         (h.store_at_ms - 1000) // 2)
               for h in hits)
    (hit,) = index.lookup(id_digest("id321"), files)
    assert (hit.queue_id, hit.queue_offset) == (1, 160)
    # another broker mounting the tier has no local slot tables: two reads per file
    shutil.copytree(tmp_path / "idx", tmp_path / "other")
    for p in (tmp_path / "other").glob("*.slots"):
        p.unlink()
    other = TieredIndex(provider, "b0", str(tmp_path / "other"), manual_clock).open()
    provider.reads = 0
    assert len(other.lookup(key_digest("t", "k7"), other.snapshot())) == len(hits)
    assert provider.reads == 6


def test_catalogue_and_open_file_survive_a_restart_and_replay_adds_nothing(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    provider: Provider = MemoryProvider()
    index = TieredIndex(provider, "b0", str(tmp_path / "idx"), manual_clock, seal_ms=1000).open()
    _fill(index, 0, 100, keys=10)
    assert not index.seal_due()
    manual_clock.advance(1000)
    assert index.seal_due() and index.seal() is not None
    _fill(index, 100, 30, keys=10)  # in the open file, persisted
    index.persist()
    _fill(index, 130, 5, keys=10)  # not persisted: lost in the crash, replayed below
    with open(tmp_path / "idx" / "open", "ab") as f:
        f.write(b"\0\0\1\0torn")  # a frame cut short by the crash
    again = TieredIndex(provider, "b0", str(tmp_path / "idx"), manual_clock).open()
    assert again.snapshot() == index.snapshot()
    _fill(again, 50, 90, keys=10)  # a replay from before the last sealed file's end
    assert again.seal() is not None
    hits = again.lookup(key_digest("t", "k3"), again.snapshot())
    assert sorted(h.store_at_ms - 1000 for h in hits) == list(range(3, 140, 10))
    (_, second) = again.snapshot()
    assert (second.begin_offset, second.end_offset) == (100 * 100, 140 * 100)
    assert provider.exists("b0/index/catalog.json")
    assert (tmp_path / "idx" / "open").read_bytes() == b""  # sealed: the open file is empty


def test_expired_files_leave_the_catalogue_and_the_tier(tmp_path: Path,
                                                        manual_clock: ManualClock) -> None:
    provider: Provider = MemoryProvider()
    index = TieredIndex(provider, "b0", str(tmp_path / "idx"), manual_clock).open()
    _fill(index, 0, 10, keys=2)
    first = index.seal()
    _fill(index, 10, 10, keys=2)
    assert first is not None and index.seal() is not None
    doomed = index.expire(lambda f: f.end_ms >= 1010)
    assert doomed == [f"b0/index/{first.name}"]
    assert [f.begin_offset for f in index.snapshot()] == [1000]
    assert not (tmp_path / "idx" / f"{first.name}.slots").exists()
