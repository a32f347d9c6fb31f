"""LeaseBook: every consumer group's position and open leases, and their durability.

Per (group, leased topic, queue) a ``QueueLeases``: the ack offset, the pop offset and
the open PopCheckpoints, mirrored in the POP RocksDB (``pop.checkpoint``) and written
through a ``GroupCommit``: a caller that answers a client waits for its ticket, so an
OK is durable and one WAL fsync covers everyone waiting then.  It checks receipt
handles against the leases (a taken-over broker's too: ``adopt``), remembers why an
entry is done, and keeps the groups' figures.  Deadlines' timing is ``pop.schedule``'s
and redelivery ``pop.requeue``'s (docs/DESIGN.md, "Pop, Ack and redelivery").

Thread-safe: a lock per (group, user topic) (``lock``; its retry topic shares it)
orders that group's leases; methods that take a handle or a queue and say "caller
holds the lock" need it held.  An internal lock guards the shared dicts (the counters,
``pop.leasecounts``, have their own).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Container, Iterator
from typing import Literal, NamedTuple

from pop.checkpoint import (
    HELD,
    STATE_PREFIX,
    PopCheckpoint,
    checkpoint_key,
    decode_offset,
    encode_checkpoint,
    encode_offset,
    offset_key,
    parse_key,
    pop_offset_key,
)
from pop.flowcontrol import HeldEntry
from pop.handle import ReceiptHandle
from pop.leasecounts import LeaseCounts
from pop.leasejournal import LeaseJournal
from pop.model import (
    AlreadyDone,
    AlreadyRequeued,
    Deadline,
    GroupStats,
    HandleSuperseded,
    PopStats,
    QueueLeases,
    ReceiptHandleExpired,
    Requeue,
    by_origin,
    leases_from_keys,
    origin_of,
    retry_topic,
)
from pop.receipts import Receipts
from pop.source import QueueBounds, QueueSource
from store.clock import Clock
from store.errors import ChronomqError, InvalidArgument
from store.kv import KV, GroupCommit
from store.store import MessageStore

log = logging.getLogger(__name__)

Ops = dict[bytes, bytes | None]  # key -> value, None: delete


class Recorded(NamedTuple):
    """A new lease in the book: its writes, and its deadline (None: nothing to lease,
    the tag filter skipped every entry)."""

    puts: list[tuple[bytes, bytes]]
    deadline: Deadline | None


class Acked(NamedTuple):
    """The outcome of an ack of several handles."""

    errors: list[ChronomqError | None]  # one per handle (None: acknowledged or no handle)
    ticket: int  # wait for it before answering OK (0: nothing written)
    retired: list[Deadline]  # deadlines of the leases it closed


class LeaseBook:
    """Positions, leases and their persistence (see the module docstring).  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, secret: bytes, clock: Clock,
                 source: QueueSource) -> None:
        self._store = store
        self._kv = kv
        self._commit = GroupCommit(kv)  # leases, acks and deadlines: durable before OK
        # the same writes in the journal (``attach`` one), its snapshots and the fence
        self.journal = LeaseJournal(kv, self._commit)
        # called with (group, [(leased topic, queue id, queue offset)]) for entries done
        self.on_done: Callable[[str, list[tuple[str, int, int]]], None] | None = None
        self.receipts = Receipts(secret, clock)  # handles issued and read, done entries
        self._clock = clock
        self._source = source
        self._lock = threading.Lock()  # guards the dicts below
        self._group_locks: dict[tuple[str, str], threading.Lock] = {}
        self._leases: dict[tuple[str, str, int], QueueLeases] = {}
        self._next_queue: dict[tuple[str, str], int] = {}
        self.counts = LeaseCounts()  # popped, acked, revived, released, dead-lettered
        self._load()

    # ---------------------------------------------------------------- state and locks

    def _load(self) -> None:
        """Load every position and open lease from the POP RocksDB."""
        self._leases, queues = leases_from_keys(
            kv for kind in (b"o", b"p", b"c") for kv in self._kv.scan(kind))
        for group, topic, _ in queues:
            self.lock(group, origin_of(topic))  # known to statistics

    def adopt(self, items: dict[bytes, bytes], state: list[tuple[bytes, bytes]] | None = None
              ) -> tuple[list[Deadline], set[str]]:
        """Take a departed broker's positions and open leases (its POP RocksDB keys,
        rebuilt from its journal: ``cluster.takeover``), except for queues this book
        already knows (their state here is newer); written and synced (journaled) before
        it returns, with ``state`` (``STATE_PREFIX`` keys: the lease clocks of
        ``pop.leaseclock``) in the same write.  Returns the deadlines of the adopted
        leases and the groups."""
        mine = {parse_key(k)[:3] for p in (b"o", b"p", b"c") for k, _ in self._kv.scan(p)}
        with self._lock:
            mine |= set(self._leases)
        taken = [(k, v) for k, v in items.items() if k[:1] in (b"o", b"p", b"c")
                 and parse_key(k)[:3] not in mine]
        if not taken:
            return [], set()
        assert all(k.startswith(STATE_PREFIX) for k, _ in state or [])
        self.wait(self.write(taken + (state or [])))
        adopted, queues = leases_from_keys(taken)
        deadlines: list[Deadline] = []
        for (group, topic, qid), leases in adopted.items():
            with self.lock(group, origin_of(topic)), self._lock:
                have = self._leases.setdefault((group, topic, qid), leases)
                if have is not leases:  # a Pop met the queue meanwhile (from its keys)
                    have.checkpoints.update(leases.checkpoints)
                    have.pop_offset = max(have.pop_offset, leases.pop_offset)
            deadlines += [(group, topic, qid, ck.ck_start, e)
                          for ck in leases.checkpoints.values() for e in ck.deadlines()]
        for group, topic, _ in queues:
            self.lock(group, origin_of(topic))
        return deadlines, {group for group, _, _ in queues}

    def leased_to(self, group: str, topic: str, qid: int) -> int:
        """The first queue offset ``group`` never leased in ``topic``/``qid``, as this
        book holds it (0: it holds none)."""
        with self._lock:
            leases = self._leases.get((group, topic, qid))
        if leases is not None:
            return leases.pop_offset
        raw = [self._kv.get(k) for k in (offset_key(group, topic, qid),
                                          pop_offset_key(group, topic, qid))]
        return max((decode_offset(r) for r in raw if r), default=0)

    def oldest_open_ms(self, group: str, topics: Container[str]) -> int | None:
        """When ``group`` took its oldest open lease in ``topics`` (None: none open)."""
        with self._lock:
            return min((ck.pop_at_ms for (g, t, _), leases in self._leases.items()
                        if g == group and t in topics for ck in leases.checkpoints.values()
                        if not ck.all_acked()), default=None)

    def deadlines(self) -> list[Deadline]:
        """The deadlines of every open lease (to schedule at start: a lease whose
        deadline passed while the broker was down revives at once)."""
        with self._lock:
            return [(group, topic, qid, ck.ck_start, e)
                    for (group, topic, qid), leases in self._leases.items()
                    for ck in leases.checkpoints.values() for e in ck.deadlines()]

    def lock(self, group: str, topic: str) -> threading.Lock:
        """The lock of (group, user topic): its leases change, and are persisted, in
        order, while other groups and topics proceed in parallel."""
        key = (group, topic)
        lock = self._group_locks.get(key)
        if lock is None:
            with self._lock:
                lock = self._group_locks.setdefault(key, threading.Lock())
        return lock

    def _queue(self, group: str, topic: str, qid: int) -> QueueLeases:
        """The queue's lease state; the caller holds the lock."""
        key = (group, topic, qid)
        leases = self._leases.get(key)
        if leases is None:
            raw = self._kv.get(offset_key(group, topic, qid))
            ack = decode_offset(raw) if raw else self._source.bounds(topic, qid).low
            raw = self._kv.get(pop_offset_key(group, topic, qid))
            leases = QueueLeases(ack_offset=ack,
                                  pop_offset=max(ack, decode_offset(raw) if raw else 0))
            with self._lock:
                self._leases[key] = leases
        return leases

    # ---------------------------------------------------------------- durability

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes] | None = None
              ) -> int:
        """Apply writes without a sync; the ticket to ``wait`` for (0: nothing written).
        With a journal, the same writes go to it in the same order."""
        return self.journal.write(puts, deletes or [])

    def kv_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._kv.scan(prefix)

    def wait(self, ticket: int) -> None:
        """Return once the write of ``ticket`` is durable (with durable-ack: in the tier
        too), then the fencing check."""
        self.journal.wait(ticket)

    def _write_ops(self, ops: Ops) -> int:
        return self.write([(k, v) for k, v in ops.items() if v is not None],
                          [k for k, v in ops.items() if v is None])

    # ---------------------------------------------------------------- receipt handles

    def lease_of(self, group: str, h: ReceiptHandle) -> tuple[PopCheckpoint | None, int]:
        """The checkpoint holding ``h`` (None once it is done) and the entry's index;
        raises for a handle that does not match or was superseded, or whose open entry
        is past its deadline now (the revive takes it; an ack of it must not be OK).
        Caller holds the lock."""
        ck = self._queue(group, h.topic, h.queue_id).checkpoints.get(h.ck_start)
        entry = (group, h.topic, h.queue_id, h.queue_offset)
        if self.receipts.was_requeued(entry):
            raise AlreadyRequeued("the message was already released for redelivery (Nack, "
                                  "revive or ChangeInvisibleTime 0): this handle is done")
        if ck is None:  # every entry of its lease is done: acked, or given back
            if self.receipts.was_acked(entry):
                return None, -1  # acked here: an ack again is answered as the first
            raise AlreadyDone("this lease is no longer open here: acknowledged, or given "
                              "back for redelivery (then the message comes again)")
        i = h.queue_offset - ck.ck_start
        if not 0 <= i < ck.count:
            raise InvalidArgument("receipt handle does not match its lease")
        expire = ck.expire_of(i)
        if expire != h.expire_at_ms and not (h.renewable and h.expire_at_ms < expire):
            raise HandleSuperseded("receipt handle was replaced by ChangeInvisibleTime: "
                                   "use the handle it returned")
        if ck.is_acked(i):
            return None, i
        if self._clock.now_ms() >= expire:  # checked before its deadline, reached after
            # it (it waited for the lock): the revive has the entry, maybe copying it
            raise ReceiptHandleExpired(
                f"receipt handle expired at {expire} while the request waited: the "
                "lease ran out and the message may have been redelivered")
        return ck, i

    # ---------------------------------------------------------------- Pop

    def next_queue(self, group: str, topic: str) -> int:
        """Where this Pop starts in ``topic``'s queues (round robin).  Caller holds the
        lock."""
        first = self._next_queue.get((group, topic), 0)
        self._next_queue[(group, topic)] = first + 1
        return first

    def pop_offset(self, group: str, topic: str, qid: int, bounds: QueueBounds) -> int:
        """The first queue offset the group has never leased, moved into ``bounds``.
        Caller holds the lock."""
        leases = self._queue(group, topic, qid)
        if leases.pop_offset < bounds.low:  # retention removed what the group had not
            leases.pop_offset = leases.ack_offset = bounds.low  # reached
        elif leases.pop_offset > bounds.high:  # the queue's tail was lost (flush =
            # "async" and an OS crash): new messages take those queue offsets again
            log.warning("%s/%d ends at %d, below group %s's pop offset %d: the tail was "
                        "lost; leasing from %d", topic, qid, bounds.high, group,
                        leases.pop_offset, bounds.high)
            leases.pop_offset = bounds.high
            leases.ack_offset = min(leases.ack_offset, bounds.high)
        return leases.pop_offset

    def record_lease(self, group: str, topic: str, qid: int, ck: PopCheckpoint) -> Recorded:
        """A Pop leased ``ck`` (entries it skipped already marked done): the pop offset
        moves past it.  Returns the writes for the caller to make durable before the
        messages leave the broker.  Caller holds the lock."""
        leases = self._queue(group, topic, qid)
        leases.pop_offset = ck.end
        puts = [(pop_offset_key(group, topic, qid), encode_offset(ck.end))]
        if ck.all_acked():  # the filter skipped everything: no lease, just move on
            if not leases.checkpoints:
                leases.ack_offset = leases.pop_offset
                puts.append((offset_key(group, topic, qid), encode_offset(leases.ack_offset)))
            return Recorded(puts, None)
        leases.checkpoints[ck.ck_start] = ck
        puts.append((checkpoint_key(group, topic, qid, ck.ck_start), encode_checkpoint(ck)))
        return Recorded(puts, (group, topic, qid, ck.ck_start, ck.expire_at_ms))

    # ---------------------------------------------------------------- settling

    def ack(self, group: str, handles: list[ReceiptHandle | None]) -> Acked:
        """Mark the handles' entries done, one write per user topic (not waited for).
        An entry acked before (an ack again, as a client retries one that failed) gets
        the latest write's ticket: its OK waits for the first ack's write to be as
        durable as that one's OK would have (and for the fencing check)."""
        errors: list[ChronomqError | None] = [None] * len(handles)
        retired: list[Deadline] = []
        ended: list[tuple[str, int, int]] = []
        ticket = 0
        again = False
        for origin, items in by_origin(handles).items():
            ops: Ops = {}
            acked = 0
            with self.lock(group, origin):
                for n, h in items:
                    try:
                        ck, i = self.lease_of(group, h)
                    except ChronomqError as exc:
                        errors[n] = exc
                        continue
                    if ck is None:
                        again = True
                    else:
                        ck.mark(i)
                        acked += 1
                        ended.append((h.topic, h.queue_id, h.queue_offset))
                        retired += self._finish(group, h.topic, h.queue_id, ck, ops)
                        self.receipts.remember_acked((group, h.topic, h.queue_id, h.queue_offset))
                ticket = self._write_ops(ops) or ticket
            self.counts.acked(acked)
        if again:
            ticket = max(ticket, self.journal.last_ticket)
        if ended and self.on_done is not None:
            self.on_done(group, ended)
        return Acked(errors, ticket, retired)

    def change_invisible_time(self, group: str, h: ReceiptHandle, expire_at_ms: int) -> int:
        """Move the deadline of ``h``'s entry to ``expire_at_ms``; the ticket of the
        write.  Raises ``AlreadyDone`` when the entry is done."""
        with self.lock(group, origin_of(h.topic)):
            ck, i = self.lease_of(group, h)
            if ck is None:
                raise AlreadyDone("the message was already acknowledged or released")
            if ck.count == 1 and i not in ck.overrides:
                ck.expire_at_ms = expire_at_ms
            else:
                ck.overrides[i] = expire_at_ms
            return self.write([(checkpoint_key(group, h.topic, h.queue_id, ck.ck_start),
                                encode_checkpoint(ck))])

    def entries_due(self, deadline: Deadline) -> list[int]:
        """Indexes of the entries still open whose deadline is ``deadline``'s."""
        group, topic, qid, start, expire = deadline
        with self.lock(group, origin_of(topic)):
            leases = self._leases.get((group, topic, qid))
            ck = leases.checkpoints.get(start) if leases else None
            return ck.open_at(expire) if ck is not None else []

    def entry_at(self, group: str, topic: str, qid: int, queue_offset: int
                 ) -> tuple[int, int] | None:
        """``(ck_start, index)`` of the open lease entry at ``queue_offset``, or None
        when it is done or not leased.  Caller holds the lock."""
        leases = self._leases.get((group, topic, qid))
        ck = next((c for c in (leases.checkpoints.values() if leases else ())
                   if c.ck_start <= queue_offset < c.end), None)
        if ck is None or ck.is_acked(queue_offset - ck.ck_start):
            return None
        return ck.ck_start, queue_offset - ck.ck_start

    def mark_requeued(self, reqs: list[Requeue], outcome: Literal["released", "revived"]
                      ) -> list[Deadline]:
        """Mark done entries whose copies are durable (dead-lettered when a request has
        a reason) and write their checkpoints, not synced: a lost mark only repeats a
        redelivery.  Returns the deadlines of the leases it closed.  Caller holds the
        lock."""
        ops: Ops = {}
        retired: list[Deadline] = []
        ended: dict[str, list[tuple[str, int, int]]] = {}
        for r in reqs:
            ck = self._queue(r.group, r.topic, r.queue_id).checkpoints.get(r.ck_start)
            if ck is None or ck.is_acked(r.index):
                continue
            ck.mark(r.index)
            ended.setdefault(r.group, []).append((r.topic, r.queue_id, r.ck_start + r.index))
            retired += self._finish(r.group, r.topic, r.queue_id, ck, ops)
            self.receipts.remember_requeued((r.group, r.topic, r.queue_id, r.ck_start + r.index))
            self.counts.requeued((r.group, origin_of(r.topic)), outcome, r.reason is not None)
        self._write_ops(ops)
        for group, entries in ended.items():
            if self.on_done is not None:
                self.on_done(group, entries)
        return retired

    # ---------------------------------------------------------------- held entries

    def held(self, group: str, topic: str) -> list[HeldEntry]:
        """The entries of ``group`` held for their key in ``topic``'s queues (read back
        after a restart or a takeover), in queue order.  Caller holds the lock."""
        out = []
        for (g, t, qid), leases in sorted(self._leases.items()):
            if g == group and t == topic:
                for start, ck in sorted(leases.checkpoints.items()):
                    out += [HeldEntry(t, qid, start, i) for i in ck.held()]
        return out

    def hand_out(self, group: str, entry: HeldEntry, expire_at_ms: int) -> Recorded | None:
        """Give a held entry the deadline ``expire_at_ms`` (a Pop hands it out); the
        checkpoint's write and the new deadline, or None when the entry is no longer
        held.  Caller holds the lock."""
        leases = self._leases.get((group, entry.ltopic, entry.queue_id))
        ck = leases.checkpoints.get(entry.ck_start) if leases else None
        if ck is None or ck.is_acked(entry.slot) or ck.overrides.get(entry.slot) != HELD:
            return None
        ck.overrides[entry.slot] = expire_at_ms
        return Recorded([(checkpoint_key(group, entry.ltopic, entry.queue_id, ck.ck_start),
                          encode_checkpoint(ck))],
                        (group, entry.ltopic, entry.queue_id, ck.ck_start, expire_at_ms))

    def _finish(self, group: str, topic: str, qid: int, ck: PopCheckpoint, ops: Ops
                ) -> list[Deadline]:
        """Persist a checkpoint after marks into ``ops``: rewrite it, or delete it and
        move the ack offset when all its entries are done; returns the deadlines of a
        deleted one.  Caller holds the lock."""
        key = checkpoint_key(group, topic, qid, ck.ck_start)
        if not ck.all_acked():
            ops[key] = encode_checkpoint(ck)
            return []
        leases = self._queue(group, topic, qid)
        if leases.checkpoints.pop(ck.ck_start, None) is None:
            return []
        ops[key] = None
        oldest = min(leases.checkpoints, default=leases.pop_offset)
        if oldest > leases.ack_offset:
            leases.ack_offset = oldest
            ops[offset_key(group, topic, qid)] = encode_offset(oldest)
        return [(group, topic, qid, ck.ck_start, e)
                for e in {ck.expire_at_ms, *ck.overrides.values()}]

    # ---------------------------------------------------------------- figures, topics

    def statistics(self) -> PopStats:
        with self._lock:
            open_cks = sum(len(q.checkpoints) for q in self._leases.values())
        popped, acked, revived, released, dead = self.counts.totals()
        return PopStats(open_checkpoints=open_cks, popped=popped, acked=acked, revived=revived,
                        released=released, dead_lettered=dead, durable_syncs=self._commit.syncs)

    def group_pairs(self) -> list[tuple[str, str]]:
        """Every (group, topic) that has leased since it was created, sorted."""
        with self._lock:
            return sorted(self._group_locks)

    def group_statistics(self, pairs: list[tuple[str, str]] | None = None) -> list[GroupStats]:
        """Per (group, topic) of ``pairs`` (default: ``group_pairs()``; a console page
        asks for its own slice only)."""
        if pairs is None:
            pairs = self.group_pairs()
        else:  # never a lock for a pair that has not leased
            with self._lock:
                pairs = [p for p in pairs if p in self._group_locks]
        out = []
        for group, topic in pairs:
            t = self._store.topics.get(topic) or self._store.topics.mounted(topic)
            if t is None:
                continue
            parts = [(topic, t.queue_count)]
            if self._store.topics.get(retry_topic(group, topic)) is not None:
                parts.append((retry_topic(group, topic), 1))
            in_flight = backlog = 0
            with self.lock(group, topic):
                for ltopic, queues in parts:
                    for qid in range(queues):
                        leases = self._queue(group, ltopic, qid)
                        b = self._source.bounds(ltopic, qid)
                        in_flight += sum(c.count - c.done for c in leases.checkpoints.values())
                        backlog += max(0, b.high - max(leases.pop_offset, b.low))
            redelivered, dead = self.counts.of((group, topic))
            # lag: what the group has not settled yet.  Not "end - ack offset": one message
            # held (a long lease) would count every settled message after it
            out.append(GroupStats(group, topic, in_flight, backlog, backlog + in_flight,
                                  redelivered, dead))
        return out

    def forget_topic(self, topic: str) -> None:
        """Drop every group's leases and positions of a deleted user topic and of its
        retry topics (memory and RocksDB)."""
        self.forget_topics({topic})

    def forget_topics(self, topics: set[str]) -> None:
        """``forget_topic`` of each of ``topics``, the book read once."""
        with self._lock:
            doomed_keys = [k for k in self._leases if origin_of(k[1]) in topics]
            for key in doomed_keys:
                del self._leases[key]
            for pair in [k for k in self._group_locks if k[1] in topics]:
                del self._group_locks[pair]
        doomed = [k for kind in (b"c", b"o", b"p") for k, _ in self._kv.scan(kind)
                  if origin_of(parse_key(k)[1]) in topics]
        if doomed:
            self.write([], doomed)  # journaled: a takeover must not bring them back

