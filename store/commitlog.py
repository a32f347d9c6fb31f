"""The CommitLog: segmented, append-only, CRC-framed; the one write-ahead log.

Files (in ``<data>/commitlog/``)::

    00000000000000000000.log     a segment; the name is the offset of its first byte
    00000000001073741824.log     next segment; a segment is rolled before a batch would
                                 push it past ``segment_bytes`` (records never span files)
    checkpoint                   the last offset known to be fsynced (see ``store.checkpoint``)

Appends go through one named writer thread (``commitlog-writer``) that implements group
commit: every batch queued while the previous fsync ran is written with one ``write`` and
covered by one ``fsync``; each caller's future resolves only after that (``flush=sync``).
With ``flush=async`` futures resolve after the write, and a flush runs every
``flush_interval_ms``.

Recovery (``open``) scans from the checkpoint to the end, checks every record's magic and
CRC and truncates a torn tail (a bad record with nothing valid after it in the newest
segment).  Any other bad record is damaged: it is logged ("damaged record", file, offset),
counted (``damaged_records``) and skipped, never stopping the start or the records after it
(``store.recovery`` has the rules).  Data missing below the checkpoint (the disk lost what
was fsynced) is reported and recovered like a torn tail.  Readers that follow the log
skip a damaged record the same way (``decode_records``); a reader's position that may
point inside a record is checked with ``record_boundary``.

A write that finds the volume full (ENOSPC, EDQUOT) fails only its batch, with
``ResourceExhausted``: the segment is cut back to its last whole batch, the preparers'
``add_rollback`` callbacks give back what they took (queue offsets), and later appends
go on once there is room.  Any other write error makes the log read-only.  A checkpoint
that cannot be written for want of space is only a hint lost: recovery scans further.

Thread-safety: ``append`` and the read methods may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

from store import recovery
from store.checkpoint import OffsetCheckpoint
from store.clock import Clock
from store.crashpoint import crashpoint
from store.disk import NO_SPACE
from store.errors import DamagedRecord, ResourceExhausted, StorageIOError, Unavailable
from store.message import DispatchInfo, decode_dispatch_infos
from store.segments import Segment, SegmentFiles

log = logging.getLogger(__name__)


# A batch preparer is called on the writer thread with the CommitLog offset its first
# record will have; it returns the encoded records and the value the caller's future gets.
Prepare = Callable[[int], tuple[list[bytes], Any]]


@dataclass(frozen=True, slots=True)
class CommitLogStats:
    min_offset: int
    max_offset: int
    confirmed_offset: int
    segments: int
    appended_batches: int
    fsyncs: int
    bytes_on_disk: int


class RecordChunk(NamedTuple):
    """Records read for a dispatcher: ``records`` decoded from ``data`` (which starts at
    ``offset``); ``used`` is how far they take the reader: past the records, or past a
    damaged record (then ``records`` is empty)."""

    offset: int
    data: bytes
    records: list[DispatchInfo]
    used: int


class CommitLog:
    """Segmented append-only log of CRC-framed records.  Thread-safe."""

    def __init__(
        self,
        directory: str,
        clock: Clock,
        segment_bytes: int = 1 << 30,
        flush_sync: bool = True,
        flush_interval_ms: int = 200,
    ) -> None:
        self._dir = directory
        self._clock = clock
        self._segment_bytes = segment_bytes
        self._flush_sync = flush_sync
        self._flush_interval_ms = flush_interval_ms
        self._files = SegmentFiles(directory)
        self._cond = threading.Condition()  # pending appends (the writer waits on it)
        self._confirmed_cond = threading.Condition()  # readers wait for new data on it
        self._pending: list[tuple[Prepare, Future[Any]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._written = 0  # end of the data handed to the OS
        self._confirmed = 0  # end of the data that dispatchers may read (durable in sync mode)
        self._flushed = 0  # end of the data known fsynced
        self._checkpoint = OffsetCheckpoint(os.path.join(directory, "checkpoint"))
        self._listeners: list[Callable[[list[Any]], None]] = []
        self._rollbacks: list[Callable[[list[Any]], None]] = []
        self._failure: str | None = None  # set after an I/O error: no more appends
        self._batches = 0
        self._fsyncs = 0
        # offsets of damaged records seen that are still on local disk (a deleted
        # segment takes its own with it), and how many were ever seen
        self._damaged: set[int] = set()
        self._damaged_seen = 0
        self._damaged_lock = threading.Lock()

    # ------------------------------------------------------------------ life cycle

    def open(self) -> int:
        """Recover the log from disk; return the end offset.  Call before ``start``."""
        end = self._recover(self._files.open_all(), self._checkpoint.read())
        self._written = self._confirmed = self._flushed = end
        self._checkpoint.write(end)
        return end

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="commitlog-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Refuse new appends, finish queued ones, fsync and write the checkpoint."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._fsync_active()
        except OSError as exc:  # the data is as durable as the last fsync made it
            log.error("final commitlog fsync failed: %s", exc)
        self._write_checkpoint()
        with self._confirmed_cond:  # readers waiting for new data: there is none coming
            self._confirmed_cond.notify_all()

    def close(self) -> None:
        """Close the segment files (after ``stop`` and after the dispatchers stopped)."""
        self._files.close()

    def add_rollback(self, callback: Callable[[list[Any]], None]) -> None:
        """``callback(results)`` runs on the writer thread when a batch could not be
        written for want of space, with the values its preparers returned: undo them."""
        self._rollbacks.append(callback)

    def add_listener(self, callback: Callable[[list[Any]], None]) -> None:
        """``callback(results)`` runs on the writer thread after each confirmed batch, with
        the values its preparers returned, in log order."""
        self._listeners.append(callback)

    # ------------------------------------------------------------------ appends

    def append(self, prepare: Prepare) -> Future[Any]:
        """Queue a batch; the future resolves once it is durable (sync) or written (async)."""
        fut: Future[Any] = Future()
        with self._cond:
            if self._stopping:
                raise Unavailable("the broker is shutting down")
            if self._failure is not None:
                raise Unavailable(self._failure)
            self._pending.append((prepare, fut))
            self._cond.notify()
        return fut

    def _run(self) -> None:
        last_flush_ms = self._clock.monotonic_ms()
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    timeout = None if self._flush_sync else self._flush_interval_ms / 1000
                    if not self._cond.wait(timeout) and not self._flush_sync:
                        break
                batch, self._pending = self._pending, []
                stopping = self._stopping
            if batch:
                try:
                    self._write_batch(batch)
                except Exception as exc:  # fail this batch and every later append
                    log.exception("commitlog write failed; refusing further appends")
                    self._failure = (f"the commitlog is read-only after a write error ({exc}); "
                                     "fix the disk and restart the broker")
                    err = StorageIOError(f"commitlog write failed: {exc}")
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(err)
            now = self._clock.monotonic_ms()
            if not self._flush_sync and now - last_flush_ms >= self._flush_interval_ms:
                self._fsync_active()
                last_flush_ms = now
            if stopping and not batch:
                return

    def _write_batch(self, batch: list[tuple[Prepare, Future[Any]]]) -> None:
        offset = self._written
        chunks: list[bytes] = []
        done: list[tuple[Future[Any], Any]] = []
        for prepare, fut in batch:
            try:
                records, result = prepare(offset)
            except Exception as exc:
                fut.set_exception(exc)
                continue
            chunks.extend(records)
            offset += sum(map(len, records))
            done.append((fut, result))
        data = b"".join(chunks)
        if data:
            try:
                self._write_out(data)
            except OSError as exc:
                if exc.errno not in NO_SPACE:
                    raise
                self._refuse(done, exc)
                return
        with self._confirmed_cond:
            self._confirmed = self._written
            self._confirmed_cond.notify_all()
        results = [result for _, result in done]
        for callback in self._listeners:
            callback(results)
        for fut, result in done:
            fut.set_result(result)
        if self._flush_sync and self._batches % 256 == 0:
            self._write_checkpoint()
            crashpoint("commitlog.checkpoint")

    def _write_out(self, data: bytes) -> None:
        """Write (and with ``flush=sync`` fsync) one batch at the end of the log.  If the
        volume is full, the active segment is cut back to its last whole batch first."""
        seg = self._active_for(len(data))
        try:
            written = os.write(seg.fd, data)
            while written < len(data):  # os.write may be partial on huge buffers
                written += os.write(seg.fd, data[written:])
            crashpoint("commitlog.after_write")
            if self._flush_sync:
                os.fdatasync(seg.fd)
        except OSError as exc:
            if exc.errno in NO_SPACE:  # nothing of this batch stays (errors: read-only)
                os.ftruncate(seg.fd, seg.size)
                os.fdatasync(seg.fd)
            raise
        seg.size += len(data)
        self._written += len(data)
        if self._flush_sync:
            crashpoint("commitlog.after_fsync")
            self._fsyncs += 1
            self._flushed = self._written
        self._batches += 1

    def _refuse(self, done: list[tuple[Future[Any], Any]], exc: OSError) -> None:
        """A batch the full volume refused: its callers learn it, its preparers undo."""
        log.warning("commitlog: the volume is full (%s); %d appends refused", exc, len(done))
        results = [result for _, result in done]
        for callback in self._rollbacks:
            callback(results)
        err = ResourceExhausted(f"the data volume of {self._dir} is full ({exc.strerror}): "
                                "not stored; retry once space is freed")
        for fut, _ in done:
            fut.set_exception(err)

    def _write_checkpoint(self) -> None:
        try:
            self._checkpoint.write(self._flushed)
        except OSError as exc:  # a hint for recovery, not data: it scans further instead
            if exc.errno not in NO_SPACE:
                raise
            log.warning("commitlog checkpoint not written: %s", exc)

    def _active_for(self, nbytes: int) -> Segment:
        seg = self._files.active
        assert seg is not None, "open() first"
        if seg.size > 0 and seg.size + nbytes > self._segment_bytes:
            self._fsync_active()
            seg = self._files.new(self._written)
            crashpoint("commitlog.after_roll")
        return seg

    def _fsync_active(self) -> None:
        seg = self._files.active
        if seg is not None and self._flushed < self._written:
            os.fdatasync(seg.fd)
            self._fsyncs += 1
            self._flushed = self._written
            self._write_checkpoint()

    # ------------------------------------------------------------------ reads

    @property
    def min_offset(self) -> int:
        return self._files.min_offset

    @property
    def confirmed_offset(self) -> int:
        """End of the data a dispatcher may read (durable when ``flush=sync``)."""
        return self._confirmed

    def wait_beyond(self, offset: int, timeout_s: float) -> int:
        """Block until ``confirmed_offset > offset`` or the timeout; return it."""
        with self._confirmed_cond:
            if self._confirmed <= offset and not self._stopping:
                self._confirmed_cond.wait(timeout_s)
            return self._confirmed

    def read(self, offset: int, size: int) -> bytes:
        """Read ``size`` bytes at ``offset`` (within one segment)."""
        with self._files.pinned(offset) as seg:
            data = os.pread(seg.fd, size, offset - seg.base_offset)
        if len(data) != size:
            raise StorageIOError(f"short read at commitlog offset {offset}")
        return data

    def read_from(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Read up to ``max_bytes`` of confirmed data starting at ``offset``.

        Returns ``(offset, data)``; the offset moves to the next segment's base when
        ``offset`` is at the end of one.  The data may end in the middle of a record.
        """
        confirmed = self._confirmed
        with self._files.pinned_for_reading(offset) as (offset, seg):
            end = min(confirmed, seg.end, offset + max_bytes)
            if end <= offset:
                return offset, b""
            return offset, os.pread(seg.fd, end - offset, offset - seg.base_offset)

    # ------------------------------------------------------------------ retention

    def segment_ends(self) -> list[tuple[int, int, float]]:
        """``(base_offset, end_offset, mtime_s)`` of every sealed (non-active) segment."""
        return [(s.base_offset, s.end, os.path.getmtime(s.path)) for s in self._files.sealed()]

    def delete_oldest_segment(self) -> int:
        """Delete the oldest sealed segment; return its size in bytes.  Damaged records
        it held are forgotten (still counted): memory holds only those on disk."""
        freed = self._files.delete_oldest()
        if freed and self._damaged:
            low = self.min_offset
            with self._damaged_lock:
                self._damaged = {o for o in self._damaged if o >= low}
        return freed

    def statistics(self) -> CommitLogStats:
        segs = self._files.all()
        return CommitLogStats(
            min_offset=segs[0].base_offset if segs else 0,
            max_offset=self._written,
            confirmed_offset=self._confirmed,
            segments=len(segs),
            appended_batches=self._batches,
            fsyncs=self._fsyncs,
            bytes_on_disk=sum(s.size for s in segs),
        )

    # ------------------------------------------------------------------ damage

    @property
    def damaged_records(self) -> int:
        """Distinct damaged records seen since the start (recovery, dispatch, reads)."""
        return self._damaged_seen

    def damaged(self, offset: int, reason: str, skip: str = "") -> DamagedRecord:
        """Count the damaged record at ``offset`` and return the error that names it.  It
        is logged at ERROR when first seen, or whenever a reader ``skip``s it."""
        seg = self._files.at_or_before(offset)
        err = DamagedRecord(seg.path if seg is not None else self._dir, offset, reason)
        with self._damaged_lock:
            first = offset not in self._damaged
            self._damaged.add(offset)
            self._damaged_seen += first
        log.log(logging.ERROR if first or skip else logging.DEBUG, "%s%s", err,
                f"; {skip}" if skip else "")
        return err

    def decode_records(self, offset: int, data: bytes, reader: str) -> RecordChunk:
        """Decode the whole, CRC-checked records at the start of ``data`` (what ``read_from``
        returned for ``offset``); a record bigger than ``data`` is read on its own.  A
        damaged record at ``offset`` is reported (ERROR, counted) and skipped."""
        valid, size = recovery.whole_records(data)
        if valid == 0 and size > len(data):  # one record bigger than the read
            offset, data = self.read_from(offset, size)
            valid, size = recovery.whole_records(data)
        if valid == 0 and data:
            with self._files.pinned(offset) as seg:
                end = min(self._confirmed, seg.end) - seg.base_offset
                nxt = recovery.resume_after(seg.fd, offset - seg.base_offset, end)
            skip = (end if nxt is None else nxt) - (offset - seg.base_offset)
            self.damaged(offset, "fails its magic/size/CRC check",
                         f"{reader} skips {skip} bytes")
            return RecordChunk(offset, b"", [], skip)
        if size < 0:
            data = data[:valid]  # stop before the damaged record; skipped on the next read
        records, used = decode_dispatch_infos(data, offset)
        return RecordChunk(offset, data, records, used)

    def record_boundary(self, offset: int) -> int:
        """``offset`` when a reader may resume there (a segment's start, the end, a
        record's start; or below the oldest segment, which retention removed), else the
        start of the record it points into; past the end: the end."""
        if offset >= self._written:
            return self._written
        try:
            with self._files.pinned(offset) as seg:
                pos = offset - seg.base_offset
                if pos == 0 or recovery.record_at(seg.fd, pos, seg.size):
                    return offset
                return seg.base_offset + recovery.boundary_before(seg.fd, pos, seg.size)
        except StorageIOError:  # below the oldest segment, or past a segment's end
            return offset

    # ------------------------------------------------------------------ recovery

    def _recover(self, segments: list[Segment], checkpoint: int | None) -> int:
        """Check records from the checkpoint to the end; skip damaged records; truncate a
        torn tail."""
        start = checkpoint if checkpoint is not None else segments[0].base_offset
        start = max(start, segments[0].base_offset)
        last = segments[-1]
        if start > last.end:
            log.error("%s: the checkpoint says %d bytes were fsynced but the log ends at %d: "
                      "committed data is missing (the disk lost it); recovering the newest "
                      "segment as a torn tail", last.path, start, last.end)
            start = last.base_offset
        for seg in segments:
            if seg.end > start:
                seg.size = recovery.recover_segment(
                    seg.fd, seg.path, seg.base_offset, seg.size,
                    max(start - seg.base_offset, 0), seg is last, self.damaged)
        return last.end
