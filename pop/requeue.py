"""Requeue: leased messages go back for redelivery through the CommitLog, never by
rewinding an offset.

When a lease's deadline passes with entries not done (revive), or a consumer releases
a message (Nack), a copy of the message (same id, ``delivery_attempt`` + 1) is appended
to the group's retry topic ``%RETRY%<group>%<topic>`` (now, or through the timer after a
back-off), and only once that append is durable is the entry marked done.  After
``max_attempts`` deliveries the copy goes to the dead-letter topic
``%DLQ%<group>%<topic>`` instead.  Each copy names the entry it replaces and
``pop.settle.CopySettler`` settles the two across a crash: an entry is never revived
twice, so a group never gets a message again after acking its copy.

Deadlines wait on a timing wheel (``timer.wheel``, 10 ms ticks); one named thread
(``pop-revive``) fires them; tests call ``revive_due`` with a manual clock instead.

Memory: the wheel holds the deadlines of open leases only.  A lease's deadlines leave
it when the lease is done (acked, released, revived), not when they come due: before,
every Pop left one entry for its whole invisible time, so a group acking at once with
a 12-hour invisible time kept twelve hours of Pops in memory.  A deadline that
ChangeInvisibleTime moved stays until its old time (it fires and finds nothing to do).
Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from pop.leasebook import LeaseBook
from pop.model import (
    DLQ_PREFIX,
    MAX_INVISIBLE_TIME_S,
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_GROUP,
    PROP_DLQ_REASON,
    PROP_ORIGIN_TOPIC,
    REQUEUED_MEMORY,
    REVIVE_BATCH,
    REVIVE_TICK_MS,
    AlreadyRequeued,
    Deadline,
    Requeue,
    by_origin,
    dlq_topic,
    origin_of,
    placeholder,
    retry_topic,
)
from pop.policy import RetryPolicy
from pop.settle import PROP_LEASE, CopyKey, CopySettler, LeaseEntry, encode_lease
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import (
    ChronomqError,
    DamagedRecord,
    FailedPrecondition,
    InvalidArgument,
    StorageIOError,
)
from store.kv import KV
from store.message import (
    FLAG_DELAYED,
    FLAG_RETRY,
    Draft,
    Message,
    RecordError,
    decode_record,
    encode_properties,
)
from store.store import MessageStore
from store.topics import Topic
from timer.wheel import TimingWheel

log = logging.getLogger(__name__)


class Requeuer(LeaseBook):
    """Release, dead-letter and revive on top of the lease book.  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, secret: bytes, clock: Clock,
                 max_messages_cap: int = 32, policy: RetryPolicy | None = None,
                 group_policies: dict[str, RetryPolicy] | None = None) -> None:
        super().__init__(store, kv, secret, clock, max_messages_cap, policy, group_policies)
        self._wheel_cond = threading.Condition()
        self._wheel: TimingWheel[Deadline] = TimingWheel(REVIVE_TICK_MS, 64, 4,
                                                         clock.now_ms())
        self._ready: list[Deadline] = []  # already due when scheduled
        self._thread: threading.Thread | None = None
        self._stopping = False
        # the dispatch handler that settles retry/DLQ copies with their leases (the
        # broker registers it with the store)
        self.copies = CopySettler(kv, store, self._mark_found)
        self._schedule(self._recover())

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
        for origin, chosen in by_origin(handles).items():
            # the lock is held through the append: a concurrent ack of the same message
            # must not persist it as done before its copy is durable
            with self._group_lock(group, origin):
                todo: list[tuple[int, Requeue]] = []
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
                        todo.append((n, Requeue(group, h.topic, h.queue_id, ck.ck_start, i,
                                                 placeholder(), delay, reason)))
                if not todo:
                    continue
                try:
                    lost = self._read_into([r for _, r in todo])
                    for n, r in todo:
                        if r in lost:
                            results[n] = FailedPrecondition(
                                "the message is no longer stored (damaged or removed by "
                                "retention); its lease runs out and it is dropped")
                    todo = [(n, r) for n, r in todo if r not in lost]
                    copies = self._append_copies(origin, [r for _, r in todo], now) \
                        if todo else []
                except ChronomqError as exc:
                    for n, _ in todo:
                        results[n] = exc
                    continue
                self._mark_done([r for _, r in todo], self._released)
                self.copies.settled(copies)
        return results

    def _read_into(self, reqs: list[Requeue]) -> list[Requeue]:
        """Fill each request's message from its queue entry; returns the requests whose
        message is gone (a hole, a damaged record, or removed by retention), logged and
        left without one: they cannot be copied."""
        local: list[Requeue] = []
        locations = []
        lost: list[Requeue] = []
        tiered: list[Requeue] = []
        for r in reqs:
            qo = r.ck_start + r.index
            (entry,) = self._store.consume_queue_entries(r.topic, r.queue_id, qo, 1) or (None,)
            if entry is None or entry.queue_offset != qo:  # below the local queue (a read
                tiered.append(r)  # there starts at its oldest entry): retention took it
            elif entry.is_hole:
                log.error("cannot redeliver %s/%d queue offset %d: a hole", r.topic,
                          r.queue_id, qo)
                lost.append(r)
            else:
                local.append(r)
                locations.append((entry.commit_offset, entry.record_size))
        loaded: list[Message | DamagedRecord | None]
        try:
            loaded = list(self._store.read_messages_skipping(locations))
        except StorageIOError:  # retention deleted some meanwhile: read them one by one
            loaded = [self._read_local(o, n) for o, n in locations]
        for r, m in zip(local, loaded, strict=True):
            if m is None:
                tiered.append(r)
            elif isinstance(m, DamagedRecord):
                log.error("cannot redeliver %s/%d queue offset %d: %s", r.topic, r.queue_id,
                          r.ck_start + r.index, m)
                lost.append(r)
            else:
                self._take(r, m, lost)
        for r in tiered:
            qo = r.ck_start + r.index
            got = [] if self.tier is None else self.tier.read(r.topic, r.queue_id, qo, 1)
            try:
                if not got or got[0][0] != qo:
                    raise FailedPrecondition("no longer stored (removed by retention)")
                self._take(r, decode_record(got[0][3]), lost)
            except (ChronomqError, RecordError, ValueError) as exc:
                log.error("cannot redeliver %s/%d queue offset %d: %s", r.topic, r.queue_id,
                          qo, exc)
                lost.append(r)
        return lost

    def _read_local(self, offset: int, size: int) -> Message | DamagedRecord | None:
        """One record from local disk; None when retention deleted it."""
        try:
            return self._store.read_messages_skipping([(offset, size)])[0]
        except StorageIOError:
            if self._store.reader.on_disk(offset):
                raise
            return None

    @staticmethod
    def _take(r: Requeue, m: Message, lost: list[Requeue]) -> None:
        """``m`` becomes ``r``'s message if it is the record of ``r``'s queue entry."""
        qo = r.ck_start + r.index
        if (m.topic, m.queue_id, m.queue_offset) == (r.topic, r.queue_id, qo):
            r.message = m
        else:
            log.error("cannot redeliver %s/%d queue offset %d: its entry points at the "
                      "record of %s/%d queue offset %d", r.topic, r.queue_id, qo, m.topic,
                      m.queue_id, m.queue_offset)
            lost.append(r)

    def _append_copies(self, origin: str, reqs: list[Requeue], now: int) -> list[CopyKey]:
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
            self._store.create_topic(Topic(name, 1), system=True)

    def _mark_done(self, reqs: list[Requeue], counter: Counter[tuple[str, str]]) -> None:
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
                self._mark_done([Requeue(e.group, e.topic, e.queue_id, ck.ck_start,
                                          e.queue_offset - ck.ck_start, placeholder(), 0,
                                          reason)], self._revived)
            log.info("the %s copy of %s/%s/%d at %d was in the CommitLog: lease entry done",
                     copy_topic, e.group, e.topic, e.queue_id, e.queue_offset)

    def _forget_deadlines(self, deadlines: list[Deadline]) -> None:
        with self._wheel_cond:
            for d in deadlines:
                self._wheel.remove(d)

    @property
    def pending_deadlines(self) -> int:
        """Lease deadlines waiting on the revive wheel (statistics, tests)."""
        with self._wheel_cond:
            return len(self._wheel) + len(self._ready)

    def _schedule(self, deadlines: list[Deadline], at_ms: int | None = None) -> None:
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
        by_origin: dict[tuple[str, str], list[Requeue]] = {}
        keys: dict[tuple[str, str], list[Deadline]] = {}
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
                    Requeue(group, topic, qid, start, i, placeholder(), 0, None)
                    for i in ck.open_at(expire))
        revived = 0
        for (group, origin), reqs in by_origin.items():
            # handles of these entries are expired: nothing else touches them meanwhile
            try:
                lost = self._read_into(reqs)
                if lost:  # nothing to copy: done, or the lease would revive forever
                    with self._group_lock(group, origin):
                        self._mark_done(lost, self._revived)
                    reqs = [r for r in reqs if r not in lost]
                copies = self._append_copies(origin, reqs, now) if reqs else []
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
