"""Pins: ids whose delivery waits while a debounce's replace decides about them.

A replace (``chronomq.debounce``) looks at the pending generations of an id and cancels
or replaces them; meanwhile none of them may start its delivery, or the replace could
judge a body pending that is already on its way.  ``TimerService.pinned`` pins the id:
an entry of it that comes due is held back here, not delivering, and goes back to the
due list when the last pin of the id ends (if still pending: a cancel meanwhile removes
it from RocksDB, and the delivery finds nothing).  One already on its way is not
stopped (``PendingMessages.topics`` says it is delivering).  In memory only: a restart
ends every pin, and the held entries are loaded again from RocksDB.

It shares the timer service's lock, its list of due entries, its set of delivering
entries and its wake-up event (``timer.service``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from store.message import Draft
from timer.store import parse_timer_key


class Pins:
    """Pinned ids and the due entries held back for them.  ``hold`` under the shared
    lock; ``pinned`` takes it."""

    def __init__(self, lock: threading.Lock, due_now: list[tuple[bytes, int]],
                 delivering: set[bytes], wake: threading.Event) -> None:
        self._lock = lock
        self._due_now = due_now
        self._delivering = delivering
        self._wake = wake
        self._pinned: dict[str, int] = {}  # id -> how many replaces pin it
        self._held: dict[str, list[tuple[bytes, int]]] = {}  # id -> its entries held

    def __bool__(self) -> bool:
        return bool(self._pinned)

    @contextlib.contextmanager
    def pinned(self, message_id: str) -> Iterator[None]:
        """While inside, no entry with this id starts its delivery (see the module doc)."""
        with self._lock:
            self._pinned[message_id] = self._pinned.get(message_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._pinned.pop(message_id) - 1
                if left:
                    self._pinned[message_id] = left
                else:
                    self._due_now.extend(self._held.pop(message_id, ()))
            self._wake.set()

    def hold(self, drafts: list[Draft], done: list[tuple[bytes, str]]
             ) -> tuple[list[Draft], list[tuple[bytes, str]], set[bytes]]:
        """Hold back the copies of pinned ids (the lock held): not delivering, they wait
        for their pin to end.  Returns the other drafts, their (key, id) and the keys
        held."""
        kept: list[Draft] = []
        kept_done: list[tuple[bytes, str]] = []
        held: set[bytes] = set()
        for draft, (key, mid) in zip(drafts, done, strict=True):
            if mid in self._pinned:
                self._delivering.discard(key)
                self._held.setdefault(mid, []).append((key, parse_timer_key(key)[0]))
                held.add(key)
            else:
                kept.append(draft)
                kept_done.append((key, mid))
        return kept, kept_done, held
