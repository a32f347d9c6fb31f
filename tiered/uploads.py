"""Uploads to the tier that an owner starts together and waits for as one.

``Upload`` is one object write on the uploader pool; ``await_uploads`` bounds the wait
for a set of them by one time-out, so a tier that stalls costs one time-out per commit
however many objects it holds.  ``Mirror`` keeps copies of local metadata in the tier
(for a broker that mounts it read-only), the latest content per path, with at most one
write per path in flight so that a late write never lands over a newer one.

Time here is real time (``time.monotonic``): it bounds real I/O, not the broker's clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from tiered.errors import TierError
from tiered.provider import Provider

log = logging.getLogger(__name__)

CARRY_MAX_BYTES = 256 << 10  # a copy larger than this is not carried (bounds the lease)


class Upload:
    """One object on its way to the tier: ``start`` puts it on the uploader pool (or
    writes it at once without a pool), ``await_uploads`` bounds the wait, ``outcome``
    tells what happened.  Thread-safe."""

    __slots__ = ("data", "future", "path", "started_s")

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data = path, data
        self.future: Future[None] | None = None  # None: not started
        self.started_s = 0.0  # time.monotonic() when its write began (0: not yet)

    def start(self, provider: Provider, uploader: ThreadPoolExecutor | None) -> None:
        if uploader is not None:
            self.future = uploader.submit(self._write, provider)
            return
        self.future = Future()
        self.future.set_running_or_notify_cancel()
        try:
            self._write(provider)
        except TierError as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(None)

    def _write(self, provider: Provider) -> None:
        self.started_s = time.monotonic()
        provider.write(self.path, self.data)

    @property
    def failed(self) -> bool:
        """It ended with an error (so far)."""
        f = self.future
        return f is not None and f.done() and not f.cancelled() and f.exception() is not None

    def outcome(self) -> bool | None:
        """True: durable.  False: it failed, or is still running and may land late.
        None: it never started (not started, or cancelled before it got a thread), so
        nothing was written."""
        f = self.future
        if f is None or f.cancelled():
            return None
        if not f.done():
            return False
        return f.exception() is None

    def error(self) -> str:
        f = self.future
        if f is None or f.cancelled():
            return "not started"
        if not f.done():
            return "timed out"
        return str(f.exception() or "")


def await_uploads(uploads: Iterable[Upload], timeout_s: float) -> None:
    """Wait for ``uploads``, started together, as one: each may run ``timeout_s`` from
    when it got a thread; one still waiting for a thread ``timeout_s`` from now is
    cancelled.  So a tier that stalls costs one time-out, however many uploads there
    are.  (Real time: this bounds real I/O, not the broker's clock.)"""
    futures = {u.future: u for u in uploads if u.future is not None}
    if not futures:
        return
    _, waiting = wait(futures, timeout_s)
    running = [futures[f] for f in waiting if not f.cancel()]
    if running:
        now = time.monotonic()
        until = max(u.started_s or now for u in running) + timeout_s
        wait([u.future for u in running if u.future], max(0.0, until - now))


class Mirror:
    """Copies of local metadata in the tier.  ``put`` from any thread; ``sync`` from one
    owner thread.  A copy that fails is written again by a later ``sync``.

    A copy put with ``after`` (a CommitLog offset) is written only once a reader of the
    tier sees everything else below that offset (``sync``'s ``position``, and every
    other copy in): the journal's streams', whose records name what other queues hold
    (a delivery's copy, ``cluster.delivered``; a revived lease's retry copy), so the
    tier never holds the record of a delivery without the delivered message, nor a
    lease marked revived without its copy.

    Carried (``carry``, with ``tier.durable_ack``): the copies under a prefix (the
    queues' metadata) go in the commit record first (``due``: what a record carries now;
    ``tiered.carried``); a copy is written only once a record that carried it is in the
    tier (``confirmed``), so no copy names what no record confirmed, and the record
    keeps carrying a path until its copy is in.  A copy larger than ``CARRY_MAX_BYTES``
    is written first and waited for, as before records (a queue's metadata grows with
    its objects: the lease stays bounded)."""

    def __init__(self, provider: Provider, uploader: ThreadPoolExecutor | None) -> None:
        self._provider, self._uploader = provider, uploader
        self._lock = threading.Lock()
        self._due: dict[str, bytes] = {}  # path -> latest content not yet in the tier
        self._writing: dict[str, Upload] = {}  # path -> its write in flight (owner)
        self._floors: dict[str, tuple[int, float]] = {}  # path -> see ``put``
        self._after: dict[str, int] = {}  # path -> see ``put``
        self._ready: dict[str, bytes] = {}  # path -> its last content a reader may see
        #                                     (``due``; not known to be in the tier)
        self._prefix = ""  # the carried paths' (``carry``; "": none)
        self._confirmed: dict[str, bytes] = {}  # path -> what a record carried, to copy

    def put(self, path: str, data: bytes, floor: tuple[int, float] | None = None,
            after: int | None = None) -> None:
        """``floor``: (a CommitLog offset below which a reader of the tier, a mount, sees
        everything this copy covers even while it is not in the tier yet: the tier's
        checkpoint when the copy was made; when the oldest record that waits for the copy
        arrived, monotonic ms).  ``after``: see the class docstring."""
        with self._lock:
            self._due[path] = data
            if floor is not None:
                old = self._floors.get(path, floor)
                self._floors[path] = (min(floor[0], old[0]), min(floor[1], old[1]))
            if after is not None:
                self._after[path] = max(after, self._after.get(path, after))

    def due(self, position: int) -> dict[str, bytes]:
        """The carried copies not known to be in the tier, each as a reader may see it
        now: what a commit record carries instead (``tiered.carried``).  A copy put with
        ``after`` beyond ``position`` (what the owner has in the tier), or too large to
        carry, is not given: its path gives the last content that was (``_ready``), so
        the record never drops what an earlier one carried, or a position published
        counted on, before a copy of it is in."""
        with self._lock:
            self._mark_ready(position)
            return {path: self._ready[path] for path in self._due if path in self._ready}

    def _mark_ready(self, position: int) -> None:
        """Note each carried path's content a reader may see now (the caller holds the
        lock)."""
        for path, data in self._due.items():
            if self._carriable(path, data) and self._after.get(path, 0) <= position:
                self._ready[path] = data

    def carry(self, prefix: str, held: dict[str, bytes]) -> None:
        """From now on the copies under ``prefix`` are carried (see the class docstring).
        ``held``: what this broker's record carried when it started: carried on, and
        copied, until a newer copy is due."""
        with self._lock:
            self._prefix = prefix
            for path, data in held.items():
                self._ready.setdefault(path, data)
                self._due.setdefault(path, data)
                self._confirmed.setdefault(path, data)

    def confirmed(self, carried: dict[str, bytes]) -> None:
        """A commit record carrying ``carried`` (from ``due``) is in the tier."""
        with self._lock:
            for path, data in carried.items():
                if path in self._due:
                    self._confirmed[path] = data

    def unready_floor(self, position: int) -> tuple[int, float] | None:
        """``floor`` over the copies a record will not carry as they are now (None:
        none).  What it counts as carried is noted (``_ready``): a position published
        from it is confirmed by a record carrying at least that, whatever is put
        meanwhile."""
        with self._lock:
            self._mark_ready(position)
            floors = [f for path, f in self._floors.items()
                      if self._ready.get(path) is not self._due.get(path)]
        if not floors:
            return None
        return min(f[0] for f in floors), min(f[1] for f in floors)

    def copying(self) -> bool:
        """Whether a copy is due that a record does not carry (one too large, or any
        without ``carry``): the owner waits for such writes, as it did before records."""
        with self._lock:
            return any(self._copied(path, data) for path, data in self._due.items())

    def floor(self) -> tuple[int, float] | None:
        """The lowest offset and the oldest arrival among the copies not in the tier yet
        (None: all are in)."""
        with self._lock:
            if not self._floors:
                return None
            return (min(f[0] for f in self._floors.values()),
                    min(f[1] for f in self._floors.values()))

    def sync(self, deadline_s: float, position: Callable[[], int] | None = None) -> int:
        """Start a write of each due copy whose path has none in flight and wait for the
        writes until ``deadline_s`` (time.monotonic); those still running are looked at
        by the next call.  Then the same for the copies put with ``after`` that a reader
        may see now: ``position()`` (what the owner has in the tier) and every other
        copy reach their offset (without ``position`` they wait).  Returns the writes
        found failed."""
        with self._lock:
            todo = [(p, d) for p, d in self._due.items()
                    if p not in self._writing and p not in self._after and self._copied(p, d)]
            todo += [(p, d) for p, d in self._confirmed.items() if p not in self._writing]
        failed = self._write(todo, deadline_s)
        if position is None:
            return failed
        with self._lock:
            held = [(p, d, self._after[p]) for p, d in self._due.items()
                    if p in self._after and p not in self._writing and self._copied(p, d)]
            others = [f[0] for p, f in self._floors.items() if p not in self._after]
        seen = min([position(), *others])
        ready = [(p, d) for p, d, after in held if after <= seen]
        return failed + (self._write(ready, deadline_s) if ready else 0)

    def _write(self, todo: list[tuple[str, bytes]], deadline_s: float) -> int:
        for path, data in todo:
            up = self._writing[path] = Upload(path, data)
            up.start(self._provider, self._uploader)
        running = [u.future for u in self._writing.values() if u.future is not None]
        if running:
            wait(running, max(0.0, deadline_s - time.monotonic()))
        failed = 0
        for path, up in list(self._writing.items()):
            if up.future is not None and not up.future.done():
                continue
            del self._writing[path]
            if not up.outcome():
                failed += 1
                log.warning("copy of %s to the tier failed (%s); will retry", path, up.error())
                continue
            with self._lock:
                for known in (self._confirmed, self._ready):
                    if known.get(path) is up.data:
                        del known[path]
                if self._due.get(path) is up.data:  # else changed meanwhile: still due
                    del self._due[path]
                    self._floors.pop(path, None)
                    self._after.pop(path, None)
                    self._ready.pop(path, None)
        return failed

    def _carriable(self, path: str, data: bytes) -> bool:
        return bool(self._prefix) and path.startswith(self._prefix) \
            and len(data) <= CARRY_MAX_BYTES

    def _copied(self, path: str, data: bytes) -> bool:
        """A copy written without a record first (and waited for: ``copying``)."""
        return not self._carriable(path, data)
