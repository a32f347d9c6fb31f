"""The key index's RocksDB memtables stay bounded however many records it indexes
(issue 16): a real RocksDB."""

from __future__ import annotations

from pathlib import Path

from chronomq.memtrace import rocksdb_figures
from store.index import WRITE_BUFFER_BYTES, KeyIndex
from store.message import FLAG_FOREIGN_ID, FLAG_TIMER_DELIVERY, DispatchInfo


def test_key_index_memtables_stay_within_two_write_buffers(tmp_path: Path) -> None:
    # Given 80,000 delivered delayed messages (two index keys each) and keyed ones
    index = KeyIndex(str(tmp_path / "index"))
    most = 0
    offset = 0
    try:
        for batch in range(40):
            records = []
            for i in range(2000):
                mid = f"{batch:08d}{i:024d}"
                records.append(DispatchInfo(offset, 200, FLAG_FOREIGN_ID | FLAG_TIMER_DELIVERY,
                                            0, offset, 1, 1, mid, "orders", f"k{i}", ""))
                offset += 200
            index.dispatch(records, offset)
            most = max(most, rocksdb_figures({"i": index._kv._db})["i"]["memtables"])
    finally:
        index.close()
    # Then RocksDB held at most two write buffers in memory (the 64 MiB default held
    # every key)
    assert most <= 2 * WRITE_BUFFER_BYTES + (1 << 20)
