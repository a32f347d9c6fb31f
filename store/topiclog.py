"""TopicLog: the durable form of the topic catalogue, an append-only log of changes with
group commit, rewritten as a snapshot when it has grown.

File ``<data>/topics.log``, one record per line (LevelDB's ``log_format.txt`` in spirit,
as text)::

    <crc32 of the JSON bytes: 8 hex digits> <space> <JSON object, one line> \\n

    line 1   {"magic": "chronomq-topics", "version": 1}          the header
    then     {"op": "put", "topic": {"name": ..., "queue_count": ..., ...}}
             {"op": "delete", "name": ...}

Replaying the records in order gives the catalogue; a rewrite (``rewrite``: a temporary
file, fsynced, renamed over the log, the folder fsynced) holds one ``put`` per topic.

Trade-offs: text, not binary blocks, so ``cut -c10- topics.log | jq .`` reads it; JSON
costs little, as the whole file is parsed in one go (10,000 topics in about 0.1 s).  The
CRC covers the JSON only: a torn write leaves a line without its newline or failing its
CRC, never a record that reads as valid.

Durability (group commit, as ``store.kv.GroupCommit`` does for RocksDB): ``append``
writes the records of one change with one ``write``, no sync, and returns a ticket;
``wait(ticket)`` returns once an ``fdatasync`` that began after that write has finished.
The first waiter that finds no sync running syncs for everyone written before it began
and the others sleep on the sync that covers them, so N concurrent creates cost about
one fsync, not N.  A failed sync poisons the log:
every later ``append`` and ``wait`` raises, as the CommitLog does after a write error (the
kernel may have dropped the unwritten pages, so nothing after them can be trusted).

Recovery (``read``): a line that is cut off (no newline) or fails its CRC, with no valid
line after it, is a torn tail: dropped.  One with valid lines after it is damage: logged
at ERROR with its line number and skipped, never a refusal to start.  Either way the
caller rewrites the file before appending to it (``damaged``).

Thread-safe.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from store.errors import StorageIOError, StoreError
from store.files import fsync_dir

log = logging.getLogger(__name__)

MAGIC = "chronomq-topics"
VERSION = 1
HEADER: dict[str, Any] = {"magic": MAGIC, "version": VERSION}


def encode_line(record: dict[str, Any]) -> bytes:
    """One record as a line: CRC32 (8 hex digits), a space, compact JSON, a newline."""
    payload = json.dumps(record, separators=(",", ":"), sort_keys=True,
                         ensure_ascii=True).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def decode_line(line: bytes) -> dict[str, Any] | None:
    """The record of a whole line (its newline included or not), or None when it fails
    its CRC or is not a JSON object."""
    payload = _checked_payload(line.rstrip(b"\n"))
    if payload is None:
        return None
    try:
        record = json.loads(payload)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _checked_payload(line: bytes) -> bytes | None:
    """The JSON bytes of a line whose CRC matches them, else None."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:]
    try:
        return payload if int(line[:8], 16) == zlib.crc32(payload) else None
    except ValueError:
        return None


def _decode_all(lines: list[bytes]) -> list[dict[str, Any] | None]:
    """``decode_line`` of every line, with one JSON parse for all of them (the start of a
    broker with many topics) unless one of them is not JSON."""
    payloads = [_checked_payload(line) for line in lines]
    try:
        parsed = json.loads(b"[" + b",".join(p for p in payloads if p is not None) + b"]")
    except ValueError:
        return [decode_line(line) for line in lines]
    it = iter(parsed)
    out = [None if p is None else next(it) for p in payloads]
    return [r if isinstance(r, dict) else None for r in out]


