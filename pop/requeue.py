"""Requeuer: leased messages go back for redelivery through the CommitLog, never by
rewinding an offset.

When a lease's deadline passes with entries not done (revive), or a consumer releases
a message (Nack), a copy of the message (same id, ``delivery_attempt`` + 1) is appended
to the group's retry topic ``%RETRY%<group>%<topic>`` (now, or through the timer after a
back-off), and only once that append is durable is the entry marked done in the lease
book (``pop.leasebook``).  After ``max_attempts`` deliveries the copy goes to the
dead-letter topic ``%DLQ%<group>%<topic>`` instead.  Each copy names the entry it
replaces and ``pop.settle.CopySettler`` (``copies``) settles the two across a crash: an
entry is never revived twice, so a group never gets a message again after acking its
copy.

A lease whose queue this broker does not serve (``QueueSource.serves``) waits: a
takeover adopts the departed broker's leases before it serves their queues, and a lease
that came due in between must revive once they are served, not be given up as gone.
Only a message of a queue served here that cannot be read is dropped (logged).

Deadlines wait on the revive schedule (``pop.schedule``); one named thread
(``pop-revive``) fires them; tests call ``revive_due`` with a manual clock instead.
Every lease this class closes has its deadlines taken off the schedule.

Collaborators, given at construction: the lease book (state, locks, marks), the queue
source (reads the messages to copy), the schedule, and the store (appends the copies).
Thread-safe: the book's per-group lock is held from the check of a released handle
through its copy's append to its mark (a concurrent ack of the same message must not
persist it as done before its copy is durable).
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Literal

from pop.leasebook import LeaseBook
from pop.model import (
    DLQ_PREFIX,
    MAX_INVISIBLE_TIME_S,
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_GROUP,
    PROP_DLQ_REASON,
    PROP_ORIGIN_TOPIC,
    REVIVE_BATCH,
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
from pop.schedule import ReviveSchedule
from pop.settle import PROP_LEASE, CopyKey, CopySettler, LeaseEntry, encode_lease
from pop.source import QueueSource
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import ChronomqError, FailedPrecondition, InvalidArgument, Unavailable
from store.kv import KV
from store.message import FLAG_DELAYED, FLAG_RETRY, Draft, encode_properties
from store.store import MessageStore
from store.topics import Topic

log = logging.getLogger(__name__)

RETRY_DELAY_MS = 1_000  # a revive that failed, or waits for its queue, fires again after


class Requeuer:
    """Release, dead-letter and revive of leased messages.  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, clock: Clock, book: LeaseBook,
                 source: QueueSource, schedule: ReviveSchedule,
                 policy: RetryPolicy | None = None,
                 group_policies: dict[str, RetryPolicy] | None = None) -> None:
        self._store = store
        self._clock = clock
        self._book = book
        self._source = source
        self._schedule = schedule
        self.default_policy = policy or RetryPolicy()
        self._policies = dict(group_policies or {})
        self._rnd = random.Random()
        self._thread: threading.Thread | None = None
        # the dispatch handler that settles retry/DLQ copies with their leases (the
        # broker registers it with the store)
        self.copies = CopySettler(kv, store, self.mark_found)

    def policy(self, group: str) -> RetryPolicy:
        return self._policies.get(group, self.default_policy)

    # ---------------------------------------------------------------- release

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
        handles, results = self._book.receipts.decode_all(group, [t for t, _, _ in items])
        now = self._clock.now_ms()
        for origin, chosen in by_origin(handles).items():
            with self._book.lock(group, origin):  # held through the append (docstring)
                todo: list[tuple[int, Requeue]] = []
                for n, h in chosen:
                    try:
                        ck, i = self._book.lease_of(group, h)
                    except AlreadyRequeued:
                        continue  # released before: releasing again is a no-op
                    except ChronomqError as exc:
                        results[n] = exc
                        continue
                    if ck is not None and not self._source.serves(h.topic, h.queue_id):
                        results[n] = Unavailable(
                            "the message's queue is not served here yet (a takeover under "
                            "way?); its lease runs out and it comes back then")
                    elif ck is not None:
                        _, delay, reason = items[n]
                        todo.append((n, Requeue(group, h.topic, h.queue_id, ck.ck_start, i,
                                                 placeholder(), delay, reason)))
                if not todo:
                    continue
                try:
                    lost = self._source.fill([r for _, r in todo])
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
                self._mark_done([r for _, r in todo], "released")
                self.copies.settled(copies)
        return results

    # ---------------------------------------------------------------- revive

    @property
    def pending_deadlines(self) -> int:
        """Lease deadlines waiting on the revive schedule (statistics, tests)."""
        return len(self._schedule)

    def revive_due(self, now_ms: int | None = None) -> int:
        """Revive the entries whose deadline passed by ``now_ms``: each gets a copy on the
        retry topic (or the dead-letter topic past max attempts), visible at once.
        Returns how many entries were revived."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        fired = self._schedule.take_due(now, REVIVE_BATCH)
        due: dict[tuple[str, str], list[Requeue]] = {}
        keys: dict[tuple[str, str], list[Deadline]] = {}
        for deadline in fired:
            group, topic, qid, start, _ = deadline
            origin = origin_of(topic)
            keys.setdefault((group, origin), []).append(deadline)
            entries = self._book.entries_due(deadline)
            if entries:
                due.setdefault((group, origin), []).extend(
                    Requeue(group, topic, qid, start, i, placeholder(), 0, None)
                    for i in entries)
        revived = 0
        for (group, origin), reqs in due.items():
            here = [self._source.serves(r.topic, r.queue_id) for r in reqs]
            if not all(here):  # not gone: not here yet (docstring)
                self._retry_later(keys[(group, origin)],
                                  [r for r, h in zip(reqs, here, strict=True) if not h], now)
                reqs = [r for r, h in zip(reqs, here, strict=True) if h]
                if not reqs:
                    continue
            # handles of these entries are expired: nothing else settles them meanwhile (a
            # request that checked one before the deadline is refused under the lock:
            # ``LeaseBook.lease_of``)
            try:
                lost = self._source.fill(reqs)
                if lost:  # nothing to copy: done, or the lease would revive forever
                    with self._book.lock(group, origin):
                        self._mark_done(lost, "revived")
                    reqs = [r for r in reqs if r not in lost]
                copies = self._append_copies(origin, reqs, now) if reqs else []
            except ChronomqError as exc:
                log.warning("revive of %d messages of %s/%s failed, retrying in %d ms: %s",
                            len(reqs), group, origin, RETRY_DELAY_MS, exc)
                self._schedule.add(keys[(group, origin)], at_ms=now + RETRY_DELAY_MS)
                continue
            with self._book.lock(group, origin):
                self._mark_done(reqs, "revived")
            self.copies.settled(copies)
            revived += len(reqs)
        return revived

    def _retry_later(self, fired: list[Deadline], waiting: list[Requeue], now: int) -> None:
        """Fire again later the deadlines of leases whose queue this broker does not
        serve yet; their entries stay open."""
        leases = {(r.topic, r.queue_id, r.ck_start) for r in waiting}
        self._schedule.add([d for d in fired if d[1:4] in leases], at_ms=now + RETRY_DELAY_MS)
        r = waiting[0]
        log.warning("%d leased messages of %s/%s wait for their queue, not served here yet "
                    "(a takeover under way?); retrying in %d ms", len(waiting), r.group,
                    r.topic, RETRY_DELAY_MS)

    def start(self) -> None:
        self._schedule.open()
        self._thread = threading.Thread(target=self._run, name="pop-revive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._schedule.close()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while self._schedule.wait_due():
            try:
                if not self._book.journal.may_change():  # fenced (cluster.lease): a broker taking
                    self._schedule.pause(1.0)  # over may revive these leases
                    continue
                self.revive_due()
            except Exception:  # keep reviving; the failure is logged with its cause
                log.exception("revive failed")
                self._schedule.pause(1.0)

    # ---------------------------------------------------------------- copies

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

    def _mark_done(self, reqs: list[Requeue], outcome: Literal["released", "revived"]
                   ) -> None:
        """Mark requeued entries done in the book (caller holds the group lock); their
        leases' deadlines leave the schedule."""
        self._schedule.remove(self._book.mark_requeued(reqs, outcome))
        crashpoint("pop.after_mark_done")

    def mark_found(self, found: list[tuple[str, LeaseEntry]]) -> None:
        """Mark done the entries whose copies were found (``pop.settle``: the CommitLog
        holds them, a crash fell between a copy's append and its entry's mark; or a
        departed broker's, ``cluster.adoption``); those done already are left."""
        for copy_topic, e in found:
            with self._book.lock(e.group, origin_of(e.topic)):
                at = self._book.entry_at(e.group, e.topic, e.queue_id, e.queue_offset)
                if at is None:
                    continue
                reason = "recovered" if copy_topic.startswith(DLQ_PREFIX) else None
                self._mark_done([Requeue(e.group, e.topic, e.queue_id, at[0], at[1],
                                          placeholder(), 0, reason)], "revived")
            log.info("the %s copy of %s/%s/%d at %d was found: lease entry done",
                     copy_topic, e.group, e.topic, e.queue_id, e.queue_offset)
