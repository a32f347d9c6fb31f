"""PopService: lease messages to a consumer group, acknowledge, release, revive them.

Every group sees every message of a topic; within a group a message is leased to one
consumer at a time.  Per (group, topic, queue) the service keeps:

- ``pop_offset``: the next queue offset to lease;
- the open PopCheckpoints (leases) by their start offset;
- ``ack_offset``: the first queue offset not yet done (persisted; only moves forward).

A Pop writes its PopCheckpoints and the queue's pop offset durably before any message
leaves the broker, and schedules each lease's deadline on a timing wheel (``timer.wheel``,
10 ms ticks).  An Ack marks a bit; a fully-done checkpoint is deleted and the ack offset
moves to the start of the oldest open one.  Leases, acks and new deadlines answer OK only
once durable: they are group-committed (``store.kv.GroupCommit``: one WAL fsync covers
the writes of every consumer waiting at that moment).

Redelivery goes through the CommitLog, never by rewinding an offset: when a deadline
passes with entries not done (revive), or a consumer releases a message (Nack), a copy of
the message (same id, ``delivery_attempt`` + 1) is appended to the group's retry topic
``%RETRY%<group>%<topic>`` (now, or through the timer after a back-off), and only once
that append is durable is the entry marked done.  A crash in between can deliver twice,
never zero times.  After ``max_attempts`` deliveries the copy goes to the dead-letter
topic ``%DLQ%<group>%<topic>`` instead.  Pop takes from the retry topic and the topic
itself in turn, so neither starves the other.

Thread-safe: a lock per (group, topic) orders that group's leases and their RocksDB writes
(its retry topic shares the lock); different groups and topics work in parallel.  One
named thread (``pop-revive``) fires deadlines; tests call ``revive_due`` with a manual
clock instead.
"""

from __future__ import annotations

import logging
import random
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from pop.checkpoint import (
    PopCheckpoint,
    checkpoint_key,
    decode_checkpoint,
    decode_offset,
    encode_checkpoint,
    encode_offset,
    offset_key,
    parse_key,
    pop_offset_key,
)
from pop.handle import HandleCodec, ReceiptHandle
from pop.policy import RetryPolicy
from pop.settle import PROP_LEASE, CopyKey, CopySettler, LeaseEntry, encode_lease
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import ChronomqError, FailedPrecondition, InvalidArgument
from store.kv import KV, GroupCommit
from store.message import (
    FLAG_DELAYED,
    FLAG_RETRY,
    Draft,
    Message,
    decode_record,
    encode_properties,
)
from store.queues import tag_hash
from store.store import MessageStore
from store.topics import MAX_NAME_BYTES, Topic
from tiered.errors import TierError
from timer.wheel import TimingWheel

log = logging.getLogger(__name__)

MAX_INVISIBLE_TIME_S = 12 * 3600
MAX_GROUP_BYTES = 120
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
REVIVE_TICK_MS = 10
REVIVE_BATCH = 512  # leases revived per CommitLog append
REQUEUED_MEMORY = 65_536
_GROUP = re.compile(r"^[A-Za-z0-9_-]+$")  # no "%" (system topic names), no "."

# properties a dead-lettered message carries
PROP_DLQ_REASON = "chronomq.dlq.reason"
PROP_DLQ_ATTEMPTS = "chronomq.dlq.attempts"
PROP_DLQ_GROUP = "chronomq.dlq.group"
PROP_ORIGIN_TOPIC = "chronomq.origin_topic"

_Deadline = tuple[str, str, int, int, int]  # group, leased topic, queue, ck_start, expire_at


def retry_topic(group: str, topic: str) -> str:
    return f"{RETRY_PREFIX}{group}%{topic}"


def dlq_topic(group: str, topic: str) -> str:
    return f"{DLQ_PREFIX}{group}%{topic}"


def origin_of(topic: str) -> str:
    """The user's topic a retry topic belongs to (group names hold no ``%``)."""
    if topic.startswith(RETRY_PREFIX):
        return topic[len(RETRY_PREFIX):].split("%", 1)[1]
    return topic


class TierReader(Protocol):
    """Where Pop finds a queue's messages once local retention deleted them (or the read
    strategy sends it there: ``tiered.reader``)."""

    def min_queue_offset(self, topic: str, queue_id: int) -> int | None:
        """The oldest queue offset the tier holds, or None."""
        ...

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        """The queue offset below which the queue is read from the tier."""
        ...

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> Sequence[tuple[int, int, int, bytes]]:
        """Up to ``count`` entries from ``queue_offset``: (queue offset, tag hash, store
        time, record)."""
        ...


class ReceiptHandleExpired(FailedPrecondition):
    """Raised when a receipt handle's lease ran out before the ack arrived."""


