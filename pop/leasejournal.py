"""LeaseJournal: the lease book's writes, also in the broker's journal.

With ``tier.upload`` the lease book's state (positions, open PopCheckpoints) must reach
the tier so that another broker can take its consumers over (``cluster.takeover``).
Every write of the book goes to its RocksDB (``store.kv.GroupCommit``) and, as the same
keys and values, to the journal (``store.journal``: a ``pop`` record), under the
journal's ``ordered`` lock, so the journal holds the writes of a key in the order the
RocksDB got them.  ``attach`` first writes a snapshot of the whole book (``pop-reset``,
then ``pop`` chunks), so that a write a crash kept out of the journal is in it again.

``Snapshots`` writes such a snapshot again after every ``tier.journal_snapshot_records``
records (or as many records as the last snapshot had entries, if more: a snapshot costs
at most what it saves), and every ``tier.journal_snapshot_s`` once that many came (at
least ``BY_TIME_RECORDS``): with durable-ack the stream is many small objects, one per
commit, and a takeover reads them one request each) and, once the tier holds it,
points ``<broker>/state/snapshot.json`` at its first record: a takeover replays the
state stream from there (``store.journal``), so its time follows the book's size, not
the broker's history.
The snapshot is written under the journal's ``ordered`` lock, so it is a consistent cut:
replaying it and every record after it gives the book (Pops and Acks wait meanwhile:
one RocksDB scan of the book).  The pointer only ever names a snapshot the tier holds
whole (a crash before it moves leaves the older one, still right).

``wait`` returns once a write is durable: its RocksDB WAL synced, and with durable-ack
its journal record (or a later one: the tier's position is a prefix of the CommitLog) in
the tier; then the fencing check (``cluster.lease``).  Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pop.checkpoint import STATE_PREFIX
from store.journal import (
    POP,
    POP_RESET,
    SNAPSHOT_CHUNK,
    SNAPSHOT_POINTER,
    StateJournal,
    encode_ops,
    snapshot_pointer,
)
from store.kv import KV, GroupCommit
from store.message import DispatchInfo

log = logging.getLogger(__name__)

BY_TIME_RECORDS = 250  # a snapshot by time needs at least this many records since
JOURNALED_MEMORY = 65_536  # journal records of writes not waited for yet (durable-ack)
# the book's keys (pop.checkpoint), and the recurring schedules kept beside them
# (``PopService.write_state``: they ride this journal, its snapshots and a takeover)
_KINDS = (b"o", b"p", b"c", STATE_PREFIX)


class LeaseJournal:
    """The lease book's writes: RocksDB and the journal (see the module docstring)."""

    def __init__(self, kv: KV, commit: GroupCommit) -> None:
        self._kv = kv
        self._commit = commit
        self._journal: StateJournal | None = None
        self._lock = threading.Lock()
        self._journaled: OrderedDict[int, Future[Any]] = OrderedDict()  # ticket -> record
        self.last_ticket = 0  # the latest write's (what a Nack, or an ack again, waits for)
        self.snapshot_entries = 0  # the book's entries in the latest snapshot

    def attach(self, journal: StateJournal) -> list[Future[Any]]:
        """Journal every write from now on, starting with a snapshot of the book (none
        for a new broker: nothing to say yet); returns the snapshot's (``snapshot``)."""
        self._journal = journal
        if not journal.enabled or (journal.empty() and not any(
                True for p in _KINDS for _ in self._kv.scan(p))):
            return []
        return self.snapshot()

    def snapshot(self) -> list[Future[Any]]:
        """Write a snapshot of the whole book into the journal (a ``pop-reset`` record,
        then ``pop`` chunks); returns the futures of its records (each to its
        ``DispatchInfo``; not waited for here: a crash repeats the snapshot at start)."""
        journal = self._journal
        if journal is None or not journal.enabled:
            return []
        futures: list[Future[Any] | None] = []
        entries = 0
        with journal.ordered:  # a consistent cut: no write of the book meanwhile
            chunk: list[tuple[bytes, bytes]] = []
            size, tag = 0, POP_RESET
            for prefix in _KINDS:
                for k, v in self._kv.scan(prefix):
                    entries += 1
                    chunk.append((k, v))
                    size += len(k) + len(v) + 7
                    if size >= SNAPSHOT_CHUNK:
                        futures.append(journal.append(tag, encode_ops(chunk)))
                        chunk, size, tag = [], 0, POP
            if chunk or tag == POP_RESET:
                futures.append(journal.append(tag, encode_ops(chunk)
                                              or encode_ops([], [b"!"])))
        self.snapshot_entries = entries
        return [f for f in futures if f is not None]

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> int:
        """Apply writes without a sync; the ticket to ``wait`` for (0: nothing)."""
        if not puts and not deletes:
            return 0
        journal = self._journal
        if journal is None or not journal.enabled:
            ticket = self._commit.write(puts, deletes)
            with self._lock:
                self.last_ticket = max(self.last_ticket, ticket)
            return ticket
        body = encode_ops(puts, deletes)
        with journal.ordered:
            ticket = self._commit.write(puts, deletes)
            future = journal.append(POP, body)
        with self._lock:
            self.last_ticket = max(self.last_ticket, ticket)
            if journal.durable_ack and future is not None:
                self._journaled[ticket] = future
                while len(self._journaled) > JOURNALED_MEMORY:  # never waited for: a
                    self._journaled.popitem(last=False)  # later record covers them
        return ticket

    def wait(self, ticket: int) -> None:
        """Return once the write of ``ticket`` is durable (see the module docstring)."""
        self._commit.wait(ticket)
        journal = self._journal
        if journal is not None and journal.durable_ack:
            # this write's record, or a later one; none left: a wait for a later record
            # has completed already
            with self._lock:
                future = next((f for t, f in self._journaled.items() if t >= ticket), None)
            journal.settle(future)
            with self._lock:
                while self._journaled and next(iter(self._journaled)) <= ticket:
                    self._journaled.popitem(last=False)  # covered now
        self.check()

    @property
    def durable_ack(self) -> bool:
        return self._journal is not None and self._journal.durable_ack

    def check(self) -> None:
        """Raise while this broker may answer no OK (``cluster.lease``)."""
        if self._journal is not None:
            self._journal.check()

    def may_change(self) -> bool:
        return self._journal is None or self._journal.may_change()


