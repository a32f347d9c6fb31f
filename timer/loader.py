"""WheelLoader: which timer entries are in the timing wheel, and how the others get there.

Memory holds only the near future: ``load_due`` moves the TimerStore's entries due
within ``timer.wheel_window_ms`` into the wheel, at most ``timer.load_batch`` a call,
behind a cursor: every entry whose key sorts before it is in the wheel (or due now).  It
scans RocksDB without the lock, so an entry stored meanwhile (a Send, a Reschedule, a
preload) in the span it is scanning is handed to it (``stored``): its scan may not see
the write.  An entry stored before the cursor goes into the wheel at once, unless it is
delivering (``timer.service``); one past the span waits for a later load.

Shares the timer service's lock, wheel, list of entries already due, set of delivering
entries and wake-up event (``timer.service``); ``stored`` is called with the lock held,
``admit`` and ``load_due`` take it.
"""

from __future__ import annotations

import itertools
import threading

from timer.model import TimerConfig
from timer.store import TimerStore, parse_timer_key, timer_key
from timer.wheel import TimingWheel


class WheelLoader:
    """The wheel's load cursor and the entries stored during a scan; see the module
    docstring."""

    def __init__(self, timers: TimerStore, config: TimerConfig, lock: threading.Lock,
                 wheel: TimingWheel[bytes], due_now: list[tuple[bytes, int]],
                 delivering: set[bytes], wake: threading.Event) -> None:
        self._timers = timers
        self._config = config
        self._lock = lock
        self._wheel = wheel
        self._due_now = due_now
        self._delivering = delivering
        self._wake = wake
        # Every timer entry whose key sorts before the cursor is in the wheel (or due now).
        self._load_cursor = timer_key(0, 0)
        # While ``load_due`` scans up to ``_loading_to``, the entries stored in its span
        # meanwhile (its scan may have begun before their write): it adds them itself.
        self._loading_to = self._load_cursor
        self._stored_meanwhile: list[tuple[bytes, int]] = []

    def admit(self, keyed: list[tuple[bytes, int]]) -> None:
        """Put newly stored entries that fall inside the loaded window into the wheel."""
        with self._lock:
            admitted = sum(self.stored(key, due) for key, due in keyed)
        if admitted:
            self._wake.set()

    def stored(self, key: bytes, due: int) -> bool:
        """A timer entry just written to RocksDB (the lock held): into the wheel if the
        loader has passed its key; to the loader if it is scanning over the key now (its
        scan may not see the write); else a later load reads it.  True if in the wheel."""
        if key < self._load_cursor:
            if key in self._delivering:
                return False
            if not self._wheel.add(key, due):
                self._due_now.append((key, due))
            return True
        if key < self._loading_to:
            self._stored_meanwhile.append((key, due))
        return False

    def load_due(self, now_ms: int) -> bool:
        """Move entries due before ``now + wheel_window`` from RocksDB into the wheel, at
        most ``load_batch`` per call; True when everything up to there is loaded."""
        target = timer_key(now_ms + self._config.wheel_window_ms, 0)
        with self._lock:
            start = self._load_cursor
            if target <= start:
                return True
            self._loading_to = target
        found = list(itertools.islice(self._timers.keys_between(start, target),
                                      self._config.load_batch))
        complete = len(found) < self._config.load_batch
        with self._lock:
            # past the last key read (b"\0" makes the next possible key), or the target
            self._load_cursor = target if complete else found[-1] + b"\0"
            self._loading_to = self._load_cursor
            meanwhile, self._stored_meanwhile = self._stored_meanwhile, []
            for key in found:  # all before the cursor now: into the wheel
                self.stored(key, parse_timer_key(key)[0])
            for key, due in meanwhile:  # those past a partial scan's end: the next one's
                self.stored(key, due)
        if self._due_now:
            self._wake.set()
        return complete
