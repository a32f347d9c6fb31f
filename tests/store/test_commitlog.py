"""CommitLog recovery on real files: torn tails are truncated, corruption is reported."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from store.clock import SystemClock
from store.commitlog import CommitLog
from store.message import Message, decode_record, encode_record


def _records(n: int, size: int = 100) -> list[bytes]:
    return [encode_record(Message(f"id{i}", "t", bytes([i % 251]) * size, queue_offset=i))
            for i in range(n)]


def _append(log: CommitLog, records: list[bytes]) -> list[int]:
    offsets: list[int] = []

    def prepare(offset: int) -> tuple[list[bytes], None]:
        for r in records:
            offsets.append(offset)
            offset += len(r)
        return records, None

    log.append(prepare).result(10)
    return offsets


def _open(path: Path, segment_bytes: int = 1 << 20) -> CommitLog:
    log = CommitLog(str(path), SystemClock(), segment_bytes=segment_bytes)
    log.open()
    return log


def _close(log: CommitLog) -> None:
    log.stop()
    log.close()


def test_append_read_and_reopen_across_segments(tmp_path: Path) -> None:
    log = _open(tmp_path, segment_bytes=2000)
    log.start()
    recs = _records(50)
    offsets = _append(log, recs[:25]) + _append(log, recs[25:])
    end = log.confirmed_offset
    assert log.statistics().segments > 1  # 50 x 171 bytes do not fit in 2000-byte segments
    _close(log)
    # When: reopened
    log = _open(tmp_path, segment_bytes=2000)
    assert log.confirmed_offset == end
    for off, rec in zip(offsets, recs, strict=True):
        assert decode_record(log.read(off, len(rec))).message_id == decode_record(rec).message_id
    log.close()


def test_torn_tail_is_truncated(tmp_path: Path) -> None:
    log = _open(tmp_path)
    log.start()
    recs = _records(10)
    _append(log, recs)
    end = log.confirmed_offset
    _close(log)
    os.remove(tmp_path / "checkpoint")  # recovery must scan everything
    seg = tmp_path / f"{0:020d}.log"
    # Given: half of an 11th record written when the process died
    with open(seg, "ab") as f:
        f.write(_records(11)[10][:60])
    log = _open(tmp_path)
    assert log.confirmed_offset == end
    assert os.path.getsize(seg) == end
    log.close()


def test_torn_header_is_truncated(tmp_path: Path) -> None:
    log = _open(tmp_path)
    log.start()
    _append(log, _records(3))
    end = log.confirmed_offset
    _close(log)
    with open(tmp_path / f"{0:020d}.log", "ab") as f:
        f.write(b"\xc4\xa0")
    log = _open(tmp_path)
    assert log.confirmed_offset == end
    log.close()


def test_corrupt_record_in_the_middle_is_reported(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    log = _open(tmp_path)
    log.start()
    offsets = _append(log, _records(10))
    end = log.confirmed_offset
    _close(log)
    os.remove(tmp_path / "checkpoint")
    seg = tmp_path / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    data[offsets[4] + 80] ^= 0xFF  # flip a body byte of record 4; 5..9 stay valid
    seg.write_bytes(bytes(data))
    # When: it opens, the damaged record is skipped and reported, not a torn tail
    with caplog.at_level(logging.ERROR):
        log = _open(tmp_path)
    assert log.confirmed_offset == end
    assert log.damaged_records == 1
    assert any("damaged record" in r.getMessage() and str(seg) in r.getMessage()
               and str(offsets[4]) in r.getMessage() for r in caplog.records)
    log.close()
    # and the file was not touched
    assert seg.read_bytes() == bytes(data)


def test_checkpoint_beyond_the_data_is_reported(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    log = _open(tmp_path)
    log.start()
    offsets = _append(log, _records(5))
    _close(log)
    seg = tmp_path / f"{0:020d}.log"
    os.truncate(seg, offsets[3] + 100)  # committed bytes vanished behind our back
    # When: it opens, the loss is reported and the cut record is a torn tail
    with caplog.at_level(logging.ERROR):
        log = _open(tmp_path)
    assert log.confirmed_offset == offsets[3]
    assert any("committed data is missing" in r.getMessage() for r in caplog.records)
    log.close()
