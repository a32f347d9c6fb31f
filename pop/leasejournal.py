"""LeaseJournal: the lease book's writes, also in the broker's journal.

With ``tier.upload`` the lease book's state (positions, open PopCheckpoints) must reach
the tier so that another broker can take its consumers over (``chronomq.takeover``).
Every write of the book goes to its RocksDB (``store.kv.GroupCommit``) and, as the same
keys and values, to the journal (``tiered.journal``: a ``pop`` record), under the
journal's ``ordered`` lock, so the journal holds the writes of a key in the order the
RocksDB got them.  ``attach`` first writes a snapshot of the whole book (``pop-reset``,
then ``pop`` chunks), so that a write a crash kept out of the journal is in it again.

``wait`` returns once a write is durable: its RocksDB WAL synced, and with durable-ack
its journal record (or a later one: the tier's position is a prefix of the CommitLog) in
the tier; then the fencing check (``tiered.lease``).  Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from store.kv import KV, GroupCommit
from tiered.journal import POP, POP_RESET, SNAPSHOT_CHUNK, StateJournal, encode_ops

JOURNALED_MEMORY = 65_536  # journal records of writes not waited for yet (durable-ack)
_KINDS = (b"o", b"p", b"c")  # the book's keys (pop.checkpoint)


class LeaseJournal:
    """The lease book's writes: RocksDB and the journal (see the module docstring)."""

    def __init__(self, kv: KV, commit: GroupCommit) -> None:
        self._kv = kv
        self._commit = commit
        self._journal: StateJournal | None = None
        self._lock = threading.Lock()
        self._journaled: OrderedDict[int, Future[Any]] = OrderedDict()  # ticket -> record
        self.last_ticket = 0  # the latest write's (a Nack waits for it with durable-ack)

    def attach(self, journal: StateJournal) -> None:
        """Journal every write from now on, starting with a snapshot of the book (none
        for a new broker: nothing to say yet)."""
        self._journal = journal
        if not journal.enabled or (journal.empty() and not any(
                True for p in _KINDS for _ in self._kv.scan(p))):
            return
        with journal.ordered:
            chunk: list[tuple[bytes, bytes]] = []
            size, tag = 0, POP_RESET
            for prefix in _KINDS:
                for k, v in self._kv.scan(prefix):
                    chunk.append((k, v))
                    size += len(k) + len(v) + 7
                    if size >= SNAPSHOT_CHUNK:
                        journal.append(tag, encode_ops(chunk))
                        chunk, size, tag = [], 0, POP
            if chunk or tag == POP_RESET:  # not waited for: a crash repeats it at start
                journal.append(tag, encode_ops(chunk) or encode_ops([], [b"!"]))

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> int:
        """Apply writes without a sync; the ticket to ``wait`` for (0: nothing)."""
        if not puts and not deletes:
            return 0
        journal = self._journal
        if journal is None or not journal.enabled:
            return self._commit.write(puts, deletes)
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
        """Raise while this broker may answer no OK (``tiered.lease``)."""
        if self._journal is not None:
            self._journal.check()

    def may_change(self) -> bool:
        return self._journal is None or self._journal.may_change()