def parse(data: bytes, path: str) -> tuple[list[dict[str, Any]], bool]:
    """The records of a log file's bytes (header excluded) and whether anything was
    dropped (a torn tail or a damaged line; see the module docstring)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a line cut off
    decoded = _decode_all(lines)
    last_good = max((i for i, r in enumerate(decoded) if r is not None), default=-1)
    records: list[dict[str, Any]] = []
    for i, record in enumerate(decoded[: last_good + 1]):
        if record is None:
            log.error("%s: line %d is damaged (bad CRC or JSON): skipped", path, i + 1)
        elif i == 0 and record.get("magic") == MAGIC:
            if record.get("version") != VERSION:
                raise StoreError(f"{path} has version {record.get('version')!r}; this "
                                 f"broker reads version {VERSION} (a newer broker wrote it)")
        else:
            records.append(record)
    torn = len(decoded) - last_good - 1 + (1 if tail else 0)
    if torn:
        log.warning("%s: dropping a torn tail (%d line(s) cut off or failing their CRC)",
                    path, torn)
    return records, torn > 0 or None in decoded


class _Sync(NamedTuple):
    """One fdatasync in progress: it covers every ticket up to ``target``."""

    target: int
    done: threading.Event


class TopicLog:
    """The append-only topic log (see the module docstring).  Thread-safe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = -1
        self._issued = 0  # tickets handed out: appends that have been written
        self._synced = 0  # every ticket up to this one is durable
        self._sync: _Sync | None = None  # the sync running now
        self._failure: str | None = None
        self.records = 0  # records in the file, the header excluded
        self.syncs = 0
        self.damaged = False  # read() dropped a torn tail or a damaged line

    def read(self) -> list[dict[str, Any]] | None:
        """The records on disk (None: no log yet); sets ``damaged``.  Call before
        ``rewrite`` or ``open_for_append``."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        records, self.damaged = parse(data, self.path)
        self.records = len(records)
        return records

    def open_for_append(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        """Replace the log with a header and ``records``, durably; every ticket issued so
        far is then durable too (the records hold the state they changed)."""
        data = b"".join(encode_line(r) for r in [HEADER, *records])
        tmp = self.path + ".tmp"
        with self._idle():  # a running sync's descriptor stays open until it is done
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
                fsync_dir(os.path.dirname(self.path) or ".")
            except OSError as exc:
                raise StorageIOError(f"cannot rewrite {self.path}: {exc}") from exc
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self.records = len(records)
            self._synced = self._issued

    @contextmanager
    def _idle(self) -> Iterator[None]:
        """Hold the lock with no sync running."""
        while True:
            with self._lock:
                sync = self._sync
                if sync is None:
                    yield
                    return
            sync.done.wait()

    def append(self, records: list[dict[str, Any]]) -> int:
        """Write ``records`` (not synced yet); the ticket to ``wait`` for."""
        data = b"".join(encode_line(r) for r in records)
        with self._lock:
            if self._failure is not None:
                raise StorageIOError(self._failure)
            try:
                written = os.write(self._fd, data)
                if written != len(data):  # a full volume: the line is cut off
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
            except OSError as exc:
                self._failure = f"topic log write failed: {exc}; restart the broker"
                raise StorageIOError(self._failure) from exc
            self.records += len(records)
            self._issued += 1
            return self._issued

    def wait(self, ticket: int) -> None:
        """Return once the append behind ``ticket`` is durable; raises
        ``StorageIOError`` if a sync failed.  A waiter sleeps on the one sync that covers
        its ticket (or on the running one, when the next must cover it), so a sync wakes
        only the writers it made durable."""
        while True:
            with self._lock:
                if self._synced >= ticket:
                    return
                if self._failure is not None:
                    raise StorageIOError(self._failure)
                sync = self._sync
                if sync is None:  # lead: sync for every ticket issued so far
                    sync = self._sync = _Sync(self._issued, threading.Event())
                    fd, lead = self._fd, True
                else:
                    lead = False
            if lead:
                self._run(sync, fd)
            else:
                sync.done.wait()

    def _run(self, sync: _Sync, fd: int) -> None:
        error = None
        try:
            os.fdatasync(fd)
        except OSError as exc:
            error = exc
        with self._lock:
            self._sync = None
            if error is None:
                self._synced = max(self._synced, sync.target)
                self.syncs += 1
            else:
                self._failure = f"topic log fsync failed: {error}; restart the broker"
        sync.done.set()

    def close(self) -> None:
        with self._idle():
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