class HandleSuperseded(FailedPrecondition):
    """Raised for a handle replaced by ChangeInvisibleTime."""


class AlreadyDone(FailedPrecondition):
    """Raised when ChangeInvisibleTime names a message already acked or released."""


class AlreadyRequeued(FailedPrecondition):
    """Raised when a handle names a message recently put back for redelivery."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """``""``/``"*"`` accepts everything; ``"a || b"`` accepts tags a and b."""

    tags: frozenset[str] | None
    hashes: frozenset[int] = frozenset()

    @staticmethod
    def parse(expression: str) -> TagFilter:
        expr = expression.strip()
        if expr in ("", "*"):
            return TagFilter(None)
        tags = frozenset(t.strip() for t in expr.split("||"))
        if "" in tags or any(" " in t for t in tags):
            raise InvalidArgument(f"tag expression {expression!r} is not '*' or 'a || b'")
        return TagFilter(tags, frozenset(tag_hash(t) for t in tags))

    def accepts(self, tag: str) -> bool:
        return self.tags is None or tag in self.tags


@dataclass(slots=True)
class _QueueLeases:
    ack_offset: int
    pop_offset: int
    checkpoints: dict[int, PopCheckpoint] = field(default_factory=dict)


class PoppedMessage(NamedTuple):
    message: Message
    receipt_handle: str
    delivery_attempt: int


@dataclass(frozen=True, slots=True)
class PopStats:
    open_checkpoints: int
    popped: int
    acked: int
    revived: int
    released: int
    dead_lettered: int


@dataclass(frozen=True, slots=True)
class GroupStats:
    group: str
    topic: str
    in_flight: int  # leased, not yet acked, released or revived
    backlog: int  # visible and not yet leased (topic and retry topic)
    lag: int  # not yet done: backlog + in flight + what is leased below the ack offset
    redelivered: int  # copies put on the retry topic (revive and release), since start
    dead_lettered: int  # since start


@dataclass(slots=True)
class _Requeue:
    """One entry on its way to the retry or dead-letter topic."""

    group: str
    topic: str  # the leased topic (user or retry)
    queue_id: int
    ck_start: int
    index: int
    message: Message
    delay_ms: int | None  # None: the group's back-off
    reason: str | None  # set: dead-letter it


class PopService:
    """Leases, acks, releases and revives for all groups.  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, secret: bytes, clock: Clock,
                 max_messages_cap: int = 32, policy: RetryPolicy | None = None,
                 group_policies: dict[str, RetryPolicy] | None = None) -> None:
        self._store = store
        self._kv = kv
        self._commit = GroupCommit(kv)  # leases, acks and deadlines: durable before OK
        self._handles = HandleCodec(secret)
        self._clock = clock
        self.max_messages_cap = max_messages_cap
        self.default_policy = policy or RetryPolicy()
        self._policies = dict(group_policies or {})
        self._rnd = random.Random()
        self._lock = threading.Lock()  # guards the dicts and counters below
        self._group_locks: dict[tuple[str, str], threading.Lock] = {}
        self._leases: dict[tuple[str, str, int], _QueueLeases] = {}
        self._next_queue: dict[tuple[str, str], int] = {}
        self._popped = self._acked = 0
        self._revived: Counter[tuple[str, str]] = Counter()
        self._released: Counter[tuple[str, str]] = Counter()
        self._dead: Counter[tuple[str, str]] = Counter()
        self._wheel_cond = threading.Condition()
        self._wheel: TimingWheel[_Deadline] = TimingWheel(REVIVE_TICK_MS, 64, 4,
                                                          clock.now_ms())
        self._ready: list[_Deadline] = []  # already due when scheduled
        # entries recently put back for redelivery, so a late settle of one gets a clear
        # error instead of a silent "done" (bounded; forgotten on restart)
        self._requeued: OrderedDict[tuple[str, str, int, int], None] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.tier: TierReader | None = None  # set: read what local retention deleted
        # the dispatch handler that settles retry/DLQ copies with their leases (the
        # broker registers it with the store)
        self.copies = CopySettler(kv, store, self._mark_found)
        self._recover()

    def policy(self, group: str) -> RetryPolicy:
        return self._policies.get(group, self.default_policy)

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        """Load every open lease and schedule its deadlines (needed before revive can
        run: a lease whose deadline passed while the broker was down revives at once)."""
        offsets = {parse_key(k)[:3]: decode_offset(v) for k, v in self._kv.scan(b"o")}
        popped = {parse_key(k)[:3]: decode_offset(v) for k, v in self._kv.scan(b"p")}
        deadlines: list[_Deadline] = []
        for k, v in self._kv.scan(b"c"):
            group, topic, qid, start = parse_key(k)
            assert start is not None
            ck = decode_checkpoint(start, v)
            leases = self._leases.get((group, topic, qid))
            if leases is None:
                ack = offsets.get((group, topic, qid), ck.ck_start)
                leases = self._leases[(group, topic, qid)] = _QueueLeases(ack, ack)
            leases.checkpoints[ck.ck_start] = ck
            leases.pop_offset = max(leases.pop_offset, ck.end)
            deadlines += [(group, topic, qid, ck.ck_start, e) for e in ck.deadlines()]
        for key, leases in self._leases.items():
            leases.pop_offset = max(leases.pop_offset, popped.get(key, 0))
        for group, topic, _ in list(self._leases) + list(offsets):
            self._group_lock(group, origin_of(topic))  # known to statistics
        self._schedule(deadlines)

    # ------------------------------------------------------------------ pop

    def validate(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
                 cap: int | None = None) -> None:
        self._store.require_topic(topic)
        check_group(group)
        limit = cap or self.max_messages_cap
        if not 1 <= max_messages <= limit:
            raise InvalidArgument(f"max_messages must be between 1 and {limit}")
        if not 1 <= invisible_time_s <= MAX_INVISIBLE_TIME_S:
            raise InvalidArgument(
                f"invisible_time_s must be between 1 and {MAX_INVISIBLE_TIME_S} (12 h)")
        if len(retry_topic(group, topic).encode()) > MAX_NAME_BYTES:
            raise InvalidArgument(
                f"group and topic names together are too long: {len(group) + len(topic)} "
                f"bytes, at most {MAX_NAME_BYTES - len(RETRY_PREFIX) - 1}")

    def pop(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
            tag_filter: TagFilter | None = None, cap: int | None = None) -> list[PoppedMessage]:
        """Lease up to ``max_messages`` visible messages for ``invisible_time_s``.  Every
        message whose Send was acknowledged before this call began is visible to it.
        ``cap`` raises the per-call limit (the Subscribe stream leases in larger batches)."""
        self.validate(topic, group, max_messages, invisible_time_s, cap)
        tf = tag_filter or TagFilter(None)
        queue_count = self._store.require_topic(topic).queue_count
        rtopic = retry_topic(group, topic)
        retry = self._store.topics.get(rtopic)
        now = self._clock.now_ms()
        expire = now + invisible_time_s * 1000
        self._store.wait_visible()
        out: list[PoppedMessage] = []
        puts: list[tuple[bytes, bytes]] = []
        deadlines: list[_Deadline] = []
        with self._group_lock(group, topic):
            # retries first up to half, then fresh messages, then retries again: a backlog
            # of either kind never starves the other
            plan = [(rtopic, 1, (max_messages + 1) // 2)] if retry else []
            plan.append((topic, queue_count, max_messages))
            if retry:
                plan.append((rtopic, 1, max_messages))
            for ltopic, queues, limit in plan:
                want = min(limit, max_messages) - len(out)
                if want > 0:
                    out += self._lease(group, ltopic, topic, queues, want, now, expire, tf,
                                       puts, deadlines)
            ticket = self._commit.write(puts) if puts else 0
        if ticket:  # durable before the messages leave the broker (one fsync for many)
            self._commit.wait(ticket)
            crashpoint("pop.after_checkpoint")
        self._schedule(deadlines)
        with self._lock:
            self._popped += len(out)
        return out

    def _lease(self, group: str, ltopic: str, origin: str, queue_count: int, want: int,
               now: int, expire: int, tf: TagFilter, puts: list[tuple[bytes, bytes]],
               deadlines: list[_Deadline]) -> list[PoppedMessage]:
        first = self._next_queue.get((group, ltopic), 0)
        self._next_queue[(group, ltopic)] = first + 1
        out: list[PoppedMessage] = []
        for i in range(queue_count):
            if len(out) >= want:
                break
            qid = (first + i) % queue_count
            out += self._lease_queue(group, ltopic, origin, qid, want - len(out), now, expire,
                                     tf, puts, deadlines)
        return out

    def _group_lock(self, group: str, topic: str) -> threading.Lock:
        """One lock per (group, topic): its leases change, and are persisted, in order,
        while other groups and topics proceed in parallel."""
        key = (group, topic)
        lock = self._group_locks.get(key)
        if lock is None:
            with self._lock:
                lock = self._group_locks.setdefault(key, threading.Lock())
        return lock

    def _bounds(self, topic: str, qid: int) -> tuple[int, int, int]:
        """``(low, local_low, high)``: the oldest queue offset readable (local or in the
        tier), the oldest still on local disk, and the end."""
        local_low, high = self._store.queue_bounds(topic, qid)
        low = local_low
        if self.tier is not None:
            tier_low = self.tier.min_queue_offset(topic, qid)
            if tier_low is not None and tier_low < local_low:
                low = tier_low
        return low, local_low, high

    def _read_rows(self, topic: str, qid: int, offset: int, want: int, local_low: int
                   ) -> tuple[list[tuple[int, int]], Callable[[list[int]], list[Message]]]:
        """Up to ``want`` queue entries from ``offset`` as (queue offset, tag hash) rows,
        and a loader of the picked rows' messages: from the tier below the read
        strategy's floor, else from the local store.  A failing tier falls back to local
        disk when it still has the data."""
        floor = self.tier.floor(topic, qid, local_low) if self.tier is not None else 0
        if offset < floor and self.tier is not None:
            try:
                tiered = self.tier.read(topic, qid, offset, min(want, floor - offset))
            except TierError:
                if offset < local_low:
                    raise
                log.warning("tier read of %s/%d at %d failed; reading local disk", topic,
                            qid, offset, exc_info=True)
            else:
                records = [rec for _, _, _, rec in tiered]

                def load_tiered(picked: list[int]) -> list[Message]:
                    return [decode_record(records[i]) for i in picked]
                return [(qo, tag) for qo, tag, _, _ in tiered], load_tiered
        entries = self._store.consume_queue_entries(topic, qid, offset, want)

        def load_local(picked: list[int]) -> list[Message]:
            return self._store.read_messages([(entries[i].commit_offset,
                                               entries[i].record_size) for i in picked])
        return [(e.queue_offset, e.tag_hash) for e in entries], load_local

    def _lease_queue(self, group: str, ltopic: str, origin: str, qid: int, want: int,
                     now: int, expire: int, tf: TagFilter, puts: list[tuple[bytes, bytes]],
                     deadlines: list[_Deadline]) -> list[PoppedMessage]:
        leases = self._queue(group, ltopic, qid)
        low, local_low, _high = self._bounds(ltopic, qid)
        if leases.pop_offset < low:  # retention removed what the group had not reached
            leases.pop_offset = leases.ack_offset = low
        rows, load = self._read_rows(ltopic, qid, leases.pop_offset, want, local_low)
        if not rows:
            return []
        count = len(rows)
        ck = PopCheckpoint(rows[0][0], now, expire, count, bytearray((count + 7) // 8))
        out: list[PoppedMessage] = []
        wanted = []
        for i, (_, tag) in enumerate(rows):
            if tf.tags is None or tag in tf.hashes:
                wanted.append(i)
            else:
                ck.mark(i)  # filtered out: done for this group
        encode = self._handles.encode
        for i, msg in zip(wanted, load(wanted), strict=True):
            if not tf.accepts(msg.tag):  # a tag-hash collision
                ck.mark(i)
                continue
            attempt = msg.delivery_attempt + 1
            msg.topic = origin
            msg.properties.pop(PROP_LEASE, None)  # internal: the entry a copy replaced
            handle = encode(group, ReceiptHandle(ltopic, qid, ck.ck_start, rows[i][0],
                                                 expire, attempt))
            out.append(PoppedMessage(msg, handle, attempt))
        leases.pop_offset = ck.end
        puts.append((pop_offset_key(group, ltopic, qid), encode_offset(ck.end)))
        if ck.all_acked():  # the filter skipped everything: no lease, just move on
            if not leases.checkpoints:
                leases.ack_offset = leases.pop_offset
                puts.append((offset_key(group, ltopic, qid), encode_offset(leases.ack_offset)))
            return out
        leases.checkpoints[ck.ck_start] = ck
        puts.append((checkpoint_key(group, ltopic, qid, ck.ck_start), encode_checkpoint(ck)))
        deadlines.append((group, ltopic, qid, ck.ck_start, expire))
        return out

    def _queue(self, group: str, topic: str, qid: int) -> _QueueLeases:
        """The queue's lease state; the caller holds the (group, topic) lock."""
        key = (group, topic, qid)
        leases = self._leases.get(key)
        if leases is None:
            raw = self._kv.get(offset_key(group, topic, qid))
            ack = decode_offset(raw) if raw else self._bounds(topic, qid)[0]
            raw = self._kv.get(pop_offset_key(group, topic, qid))
            leases = _QueueLeases(ack_offset=ack,
                                  pop_offset=max(ack, decode_offset(raw) if raw else 0))
            with self._lock:
                self._leases[key] = leases
        return leases

    # ------------------------------------------------------------------ handles

    def _decode(self, group: str, text: str, now: int, verify: bool = True) -> ReceiptHandle:
        h = self._handles.decode(group, text, verify)
        if now >= h.expire_at_ms:
            raise ReceiptHandleExpired(
                f"receipt handle expired at {h.expire_at_ms} (now {now}): the lease ran out "
                "and the message may have been redelivered")
        return h

    def _lease_of(self, group: str, h: ReceiptHandle) -> tuple[PopCheckpoint | None, int]:
        """The checkpoint holding ``h`` (None once it is done) and the entry's index;
        raises for a handle that does not match or was superseded.  Caller holds the
        group lock."""
        ck = self._queue(group, h.topic, h.queue_id).checkpoints.get(h.ck_start)
        if (group, h.topic, h.queue_id, h.queue_offset) in self._requeued:
            raise AlreadyRequeued("the message was already released for redelivery (Nack, "
                                  "revive or ChangeInvisibleTime 0): this handle is done")
        if ck is None:
            return None, -1
        i = h.queue_offset - ck.ck_start
        if not 0 <= i < ck.count:
            raise InvalidArgument("receipt handle does not match its lease")
        if ck.expire_of(i) != h.expire_at_ms:
            raise HandleSuperseded("receipt handle was replaced by ChangeInvisibleTime: "
                                   "use the handle it returned")
        if ck.is_acked(i):
            return None, i
        return ck, i

    def _finish(self, group: str, topic: str, qid: int, ck: PopCheckpoint,
                ops: dict[bytes, bytes | None]) -> None:
        """Persist a checkpoint after marks: rewrite it, or delete it and move the ack
        offset when all its entries are done.  Caller holds the group lock."""
        key = checkpoint_key(group, topic, qid, ck.ck_start)
        if not ck.all_acked():
            ops[key] = encode_checkpoint(ck)
            return
        leases = self._queue(group, topic, qid)
        if leases.checkpoints.pop(ck.ck_start, None) is None:
            return
        ops[key] = None
        oldest = min(leases.checkpoints, default=leases.pop_offset)
        if oldest > leases.ack_offset:
            leases.ack_offset = oldest
            ops[offset_key(group, topic, qid)] = encode_offset(oldest)

    def _write(self, ops: dict[bytes, bytes | None]) -> int:
        """Apply ``ops`` (None: delete) without a sync; the ticket to wait for (0: none)."""
        if not ops:
            return 0
        return self._commit.write([(k, v) for k, v in ops.items() if v is not None],
                                  [k for k, v in ops.items() if v is None])

    # ------------------------------------------------------------------ ack

    def ack(self, group: str, receipt_handle: str) -> None:
        """Acknowledge one leased message.  Idempotent while the handle is valid."""
        (error,) = self.ack_many(group, [receipt_handle])
        if error is not None:
            raise error

    def ack_many(self, group: str, receipt_handles: list[str],
                 issued: Container[str] = ()) -> list[ChronomqError | None]:
        """Acknowledge several handles with one RocksDB write per topic; one outcome per
        handle (None = acknowledged).  Handles in ``issued`` are known to have been issued
        to ``group`` by this broker (a Subscribe stream's): their MAC is not recomputed."""
        handles, results = self._decode_all(group, receipt_handles, issued)
        ticket = 0
        for origin, items in _by_origin(handles).items():
            ops: dict[bytes, bytes | None] = {}
            acked = 0
            with self._group_lock(group, origin):
                for n, h in items:
                    try:
                        ck, i = self._lease_of(group, h)
                    except ChronomqError as exc:
                        results[n] = exc
                        continue
                    if ck is not None:
                        ck.mark(i)
                        acked += 1
                        self._finish(group, h.topic, h.queue_id, ck, ops)
                ticket = self._write(ops) or ticket
            with self._lock:
                self._acked += acked
        if ticket:  # an OK ack is final: durable before the answer (one fsync for many)
            self._commit.wait(ticket)
            crashpoint("pop.after_ack")
        return results

    def _decode_all(self, group: str, texts: list[str], issued: Container[str] = ()
                    ) -> tuple[list[ReceiptHandle | None], list[ChronomqError | None]]:
        try:
            check_group(group)
        except ChronomqError as exc:
            return [None] * len(texts), [exc] * len(texts)
        now = self._clock.now_ms()
        handles: list[ReceiptHandle | None] = []
        results: list[ChronomqError | None] = []
        for text in texts:
            try:
                handles.append(self._decode(group, text, now, text not in issued))
                results.append(None)
            except ChronomqError as exc:
                handles.append(None)
                results.append(exc)
        return handles, results

    # ------------------------------------------------------------------ invisible time

    def change_invisible_time(self, group: str, receipt_handle: str,
                              invisible_time_s: int) -> str:
        """Move the deadline of one leased message to now + ``invisible_time_s`` (0: visible
        again now) with one synced write; returns the new handle (the old one stops
        working)."""
        check_group(group)
        if not 0 <= invisible_time_s <= MAX_INVISIBLE_TIME_S:
            raise InvalidArgument(
                f"invisible_time_s must be between 0 and {MAX_INVISIBLE_TIME_S} (12 h)")
        now = self._clock.now_ms()
        h = self._decode(group, receipt_handle, now)
        expire = now + invisible_time_s * 1000
        with self._group_lock(group, origin_of(h.topic)):
            ck, i = self._lease_of(group, h)
            if ck is None:
                raise AlreadyDone("the message was already acknowledged or released")
            if ck.count == 1:
                ck.expire_at_ms = expire
            else:
                ck.overrides[i] = expire
            ticket = self._commit.write([(checkpoint_key(group, h.topic, h.queue_id,
                                                         ck.ck_start), encode_checkpoint(ck))])
        self._commit.wait(ticket)
        crashpoint("pop.after_change_invisible")
        self._schedule([(group, h.topic, h.queue_id, h.ck_start, expire)])
        return self._handles.encode(group, ReceiptHandle(
            h.topic, h.queue_id, h.ck_start, h.queue_offset, expire, h.attempt))

    # ------------------------------------------------------------------ release / DLQ

    def release_many(self, group: str, items: list[tuple[str, int | None]]
                     ) -> list[ChronomqError | None]:
        """Nack: give leased messages back, each visible again after its delay in ms
        (None: the group's back-off for its attempt); past the group's max attempts a
        message goes to the dead-letter topic instead.  Idempotent while the handle is
        valid."""
        for _, delay in items:
            if delay is not None and not 0 <= delay <= MAX_INVISIBLE_TIME_S * 1000:
                raise InvalidArgument("a release delay must be between 0 and 12 h")
        return self._requeue_many(group, [(t, d, None) for t, d in items])

    def dead_letter_many(self, group: str, items: list[tuple[str, str]]
                         ) -> list[ChronomqError | None]:
        """Move leased messages to the group's dead-letter topic now, with ``reason``."""
        return self._requeue_many(group, [(t, None, r or "dead-lettered by the consumer")
                                          for t, r in items])

    def _requeue_many(self, group: str, items: list[tuple[str, int | None, str | None]]
                      ) -> list[ChronomqError | None]:
        handles, results = self._decode_all(group, [t for t, _, _ in items])
        now = self._clock.now_ms()
        for origin, chosen in _by_origin(handles).items():
            # the lock is held through the append: a concurrent ack of the same message
            # must not persist it as done before its copy is durable
            with self._group_lock(group, origin):
                todo: list[tuple[int, _Requeue]] = []
                for n, h in chosen:
                    try:
                        ck, i = self._lease_of(group, h)
                    except AlreadyRequeued:
                        continue  # released before: releasing again is a no-op
                    except ChronomqError as exc:
                        results[n] = exc
                        continue
                    if ck is not None:
                        _, delay, reason = items[n]
                        todo.append((n, _Requeue(group, h.topic, h.queue_id, ck.ck_start, i,
                                                 _placeholder(), delay, reason)))
                if not todo:
                    continue
                try:
                    self._read_into([r for _, r in todo])
                    copies = self._append_copies(origin, [r for _, r in todo], now)
                except ChronomqError as exc:
                    for n, _ in todo:
                        results[n] = exc
                    continue
                self._mark_done([r for _, r in todo], self._released)
                self.copies.settled(copies)
        return results

    def _read_into(self, reqs: list[_Requeue]) -> None:
        """Fill each request's message from its queue entry."""
        local: list[_Requeue] = []
        locations = []
        for r in reqs:
            qo = r.ck_start + r.index
            (entry,) = self._store.consume_queue_entries(r.topic, r.queue_id, qo, 1) or (None,)
            if entry is not None:
                local.append(r)
                locations.append((entry.commit_offset, entry.record_size))
                continue
            tiered = self.tier.read(r.topic, r.queue_id, qo, 1) if self.tier else ()
            if not tiered or tiered[0][0] != qo:
                raise FailedPrecondition(f"message at {r.topic}/{r.queue_id}/{qo} is no "
                                         "longer stored (retention)")
            r.message = decode_record(tiered[0][3])
        for r, m in zip(local, self._store.read_messages(locations), strict=True):
            r.message = m

    def _append_copies(self, origin: str, reqs: list[_Requeue], now: int) -> list[CopyKey]:
        """Append the retry or dead-letter copy of each request; returns once durable,
        with the copies' keys, to hand to ``copies.settled`` once the entries are marked
        done (``pop.settle``)."""
        drafts = []
        copies: list[tuple[CopyKey, LeaseEntry]] = []
        for r in reqs:
            m = r.message
            attempts = m.delivery_attempt + 1  # deliveries so far
            policy = self.policy(r.group)
            reason = r.reason
            if reason is None and attempts >= policy.max_attempts:
                reason = f"max attempts ({policy.max_attempts}) reached"
            props = dict(m.properties)
            if reason is not None:
                target, due, flags = dlq_topic(r.group, origin), now, FLAG_RETRY
                r.reason = reason
                props.update({PROP_DLQ_REASON: reason, PROP_DLQ_ATTEMPTS: str(attempts),
                              PROP_DLQ_GROUP: r.group, PROP_ORIGIN_TOPIC: origin})
            else:
                delay = r.delay_ms if r.delay_ms is not None else \
                    policy.backoff(attempts, self._rnd)
                target, due = retry_topic(r.group, origin), now + delay
                flags = FLAG_RETRY | (FLAG_DELAYED if delay > 0 else 0)
            self._ensure_topic(target)
            entry = LeaseEntry(r.group, r.topic, r.queue_id, r.ck_start + r.index)
            props[PROP_LEASE] = encode_lease(entry)
            copies.append(((target, m.message_id), entry))
            drafts.append(Draft(m.message_id, target, m.key, m.tag, m.body,
                                encode_properties(props), m.born_at_ms, due, flags, attempts))
        self.copies.begin(copies)
        try:
            self._store.put_drafts(drafts).result()
        except BaseException:
            self.copies.settled([k for k, _ in copies], appended=False)
            raise
        crashpoint("pop.after_copy_append")
        return [k for k, _ in copies]

    def _ensure_topic(self, name: str) -> None:
        if self._store.topics.get(name) is None:
            self._store.create_topic(Topic(name, 1))

    def _mark_done(self, reqs: list[_Requeue], counter: Counter[tuple[str, str]]) -> None:
        """Mark requeued entries done and persist their checkpoints (caller holds the
        group lock).  Not synced: their copies are durable, so a lost mark only repeats
        a redelivery."""
        ops: dict[bytes, bytes | None] = {}
        for r in reqs:
            ck = self._queue(r.group, r.topic, r.queue_id).checkpoints.get(r.ck_start)
            if ck is None or ck.is_acked(r.index):
                continue
            ck.mark(r.index)
            self._finish(r.group, r.topic, r.queue_id, ck, ops)
            self._requeued[(r.group, r.topic, r.queue_id, r.ck_start + r.index)] = None
            if len(self._requeued) > REQUEUED_MEMORY:
                self._requeued.popitem(last=False)
            key = (r.group, origin_of(r.topic))
            with self._lock:
                if r.reason is None:
                    counter[key] += 1
                else:
                    self._dead[key] += 1
        self._write(ops)
        crashpoint("pop.after_mark_done")

    def _mark_found(self, found: list[tuple[str, LeaseEntry]]) -> None:
        """Mark done the entries whose copies the CommitLog holds (``pop.settle``): a
        crash fell between a copy's append and its entry's mark."""
        for copy_topic, e in found:
            origin = origin_of(e.topic)
            with self._group_lock(e.group, origin):
                leases = self._leases.get((e.group, e.topic, e.queue_id))
                ck = next((c for c in (leases.checkpoints.values() if leases else ())
                           if c.ck_start <= e.queue_offset < c.end), None)
                if ck is None or ck.is_acked(e.queue_offset - ck.ck_start):
                    continue
                reason = "recovered" if copy_topic.startswith(DLQ_PREFIX) else None
                self._mark_done([_Requeue(e.group, e.topic, e.queue_id, ck.ck_start,
                                          e.queue_offset - ck.ck_start, _placeholder(), 0,
                                          reason)], self._revived)
            log.info("the %s copy of %s/%s/%d at %d was in the CommitLog: lease entry done",
                     copy_topic, e.group, e.topic, e.queue_id, e.queue_offset)

    # ------------------------------------------------------------------ revive

    def _schedule(self, deadlines: list[_Deadline], at_ms: int | None = None) -> None:
        """Fire each deadline at its time (or at ``at_ms``: a revive that failed)."""
        if not deadlines:
            return
        with self._wheel_cond:
            for d in deadlines:
                if not self._wheel.add(d, at_ms or d[4]):
                    self._ready.append(d)
            self._wheel_cond.notify()

    def revive_due(self, now_ms: int | None = None) -> int:
        """Revive the entries whose deadline passed by ``now_ms``: each gets a copy on the
        retry topic (or the dead-letter topic past max attempts), visible at once.
        Returns how many entries were revived."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        with self._wheel_cond:
            fired = self._ready[:REVIVE_BATCH]
            del self._ready[:REVIVE_BATCH]
            fired += [d for d, _ in self._wheel.advance(now, REVIVE_BATCH - len(fired))]
        by_origin: dict[tuple[str, str], list[_Requeue]] = {}
        keys: dict[tuple[str, str], list[_Deadline]] = {}
        for deadline in fired:
            group, topic, qid, start, expire = deadline
            origin = origin_of(topic)
            keys.setdefault((group, origin), []).append(deadline)
            with self._group_lock(group, origin):
                leases = self._leases.get((group, topic, qid))
                ck = leases.checkpoints.get(start) if leases else None
                if ck is None:
                    continue
                by_origin.setdefault((group, origin), []).extend(
                    _Requeue(group, topic, qid, start, i, _placeholder(), 0, None)
                    for i in ck.open_at(expire))
        revived = 0
        for (group, origin), reqs in by_origin.items():
            # handles of these entries are expired: nothing else touches them meanwhile
            try:
                self._read_into(reqs)
                copies = self._append_copies(origin, reqs, now)
            except ChronomqError as exc:
                log.warning("revive of %d messages of %s/%s failed, retrying in 1 s: %s",
                            len(reqs), group, origin, exc)
                self._schedule(keys[(group, origin)], at_ms=now + 1000)
                continue
            with self._group_lock(group, origin):
                self._mark_done(reqs, self._revived)
            self.copies.settled(copies)
            revived += len(reqs)
        return revived

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pop-revive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wheel_cond:
            self._stopping = True
            self._wheel_cond.notify()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._wheel_cond:
                if self._stopping:
                    return
                if not self._ready:
                    nxt = self._wheel.next_expiry_ms()
                    wait_ms = 500 if nxt is None else min(500, nxt - self._clock.now_ms())
                    if wait_ms > 0:
                        self._wheel_cond.wait(wait_ms / 1000)
                        continue
            try:
                self.revive_due()
            except Exception:  # keep reviving; the failure is logged with its cause
                log.exception("revive failed")
                with self._wheel_cond:
                    self._wheel_cond.wait(1.0)

    # ------------------------------------------------------------------ stats

    def statistics(self) -> PopStats:
        with self._lock:
            open_cks = sum(len(q.checkpoints) for q in self._leases.values())
            return PopStats(open_checkpoints=open_cks, popped=self._popped, acked=self._acked,
                            revived=sum(self._revived.values()),
                            released=sum(self._released.values()),
                            dead_lettered=sum(self._dead.values()))

    def group_statistics(self) -> list[GroupStats]:
        """Per (group, topic) that has leased since it was created."""
        with self._lock:
            pairs = sorted(self._group_locks)
        out = []
        for group, topic in pairs:
            t = self._store.topics.get(topic)
            if t is None:
                continue
            parts = [(topic, t.queue_count)]
            if self._store.topics.get(retry_topic(group, topic)) is not None:
                parts.append((retry_topic(group, topic), 1))
            in_flight = backlog = lag = 0
            with self._group_lock(group, topic):
                for ltopic, queues in parts:
                    for qid in range(queues):
                        leases = self._queue(group, ltopic, qid)
                        low, _, high = self._bounds(ltopic, qid)
                        in_flight += sum(c.count - c.done for c in leases.checkpoints.values())
                        backlog += max(0, high - max(leases.pop_offset, low))
                        lag += max(0, high - max(leases.ack_offset, low))
            with self._lock:
                redelivered = self._revived[(group, topic)] + self._released[(group, topic)]
                dead = self._dead[(group, topic)]
            out.append(GroupStats(group, topic, in_flight, backlog, lag, redelivered, dead))
        return out

    def forget_topic(self, topic: str) -> None:
        """Drop every group's leases and offsets of a deleted topic (memory and RocksDB)
        and the groups' retry topics."""
        with self._lock:
            doomed_keys = [k for k in self._leases if origin_of(k[1]) == topic]
            for key in doomed_keys:
                del self._leases[key]
            for pair in [k for k in self._group_locks if k[1] == topic]:
                del self._group_locks[pair]
        doomed = [k for kind in (b"c", b"o", b"p") for k, _ in self._kv.scan(kind)
                  if origin_of(parse_key(k)[1]) == topic]
        self._kv.write(deletes=doomed)
        for t in self._store.topics.list():
            if t.name.startswith(RETRY_PREFIX) and origin_of(t.name) == topic:
                self._store.delete_topic(t.name)


def _placeholder() -> Message:
    return Message("", "", b"")


def _by_origin(handles: list[ReceiptHandle | None]
               ) -> dict[str, list[tuple[int, ReceiptHandle]]]:
    """Decoded handles by the user topic whose lock covers them, with their positions."""
    out: dict[str, list[tuple[int, ReceiptHandle]]] = {}
    for n, h in enumerate(handles):
        if h is not None:
            out.setdefault(origin_of(h.topic), []).append((n, h))
    return out


def check_group(group: str) -> None:
    if not group:
        raise InvalidArgument("group is empty")
    if len(group) > MAX_GROUP_BYTES or not _GROUP.match(group):
        raise InvalidArgument(
            f"group {group!r} is invalid: use 1-{MAX_GROUP_BYTES} characters from "
            "A-Z a-z 0-9 _ -")

