"""Readers racing retention: a CommitLog read of a segment that retention deletes at the
same moment must give that segment's bytes or "not on local disk", never the bytes of
whatever file took over the closed descriptor's number (a revive once copied the wrong
message that way, under retention that deleted every passed segment each second)."""

from __future__ import annotations

import threading
from pathlib import Path

from store.clock import SystemClock
from store.commitlog import CommitLog
from store.errors import StorageIOError
from store.message import Message, encode_record


def test_reads_racing_segment_deletion_never_see_another_file(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), SystemClock(), segment_bytes=4096)
    log.open()
    log.start()
    written: dict[int, bytes] = {}  # offset -> record
    lock = threading.Lock()
    stop = threading.Event()
    wrong: list[str] = []
    reads = [0]

    def append(n: int) -> None:
        recs = [encode_record(Message(f"id{n}-{i}", "t", bytes([n % 251]) * 300))
                for i in range(4)]

        def prepare(offset: int) -> tuple[list[bytes], None]:
            with lock:
                for r in recs:
                    written[offset] = r
                    offset += len(r)
            return recs, None
        log.append(prepare).result(10)

    def reader() -> None:
        while not stop.is_set():
            with lock:
                oldest = [o for o in written if o >= log.min_offset][:8]
                expected = {o: written[o] for o in oldest}
            for offset, rec in expected.items():
                try:
                    got = log.read(offset, len(rec))
                except StorageIOError:
                    continue  # deleted: the caller goes to the tier
                reads[0] += 1
                if got != rec:
                    wrong.append(f"offset {offset}: read another file's bytes")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for n in range(600):
            append(n)  # rolls a new segment every ~3 appends: a new descriptor
            if n % 3 == 2:
                log.delete_oldest_segment()  # closes the oldest one's descriptor
                with lock:
                    for o in [o for o in written if o < log.min_offset]:
                        del written[o]
    finally:
        stop.set()
        for t in threads:
            t.join()
        log.stop()
        log.close()
    assert reads[0] > 500
    assert not wrong, f"{len(wrong)} of {reads[0]} reads: {wrong[:3]}"
