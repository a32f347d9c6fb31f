"""Record boundaries in a CommitLog segment: walking records, telling a torn tail from a
damaged record, and finding where valid records resume after one.

Every function reads one segment file through its descriptor with ``pread``; positions
are relative to the segment's start and ``end`` is how far the caller trusts the file
(its size at recovery, the confirmed end while the broker runs).

The rules for a record that fails its check at ``bad``:

1. Its magic is intact and a valid record starts exactly where its size says it ends (or
   that is the end): resume there.  A record forged inside the damaged body (a body may
   hold any bytes, including a whole encoded record) is never picked up.
2. Otherwise scan forward from ``bad + 1`` for the next offset where a CRC-valid record
   starts (the size field itself may be what was damaged).  None found: nothing valid
   follows it.

A bad record with nothing valid after it in the newest segment is a torn tail and the
caller truncates it; anywhere else it is a damaged record, reported and skipped.

Trade-off: rule 2 may resume inside a bad record's own body: a torn tail whose partial
body holds a whole encoded record, or a record whose size field and CRC were both hit.
Such a "record" must still pass its CRC, so it takes a body built to look like one; the
alternative, believing a size that runs past the end, would drop every valid record after
a damaged size field.

Thread-safe: pure functions over ``pread``.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

from store.message import HEADER, HEADER_PREFIX, RECORD_MAGIC, RecordError, check_record

log = logging.getLogger(__name__)

SCAN_CHUNK = 16 << 20  # bytes read at a time when walking or scanning a segment
_MAGIC = RECORD_MAGIC.to_bytes(4, "big")
_PREFIX = HEADER_PREFIX  # magic, total_size, crc32


class Step(NamedTuple):
    """One step of ``walk``: ``[at, next)`` is a valid record when ``problem`` is empty;
    else the record at ``at`` is bad and valid records resume at ``next`` (None: no valid
    record follows it before the end)."""

    at: int
    next: int | None
    problem: str


def record_at(fd: int, at: int, end: int) -> int:
    """The size of the CRC-valid record at ``at`` that ends by ``end``, else 0."""
    head = os.pread(fd, 8, at)
    if len(head) < 8 or head[:4] != _MAGIC:
        return 0
    total = int.from_bytes(head[4:8])
    if total < HEADER.size or at + total > end:
        return 0
    try:
        return check_record(os.pread(fd, total, at), 0)
    except RecordError:
        return 0


def next_record(fd: int, start: int, end: int) -> int | None:
    """The first position at or after ``start`` where a CRC-valid record starts."""
    pos = start
    while pos < end:
        data = os.pread(fd, min(SCAN_CHUNK, end - pos), pos)
        i = data.find(_MAGIC)
        while i >= 0:
            if record_at(fd, pos + i, end):
                return pos + i
            i = data.find(_MAGIC, i + 1)
        if pos + len(data) >= end:
            return None
        pos += max(len(data) - 3, 1)  # a magic may straddle the chunks
    return None


def resume_after(fd: int, bad: int, end: int) -> int | None:
    """Where valid records resume after the bad record at ``bad`` (rules in the module
    docstring); None when none follows before ``end``."""
    head = os.pread(fd, 8, bad)
    if len(head) == 8 and head[:4] == _MAGIC:
        total = int.from_bytes(head[4:8])
        after = bad + total
        if total >= HEADER.size and after == end:
            return None
        if total >= HEADER.size and after < end and record_at(fd, after, end):
            return after
    return next_record(fd, bad + 1, end)


def walk(fd: int, pos: int, end: int) -> Iterator[Step]:
    """Every record from ``pos`` to ``end``, valid or bad (see ``Step``); stops after a
    bad record that nothing valid follows."""
    want = SCAN_CHUNK
    while pos < end:
        data = os.pread(fd, min(want, end - pos), pos)
        p, total, resume = 0, 0, -1
        while p < len(data):
            left = len(data) - p
            if left >= 8 and data[p : p + 4] == _MAGIC:
                total = int.from_bytes(data[p + 4 : p + 8])
                if left < total <= end - pos - p:
                    break  # the record continues past this chunk: read on from it
            elif left < 8 and pos + len(data) < end:
                break  # not even a size yet: read on
            try:
                n = check_record(data, p)
            except RecordError as exc:
                nxt = resume_after(fd, pos + p, end)
                yield Step(pos + p, nxt, problem(exc))
                if nxt is None:
                    return
                resume = nxt
                break
            yield Step(pos + p, pos + p + n, "")
            p += n
        if resume >= 0:
            pos, want = resume, SCAN_CHUNK
            continue
        want = max(SCAN_CHUNK, total) if p == 0 else SCAN_CHUNK
        pos += p


def boundary_before(fd: int, target: int, end: int) -> int:
    """The last record boundary at or before ``target``, walking from position 0: the
    start of a valid or bad record, or where records resume after a bad one."""
    last = 0
    for step in walk(fd, 0, end):
        if step.at > target:
            break
        last = step.at
        if step.next is not None and step.next <= target:
            last = step.next
    return last


def problem(exc: RecordError) -> str:
    """What is wrong with a record, for the log line that reports it."""
    text = str(exc)
    return "wrong magic" + text[9:] if text.startswith("bad magic") else text


def whole_records(data: bytes) -> tuple[int, int]:
    """``(valid, size)``: the bytes of whole CRC-valid records at the start of ``data``,
    and what follows them: the size of a record cut off by the end of ``data`` (its magic
    is intact), 0 when ``data`` ends there or within 12 bytes, or -1 when the record there
    is bad.  (``check_record`` inlined: this runs over every byte a lagging dispatcher
    reads.)"""
    p, end = 0, len(data)
    view, unpack, crc32 = memoryview(data), _PREFIX.unpack_from, zlib.crc32
    while end - p >= _PREFIX.size:
        magic, total, crc = unpack(data, p)
        if magic != RECORD_MAGIC or total < HEADER.size:
            return p, -1
        if p + total > end:
            return p, total
        if crc32(view[p + 12 : p + total]) != crc:
            return p, -1
        p += total
    return p, 0


def recover_segment(fd: int, path: str, base_offset: int, size: int, pos: int, newest: bool,
                    damaged: Callable[[int, str, str], object]) -> int:
    """Walk a segment from ``pos``: report each damaged record (``damaged(commit
    offset, problem, what is skipped)``); in the ``newest`` segment truncate a torn tail.
    Returns the segment's size afterwards."""
    for step in walk(fd, pos, size):
        if not step.problem:
            continue
        if step.next is None and newest:
            log.warning("truncating torn tail of %s: %d bytes at offset %d", path,
                        size - step.at, base_offset + step.at)
            os.ftruncate(fd, step.at)
            os.fsync(fd)
            return step.at
        nxt = size if step.next is None else step.next
        damaged(base_offset + step.at, step.problem, f"recovery skips {nxt - step.at} bytes")
    return size
