"""Dispatchers: threads that follow the CommitLog and build derived views from it.

A ``Dispatcher`` owns one named thread and a list of ``DispatchHandler``s.  Each handler
keeps its own durable position (every record before it is reflected in its view); the
thread reads from the smallest position and hands each handler the records at or past its
own.  Handlers must be idempotent per record (ConsumeQueue writes by queue offset, index
puts by key), so replaying after a crash duplicates nothing.  After a torn tail the store
``rewind``s every handler that got past the recovered end before anything new is appended.

Records are handed over in memory as the writer appends them; a dispatcher that lags (or
replays) reads the file instead, where every record is CRC-checked and a damaged one is
reported and skipped (``CommitLog.decode_records``), so it never stops the records after it.

Memory: the in-memory hand-off holds at most ``RECENT_RECORDS`` records; past that the
oldest batches are dropped and the dispatcher reads them from the file.

Thread-safety: handlers are called only from the dispatcher's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from store.clock import Clock
from store.commitlog import CommitLog
from store.message import DispatchInfo

log = logging.getLogger(__name__)

_READ_BYTES = 8 << 20
RECENT_RECORDS = 1 << 15  # records handed over in memory, at most (~8 MB); was 256
#                          batches, up to 256,000 records when Sends carry 1,000 each


class LogReader(Protocol):
    """Anything that follows the CommitLog with a durable position of its own."""

    name: str

    def position(self) -> int:
        """CommitLog offset up to which this reader's view is complete."""
        ...

    def rewind(self, offset: int) -> None:
        """Move this view's durable position back to offset if it is past it, and persist
        that before returning (recovery after a torn tail)."""
        ...


class DispatchHandler(LogReader, Protocol):
    """A view a ``Dispatcher`` builds from the CommitLog (``rewind``: see ``LogReader``)."""

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        """Apply ``records`` (all at or past ``position()``); afterwards the position may
        be ``end_offset`` once the view is made durable (see ``flush``)."""
        ...

    def flush(self) -> None:
        """Make the view durable and persist the position."""
        ...


class Dispatcher:
    """Follows the CommitLog on a named thread and feeds its handlers."""

    def __init__(
        self,
        name: str,
        commitlog: CommitLog,
        handlers: list[DispatchHandler],
        clock: Clock,
        flush_interval_ms: int = 1000,
    ) -> None:
        self.name = name
        self._log = commitlog
        self._handlers = handlers
        self._clock = clock
        self._flush_interval_ms = flush_interval_ms
        self._pos = min((h.position() for h in handlers), default=0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[list[DispatchInfo]], None]] = []
        self._done_cond = threading.Condition()
        # Batches the writer just appended, handed over in memory so the steady state
        # needs no re-read or decode; bounded (RECENT_RECORDS): a lagging dispatcher
        # falls back to the file.
        self._recent: deque[list[DispatchInfo]] = deque()
        self._recent_records = 0
        self._recent_lock = threading.Lock()

    @property
    def dispatched_offset(self) -> int:
        return self._pos

    def add_listener(self, callback: Callable[[list[DispatchInfo]], None]) -> None:
        """``callback(records)`` runs on the dispatcher thread after each dispatched batch."""
        self._listeners.append(callback)

    def offer(self, records: list[DispatchInfo]) -> None:
        """Hand over records just appended to the CommitLog (any thread, in log order)."""
        if records:
            with self._recent_lock:
                self._recent.append(records)
                self._recent_records += len(records)
                while self._recent_records > RECENT_RECORDS:
                    self._recent_records -= len(self._recent.popleft())

    def catch_up(self) -> int:
        """Dispatch everything already in the CommitLog on the caller's thread (recovery)."""
        while self._step():
            pass
        self._flush()
        return self._pos

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.catch_up()

    def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Block until everything before ``offset`` is dispatched (for tests and tools)."""
        deadline = self._clock.monotonic_ms() + timeout_s * 1000
        with self._done_cond:
            while self._pos < offset:
                left = deadline - self._clock.monotonic_ms()
                if left <= 0:
                    return False
                self._done_cond.wait(min(left / 1000, 0.05))
        return True

    def _run(self) -> None:
        last_flush = self._clock.monotonic_ms()
        while not self._stop.is_set():
            try:
                if not self._step():
                    self._log.wait_beyond(self._pos, 0.1)
                now = self._clock.monotonic_ms()
                if now - last_flush >= self._flush_interval_ms:
                    self._flush()
                    last_flush = now
            except Exception:
                log.exception("dispatcher %s failed; retrying in 1 s", self.name)
                self._stop.wait(1.0)

    def _step(self) -> bool:
        """Dispatch one chunk; False when there was nothing new."""
        records = self._take_recent()
        if records:
            last = records[-1]
            self._apply(records, self._pos, last.commit_offset + last.record_size)
            return True
        return self._step_from_file()

    def _take_recent(self) -> list[DispatchInfo]:
        """The offered batch that starts at the position ([] if none does)."""
        with self._recent_lock:
            recent = self._recent
            while recent and recent[0][0].commit_offset < self._pos:
                self._recent_records -= len(recent.popleft())
            if recent and recent[0][0].commit_offset == self._pos:
                self._recent_records -= len(recent[0])
                return recent.popleft()
            return []

    def _step_from_file(self) -> bool:
        offset, data = self._log.read_from(self._pos, _READ_BYTES)
        if not data:
            if offset != self._pos:  # moved to the next segment
                self._pos = offset
                return True
            return False
        chunk = self._log.decode_records(offset, data, f"dispatcher {self.name}")
        if chunk.used == 0:
            return False
        self._apply(chunk.records, chunk.offset, chunk.offset + chunk.used)
        return True

    def _apply(self, records: list[DispatchInfo], offset: int, end: int) -> None:
        for h in self._handlers:
            pos = h.position()
            mine = records if pos <= offset else [r for r in records if r.commit_offset >= pos]
            if mine or pos < end:
                h.dispatch(mine, end)
        with self._done_cond:
            self._pos = end
            self._done_cond.notify_all()
        for callback in self._listeners:
            callback(records)

    def _flush(self) -> None:
        for h in self._handlers:
            h.flush()
