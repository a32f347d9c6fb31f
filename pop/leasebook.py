"""LeaseBook: the lease state of every (group, topic, queue) and how it is persisted.

Per (group, leased topic, queue) it keeps ``QueueLeases``: the ack offset (the first
queue offset not yet done), the pop offset (the first never leased) and the open
PopCheckpoints by start offset, all mirrored in the POP RocksDB (``pop.checkpoint``
layouts).  Writes go through a ``GroupCommit``: callers that answer a client wait for
their ticket, so an OK answer is durable, and one WAL fsync covers every consumer
waiting at that moment.  It also decodes and checks receipt handles against the book.

The POP service builds on it in two layers: ``pop.requeue`` (release, dead-letter,
revive) and ``pop.service`` (Pop, Ack, ChangeInvisibleTime).

Thread-safe: a lock per (group, user topic) orders that group's leases and their
writes (its retry topic shares the lock); ``_lock`` guards the shared dicts and
counters.
"""

from __future__ import annotations

import random
import threading
from collections import Counter, OrderedDict
from collections.abc import Container

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
from pop.model import (
    RETRY_PREFIX,
    AlreadyRequeued,
    Deadline,
    GroupStats,
    HandleSuperseded,
    MountedBounds,
    PopStats,
    QueueLeases,
    ReceiptHandleExpired,
    TierReader,
    check_group,
    origin_of,
    retry_topic,
)
from pop.policy import RetryPolicy
from store.clock import Clock
from store.errors import ChronomqError, InvalidArgument
from store.kv import KV, GroupCommit
from store.store import MessageStore


class LeaseBook:
    """Lease state and its persistence (see the module docstring).  Thread-safe."""

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
        self._leases: dict[tuple[str, str, int], QueueLeases] = {}
        self._next_queue: dict[tuple[str, str], int] = {}
        self._popped = self._acked = 0
        self._revived: Counter[tuple[str, str]] = Counter()
        self._released: Counter[tuple[str, str]] = Counter()
        self._dead: Counter[tuple[str, str]] = Counter()
        # entries recently put back for redelivery, so a late settle of one gets a clear
        # error instead of a silent "done" (bounded; forgotten on restart)
        self._requeued: OrderedDict[tuple[str, str, int, int], None] = OrderedDict()
        self.tier: TierReader | None = None  # set: read what local retention deleted
        self.mounts: MountedBounds | None = None  # set: queues of mounted tiers


    def policy(self, group: str) -> RetryPolicy:
        return self._policies.get(group, self.default_policy)

    def _recover(self) -> list[Deadline]:
        """Load every open lease; returns their deadlines, to schedule (needed before
        revive can run: a lease whose deadline passed while the broker was down revives
        at once)."""
        offsets = {parse_key(k)[:3]: decode_offset(v) for k, v in self._kv.scan(b"o")}
        popped = {parse_key(k)[:3]: decode_offset(v) for k, v in self._kv.scan(b"p")}
        deadlines: list[Deadline] = []
        for k, v in self._kv.scan(b"c"):
            group, topic, qid, start = parse_key(k)
            assert start is not None
            ck = decode_checkpoint(start, v)
            leases = self._leases.get((group, topic, qid))
            if leases is None:
                ack = offsets.get((group, topic, qid), ck.ck_start)
                leases = self._leases[(group, topic, qid)] = QueueLeases(ack, ack)
            leases.checkpoints[ck.ck_start] = ck
            leases.pop_offset = max(leases.pop_offset, ck.end)
            deadlines += [(group, topic, qid, ck.ck_start, e) for e in ck.deadlines()]
        for key, leases in self._leases.items():
            leases.pop_offset = max(leases.pop_offset, popped.get(key, 0))
        for group, topic, _ in list(self._leases) + list(offsets):
            self._group_lock(group, origin_of(topic))  # known to statistics
        return deadlines

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
        if self.mounts is not None:
            mounted = self.mounts.bounds(topic, qid)
            if mounted is not None:  # all of it in another broker's tier
                return mounted[0], mounted[1], mounted[1]
        local_low, high = self._store.queue_bounds(topic, qid)
        low = local_low
        if self.tier is not None:
            tier_low = self.tier.min_queue_offset(topic, qid)
            if tier_low is not None and tier_low < local_low:
                low = tier_low
        return low, local_low, high

    def _queue(self, group: str, topic: str, qid: int) -> QueueLeases:
        """The queue's lease state; the caller holds the (group, topic) lock."""
        key = (group, topic, qid)
        leases = self._leases.get(key)
        if leases is None:
            raw = self._kv.get(offset_key(group, topic, qid))
            ack = decode_offset(raw) if raw else self._bounds(topic, qid)[0]
            raw = self._kv.get(pop_offset_key(group, topic, qid))
            leases = QueueLeases(ack_offset=ack,
                                  pop_offset=max(ack, decode_offset(raw) if raw else 0))
            with self._lock:
                self._leases[key] = leases
        return leases

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
        self._forget_deadlines([(group, topic, qid, ck.ck_start, e)
                                for e in {ck.expire_at_ms, *ck.overrides.values()}])
        oldest = min(leases.checkpoints, default=leases.pop_offset)
        if oldest > leases.ack_offset:
            leases.ack_offset = oldest
            ops[offset_key(group, topic, qid)] = encode_offset(oldest)

    def _forget_deadlines(self, deadlines: list[Deadline]) -> None:
        """The lease these deadlines belong to is done: they need not fire (the revive
        layer drops them from its wheel, ``pop.requeue``)."""

    def _write(self, ops: dict[bytes, bytes | None]) -> int:
        """Apply ``ops`` (None: delete) without a sync; the ticket to wait for (0: none)."""
        if not ops:
            return 0
        return self._commit.write([(k, v) for k, v in ops.items() if v is not None],
                                  [k for k, v in ops.items() if v is None])

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

    def statistics(self) -> PopStats:
        with self._lock:
            open_cks = sum(len(q.checkpoints) for q in self._leases.values())
            return PopStats(open_checkpoints=open_cks, popped=self._popped, acked=self._acked,
                            revived=sum(self._revived.values()),
                            released=sum(self._released.values()),
                            dead_lettered=sum(self._dead.values()),
                            durable_syncs=self._commit.syncs)

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
            with self._group_lock(group, topic):
                for ltopic, queues in parts:
                    for qid in range(queues):
                        leases = self._queue(group, ltopic, qid)
                        low, _, high = self._bounds(ltopic, qid)
                        in_flight += sum(c.count - c.done for c in leases.checkpoints.values())
                        backlog += max(0, high - max(leases.pop_offset, low))
            with self._lock:
                redelivered = self._revived[(group, topic)] + self._released[(group, topic)]
                dead = self._dead[(group, topic)]
            # lag: what the group has not settled yet.  Not "end - ack offset": one message
            # held (a long lease) would count every settled message after it
            out.append(GroupStats(group, topic, in_flight, backlog, backlog + in_flight,
                                  redelivered, dead))
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