class Snapshots:
    """Snapshots of the lease book in the journal and the tier's pointer to the latest
    one the tier holds (see the module docstring).  ``step`` runs now and then (the
    server's scheduler, every second); one thread."""

    def __init__(self, log_: LeaseJournal, journal: StateJournal, every: int,
                 tier_position: Callable[[], int], publish: Callable[[str, bytes], None],
                 broker: str, every_s: float = 0.0,
                 monotonic_ms: Callable[[], float] | None = None) -> None:
        """``every_s``: a snapshot also this long after the last (by ``monotonic_ms``),
        once at least ``BY_TIME_RECORDS`` records and as many as it had entries came."""
        self._log = log_
        self.every_s = every_s
        self._monotonic_ms = monotonic_ms
        self._at_ms = monotonic_ms() if monotonic_ms is not None else 0.0
        self._journal = journal
        self.every = every
        self._position = tier_position
        self._publish = publish
        self._path = f"{broker}/{SNAPSHOT_POINTER}"
        self._pending: list[Future[Any]] = []  # a snapshot's records, being stored
        self._last = -1  # the state stream's queue offset of the latest snapshot stored
        self._end = 0  # ... and the CommitLog offset where its records end
        self.pointed = -1  # the queue offset the tier's pointer names

    def started(self, snapshot: list[Future[Any]]) -> None:
        """The snapshot written at start (``LeaseJournal.attach``), to point at."""
        self._pending = snapshot

    def step(self) -> None:
        if self._pending:
            if not all(f.done() for f in self._pending):
                return
            pending, self._pending = self._pending, []
            try:
                infos: list[DispatchInfo] = [i for f in pending for i in f.result()]
            except Exception:  # not stored: the next step writes another
                log.exception("a snapshot of the consumer groups' state was not stored")
                return
            self._last = infos[0].queue_offset
            self._end = max(i.commit_offset + i.record_size for i in infos)
        if self._last > self.pointed:
            if self._position() < self._end:
                return  # not in the tier whole yet
            self._publish(self._path, snapshot_pointer(self._last))
            self.pointed = self._last
            log.info("journal snapshot at state record %d is in the tier", self._last)
        since = self._journal.records() - max(self._last, 0)
        entries = self._log.snapshot_entries
        now = self._monotonic_ms() if self._monotonic_ms is not None else 0.0
        by_time = (self.every_s > 0 and since >= max(BY_TIME_RECORDS, entries)
                   and now - self._at_ms >= self.every_s * 1000)
        if (self.every and since >= max(self.every, entries)) or by_time:
            self._at_ms = now
            self._pending = self._log.snapshot()
