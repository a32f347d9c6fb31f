"""PopService: lease messages to a consumer group, acknowledge them.

Every group sees every message of a topic; within a group a message is leased to one
consumer at a time.  Per (group, topic, queue) the service keeps:

- ``pop_offset``: the next queue offset to lease;
- the open PopCheckpoints (leases) by their start offset;
- ``ack_offset``: the first queue offset not yet done (persisted; only moves forward).

A Pop writes its PopCheckpoints with a synced RocksDB write before any message leaves the
broker.  An Ack marks a bit; a fully-acked checkpoint is deleted and the ack offset moves to
the start of the oldest open one.  (Revive of expired leases is the timer's job.)

Thread-safe: a lock per (group, topic) orders that group's leases and their RocksDB writes;
different groups and topics pop and ack in parallel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pop.checkpoint import (
    PopCheckpoint,
    checkpoint_key,
    ck_start_of_key,
    decode_checkpoint,
    decode_offset,
    encode_checkpoint,
    encode_offset,
    offset_key,
    queue_prefix,
)
from pop.handle import HandleCodec, ReceiptHandle
from store.clock import Clock
from store.errors import ChronomqError, FailedPrecondition, InvalidArgument
from store.kv import KV
from store.message import Message
from store.queues import tag_hash
from store.store import MessageStore

MAX_INVISIBLE_TIME_S = 12 * 3600
MAX_GROUP_BYTES = 255


class ReceiptHandleExpired(FailedPrecondition):
    """Raised when a receipt handle's lease ran out before the ack arrived."""


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


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    message: Message
    receipt_handle: str
    delivery_attempt: int


@dataclass(frozen=True, slots=True)
class PopStats:
    open_checkpoints: int
    popped: int
    acked: int


