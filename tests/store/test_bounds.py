"""What the store keeps in memory stays bounded (issue 16): the key index's RocksDB
memtables however many records it indexes, the damaged records the CommitLog
remembers by what is still on local disk, the dispatcher's in-memory hand-off by a
number of records."""

from __future__ import annotations

from pathlib import Path

from chronomq.memtrace import rocksdb_figures
from store.clock import SystemClock
from store.dispatcher import RECENT_RECORDS, Dispatcher
from store.index import WRITE_BUFFER_BYTES, KeyIndex
from store.message import FLAG_FOREIGN_ID, FLAG_TIMER_DELIVERY, DispatchInfo
from tests.store.test_commitlog import _append, _close, _open, _records


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
            most = max(most, rocksdb_figures({"i": index.kv})["i"]["memtables"])
    finally:
        index.close()
    # Then RocksDB held at most two write buffers in memory (the 64 MiB default held
    # every key)
    assert most <= 2 * WRITE_BUFFER_BYTES + (1 << 20)


def test_damaged_records_are_forgotten_with_their_segment(tmp_path: Path) -> None:
    # Given a CommitLog with damaged records reported in its oldest segment
    log = _open(tmp_path, segment_bytes=16 << 10)
    log.start()
    try:
        first = _append(log, _records(100))  # one batch: one segment
        _append(log, _records(100))
        for offset in first:
            log.damaged(offset, "a flipped byte")
        assert log.damaged_records == 100
        # When retention deletes that segment
        assert log.delete_oldest_segment() > 0
        # Then they are still counted, but memory no longer holds them
        assert log.damaged_records == 100
        assert not log._damaged  # only damaged records still on local disk are held
    finally:
        _close(log)


def test_the_dispatch_hand_off_holds_at_most_recent_records(tmp_path: Path) -> None:
    # Given a dispatcher that is not keeping up (not started)
    log = _open(tmp_path)
    try:
        dispatcher = Dispatcher("test", log, [], SystemClock())
        # When the writer offers 40 Sends of 1,000 messages each
        for batch in range(40):
            dispatcher.offer([DispatchInfo(batch * 1000 + i, 1, 0, 0, 0, 0, 0, "", "t", "",
                                           "") for i in range(1000)])
        # Then memory holds at most RECENT_RECORDS of them (the rest is read from disk)
        assert sum(map(len, dispatcher._recent)) <= RECENT_RECORDS < 40_000
    finally:
        log.close()