class PopService:
    """Leases and acks for all groups.  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, secret: bytes, clock: Clock,
                 max_messages_cap: int = 32) -> None:
        self._store = store
        self._kv = kv
        self._handles = HandleCodec(secret)
        self._clock = clock
        self.max_messages_cap = max_messages_cap
        self._lock = threading.Lock()  # guards the dicts below
        self._group_locks: dict[tuple[str, str], threading.Lock] = {}
        self._leases: dict[tuple[str, str, int], _QueueLeases] = {}
        self._next_queue: dict[tuple[str, str], int] = {}
        self._popped = 0
        self._acked = 0

    # ------------------------------------------------------------------ pop

    def validate(self, topic: str, group: str, max_messages: int, invisible_time_s: int) -> None:
        self._store.require_topic(topic)
        _check_group(group)
        if not 1 <= max_messages <= self.max_messages_cap:
            raise InvalidArgument(f"max_messages must be between 1 and {self.max_messages_cap}")
        if not 1 <= invisible_time_s <= MAX_INVISIBLE_TIME_S:
            raise InvalidArgument(
                f"invisible_time_s must be between 1 and {MAX_INVISIBLE_TIME_S} (12 h)"
            )

    def pop(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
            tag_filter: TagFilter | None = None) -> list[PoppedMessage]:
        """Lease up to ``max_messages`` visible messages for ``invisible_time_s``.  Every
        message whose Send was acknowledged before this call began is visible to it."""
        self.validate(topic, group, max_messages, invisible_time_s)
        tf = tag_filter or TagFilter(None)
        queue_count = self._store.require_topic(topic).queue_count
        now = self._clock.now_ms()
        expire = now + invisible_time_s * 1000
        self._store.wait_visible()
        out: list[PoppedMessage] = []
        puts: list[tuple[bytes, bytes]] = []
        with self._group_lock(group, topic):
            first = self._next_queue.get((group, topic), 0)
            self._next_queue[(group, topic)] = first + 1
            for i in range(queue_count):
                if len(out) >= max_messages:
                    break
                qid = (first + i) % queue_count
                got = self._lease_queue(group, topic, qid, max_messages - len(out), now, expire,
                                        tf, puts)
                out.extend(got)
            if puts:
                self._kv.write(puts, sync=True)  # durable before messages leave the broker
        with self._lock:
            self._popped += len(out)
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

    def _lease_queue(self, group: str, topic: str, qid: int, want: int, now: int, expire: int,
                     tf: TagFilter, puts: list[tuple[bytes, bytes]]) -> list[PoppedMessage]:
        leases = self._queue(group, topic, qid)
        low, _high = self._store.queue_bounds(topic, qid)
        if leases.pop_offset < low:  # retention removed what the group had not reached
            leases.pop_offset = leases.ack_offset = low
        entries = self._store.consume_queue_entries(topic, qid, leases.pop_offset, want)
        if not entries:
            return []
        count = len(entries)
        ck = PopCheckpoint(entries[0].queue_offset, now, expire, 1, count,
                           bytearray((count + 7) // 8))
        out: list[PoppedMessage] = []
        wanted = []
        for i, e in enumerate(entries):
            if tf.tags is None or e.tag_hash in tf.hashes:
                wanted.append((i, e))
            else:
                ck.mark(i)  # filtered out: done for this group
        messages = self._store.read_messages([(e.commit_offset, e.record_size)
                                              for _, e in wanted])
        for (i, e), msg in zip(wanted, messages, strict=True):
            if not tf.accepts(msg.tag):  # a tag-hash collision
                ck.mark(i)
                continue
            handle = self._handles.encode(group, ReceiptHandle(
                topic, qid, ck.ck_start, e.queue_offset, expire, ck.attempt))
            out.append(PoppedMessage(msg, handle, ck.attempt))
        leases.pop_offset = ck.end
        if ck.all_acked():  # the filter skipped everything: no lease, just move on
            if not leases.checkpoints:
                leases.ack_offset = leases.pop_offset
                puts.append((offset_key(group, topic, qid), encode_offset(leases.ack_offset)))
            return out
        leases.checkpoints[ck.ck_start] = ck
        puts.append((checkpoint_key(group, topic, qid, ck.ck_start), encode_checkpoint(ck)))
        return out

    def _queue(self, group: str, topic: str, qid: int) -> _QueueLeases:
        """The queue's lease state; the caller holds the (group, topic) lock."""
        key = (group, topic, qid)
        leases = self._leases.get(key)
        if leases is None:
            leases = self._load(group, topic, qid)
            with self._lock:
                self._leases[key] = leases
        return leases

    def _load(self, group: str, topic: str, qid: int) -> _QueueLeases:
        raw = self._kv.get(offset_key(group, topic, qid))
        ack = decode_offset(raw) if raw else self._store.queue_bounds(topic, qid)[0]
        leases = _QueueLeases(ack_offset=ack, pop_offset=ack)
        for k, v in self._kv.scan(queue_prefix(b"c", group, topic, qid)):
            ck = decode_checkpoint(ck_start_of_key(k), v)
            leases.checkpoints[ck.ck_start] = ck
            leases.pop_offset = max(leases.pop_offset, ck.end)
        return leases

    # ------------------------------------------------------------------ ack

    def ack(self, group: str, receipt_handle: str) -> None:
        """Acknowledge one leased message.  Idempotent while the handle is valid."""
        (error,) = self.ack_many(group, [receipt_handle])
        if error is not None:
            raise error

    def ack_many(self, group: str, receipt_handles: list[str]) -> list[ChronomqError | None]:
        """Acknowledge several handles with one RocksDB write; one outcome per handle
        (None = acknowledged)."""
        try:
            _check_group(group)
        except ChronomqError as exc:
            return [exc] * len(receipt_handles)
        now = self._clock.now_ms()
        handles: list[ReceiptHandle | ChronomqError] = []
        for text in receipt_handles:
            try:
                h = self._handles.decode(group, text)
                if now >= h.expire_at_ms:
                    raise ReceiptHandleExpired(
                        f"receipt handle expired at {h.expire_at_ms} (now {now}): the lease "
                        "ran out and the message may have been redelivered")
                handles.append(h)
            except ChronomqError as exc:
                handles.append(exc)
        results: list[ChronomqError | None] = [
            item if isinstance(item, ChronomqError) else None for item in handles]
        for topic in {h.topic for h in handles if isinstance(h, ReceiptHandle)}:
            ops: dict[bytes, bytes | None] = {}  # key -> new value, None = delete
            with self._group_lock(group, topic):
                for n, item in enumerate(handles):
                    if isinstance(item, ReceiptHandle) and item.topic == topic:
                        try:
                            self._ack_locked(group, item, ops)
                        except ChronomqError as exc:
                            results[n] = exc
                if ops:
                    self._kv.write([(k, v) for k, v in ops.items() if v is not None],
                                   [k for k, v in ops.items() if v is None])
        return results

    def _ack_locked(self, group: str, h: ReceiptHandle, ops: dict[bytes, bytes | None]) -> None:
        leases = self._queue(group, h.topic, h.queue_id)
        ck = leases.checkpoints.get(h.ck_start)
        if ck is None or ck.expire_at_ms != h.expire_at_ms:
            return  # the lease is gone while the handle is unexpired: already acked
        i = h.queue_offset - ck.ck_start
        if not 0 <= i < ck.count:
            raise InvalidArgument("receipt handle does not match its lease")
        if ck.is_acked(i):
            return
        ck.mark(i)
        with self._lock:
            self._acked += 1
        key = checkpoint_key(group, h.topic, h.queue_id, ck.ck_start)
        if not ck.all_acked():
            ops[key] = encode_checkpoint(ck)
            return
        del leases.checkpoints[ck.ck_start]
        ops[key] = None
        oldest = min(leases.checkpoints, default=leases.pop_offset)
        if oldest > leases.ack_offset:
            leases.ack_offset = oldest
            ops[offset_key(group, h.topic, h.queue_id)] = encode_offset(oldest)

    # ------------------------------------------------------------------ stats

    def statistics(self) -> PopStats:
        with self._lock:
            open_cks = sum(len(q.checkpoints) for q in self._leases.values())
        return PopStats(open_checkpoints=open_cks, popped=self._popped, acked=self._acked)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's leases and offsets of a deleted topic (memory and RocksDB)."""
        with self._lock:
            for key in [k for k in self._leases if k[1] == topic]:
                del self._leases[key]
            doomed = [k for kind in (b"c", b"o") for k, _ in self._kv.scan(kind)
                      if k.split(b"\0", 2)[1] == topic.encode()]
            self._kv.write(deletes=doomed)


def _check_group(group: str) -> None:
    if not group:
        raise InvalidArgument("group is empty")
    if len(group.encode()) > MAX_GROUP_BYTES or "\0" in group:
        raise InvalidArgument(f"group must be 1-{MAX_GROUP_BYTES} bytes without NUL")
