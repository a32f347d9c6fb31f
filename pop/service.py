"""PopService: lease messages to a consumer group, acknowledge, release, revive them.

Every group sees every message of a topic; within a group one consumer at a time holds a
message.  A Pop writes its PopCheckpoints and pop offset durably before any message
leaves, and schedules each lease's deadline; Acks, leases and new deadlines answer OK
once group-committed.  Pop takes from the group's retry topic and the topic in turn, so
neither starves the other (docs/DESIGN.md, "Pop, Ack and redelivery").

The facade the broker and the servicers use; it composes the lease book
(``pop.leasebook``: positions, leases, receipt handles, their writes, figures), the
leaser (``pop.leasing``: what a Pop reads and leases, in which order), the revive
schedule (``pop.schedule``), the requeuer (``pop.requeue``: release, dead-letter, revive
through the CommitLog, settled across crashes by ``pop.settle``), the queue source
(``pop.source``: local disk, tier, mounted tier) and per-key flow control
(``pop.flowcontrol``).

Thread-safe: the book's lock per (group, topic) orders that group's leases (its retry
topic shares it); different groups and topics work in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from concurrent.futures import Future
from typing import Any

from pop.checkpoint import STATE_PREFIX
from pop.flowcontrol import FlowControl, KeyLimits
from pop.handle import ReceiptHandle
from pop.leasebook import LeaseBook
from pop.leasejournal import Snapshots
from pop.leasing import QueueLeaser
from pop.model import (
    DLQ_PREFIX,
    MAX_GROUP_BYTES,
    MAX_INVISIBLE_TIME_S,
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_GROUP,
    PROP_DLQ_REASON,
    PROP_ORIGIN_TOPIC,
    RETRY_PREFIX,
    AlreadyDone,
    AlreadyRequeued,
    GroupStats,
    HandleSuperseded,
    MountedBounds,
    PoppedMessage,
    PopStats,
    ReceiptHandleExpired,
    TagFilter,
    TierReader,
    check_group,
    dlq_topic,
    origin_of,
    retry_topic,
)
from pop.policy import RetryPolicy
from pop.requeue import Requeuer
from pop.schedule import ReviveSchedule
from pop.settle import LeaseEntry
from pop.source import QueueSource
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import ChronomqError, InvalidArgument
from store.journal import StateJournal
from store.kv import KV
from store.names import check_readable
from store.store import MessageStore

__all__ = [  # the POP API, whichever module of the package defines it
    "DLQ_PREFIX", "MAX_GROUP_BYTES", "MAX_INVISIBLE_TIME_S", "PROP_DLQ_ATTEMPTS",
    "PROP_DLQ_GROUP", "PROP_DLQ_REASON", "PROP_ORIGIN_TOPIC", "RETRY_PREFIX", "AlreadyDone",
    "AlreadyRequeued", "GroupStats", "HandleSuperseded", "PopService", "PopStats",
    "PoppedMessage", "ReceiptHandleExpired", "TagFilter", "TierReader", "check_group",
    "dlq_topic", "origin_of", "retry_topic",
]


class PopService:
    """Leases, acks, releases and revives for all groups.  Thread-safe."""

    def __init__(self, store: MessageStore, kv: KV, secret: bytes, clock: Clock,
                 max_messages_cap: int = 32, policy: RetryPolicy | None = None,
                 group_policies: dict[str, RetryPolicy] | None = None,
                 key_limits: dict[str, KeyLimits] | None = None) -> None:
        self._store = store
        self._clock = clock
        self.max_messages_cap = max_messages_cap
        self._source = QueueSource(store)
        self._book = LeaseBook(store, kv, secret, clock, self._source)
        self.flow = FlowControl(key_limits or {}, clock)
        self._book.on_done = self.flow.done
        self._leaser = QueueLeaser(self._book, self._source, self.flow)
        self._schedule = ReviveSchedule(clock)
        self._requeuer = Requeuer(store, kv, clock, self._book, self._source,
                                  self._schedule, policy, group_policies)
        self._schedule.add(self._book.deadlines())
        # the dispatch handler that settles retry/DLQ copies with their leases (the
        # broker registers it with the store)
        self.copies = self._requeuer.copies

    # ---------------------------------------------------------------- delegated

    def set_journal(self, journal: StateJournal) -> list[Future[Any]]:
        """Journal every change of the lease book (``store.journal``); returns the
        futures of the snapshot written first (``pop.leasejournal``)."""
        return self._book.journal.attach(journal)

    def journal_snapshots(self, journal: StateJournal, every: int,
                          tier_position: Callable[[], int],
                          publish: Callable[[str, bytes], None], broker: str,
                          every_s: float = 0.0,
                          monotonic_ms: Callable[[], float] | None = None) -> Snapshots:
        """Snapshots of the lease book in the journal, pointed at in the tier."""
        return Snapshots(self._book.journal, journal, every, tier_position, publish,
                         broker, every_s, monotonic_ms)

    def adopt(self, items: dict[bytes, bytes], state: list[tuple[bytes, bytes]] | None = None
              ) -> set[str]:
        """Take a departed broker's positions and leases (``LeaseBook.adopt``; ``state``:
        keys of ``write_state`` written with them) and schedule the leases' deadlines;
        returns the groups taken."""
        deadlines, groups = self._book.adopt(items, state)
        self._schedule.add(deadlines)
        return groups

    def leased_to(self, group: str, topic: str, qid: int) -> int:
        """The first queue offset ``group`` never leased there (``LeaseBook.leased_to``)."""
        return self._book.leased_to(group, topic, qid)

    def oldest_open_ms(self, group: str, topic: str) -> int | None:
        """When ``group`` took its oldest open lease of ``topic``'s messages (the topic's
        or its retry topic's; None: none open)."""
        return self._book.oldest_open_ms(group, (topic, retry_topic(group, topic)))

    def settle_copies(self, found: list[tuple[str, LeaseEntry]]) -> None:
        """Mark done the adopted lease entries that a departed broker had replaced with
        a copy (``(copy topic, entry)``) before its mark reached the tier: the copy comes
        here, the entry must not be revived again (``cluster.adoption``)."""
        self._requeuer.mark_found(found)

    def adopt_secret(self, secret: bytes, shift_ms: int = 0) -> None:
        """Accept the receipt handles a departed broker signed with ``secret`` for the
        leases ``adopt`` took from it: Ack, Nack, ChangeInvisibleTime and DeadLetter of
        them work here (``Receipts.adopt_secret``; their deadlines ``shift_ms`` on, as
        the leases' moved: ``pop.leaseclock``)."""
        self._book.receipts.adopt_secret(secret, shift_ms)

    def write_state(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes],
                    wait: bool = True) -> None:
        """Write other broker state (keys starting with ``STATE_PREFIX``) into the POP
        RocksDB through the lease journal, and (``wait``) return once durable (with
        durable-ack: in the tier), then the fencing check: it is journaled, snapshotted
        and replayed by a takeover with the groups' state."""
        assert all(k.startswith(STATE_PREFIX) for k, _ in puts) and \
            all(k.startswith(STATE_PREFIX) for k in deletes)
        ticket = self._book.write(puts, deletes)
        if wait:
            self._book.wait(ticket)

    def state_items(self, prefix: bytes = STATE_PREFIX) -> list[tuple[bytes, bytes]]:
        """The other broker state (``write_state``) this broker holds, of keys starting
        with ``prefix``."""
        assert prefix.startswith(STATE_PREFIX)
        return list(self._book.kv_scan(prefix))

    def start(self) -> None:
        """Start the revive thread (``pop-revive``)."""
        self._requeuer.start()

    def stop(self) -> None:
        self._requeuer.stop()
        self.flow.stop()

    def policy(self, group: str) -> RetryPolicy:
        """The retry policy of ``group``."""
        return self._requeuer.policy(group)

    def release_many(self, group: str, items: list[tuple[str, int | None]]
                     ) -> list[ChronomqError | None]:
        """Nack (``pop.requeue.Requeuer.release_many``)."""
        out = self._requeuer.release_many(group, items)
        self._settled()
        return out

    def _settled(self) -> None:
        """Before a Nack or DeadLetter answers: with durable-ack, its copies and marks
        in the tier (the latest write's record covers them); the fencing check."""
        if self._book.journal.durable_ack:
            self._book.wait(self._book.journal.last_ticket)
        self._book.journal.check()

    def dead_letter_many(self, group: str, items: list[tuple[str, str]]
                         ) -> list[ChronomqError | None]:
        """To the dead-letter topic now (``pop.requeue.Requeuer.dead_letter_many``)."""
        out = self._requeuer.dead_letter_many(group, items)
        self._settled()
        return out

    def revive_due(self, now_ms: int | None = None) -> int:
        """Revive what is due by ``now_ms`` (``pop.requeue.Requeuer.revive_due``)."""
        return self._requeuer.revive_due(now_ms)

    def statistics(self) -> PopStats:
        return self._book.statistics()

    def group_pairs(self) -> list[tuple[str, str]]:
        """Every (group, topic) that has leased since it was created, sorted."""
        return self._book.group_pairs()

    def group_statistics(self, pairs: list[tuple[str, str]] | None = None) -> list[GroupStats]:
        """Per (group, topic) of ``pairs`` (default: ``group_pairs()``)."""
        return self._book.group_statistics(pairs)

    @property
    def tier(self) -> TierReader | None:
        """Set: Pop and redelivery read what local retention deleted from the tier."""
        return self._source.tier

    @tier.setter
    def tier(self, reader: TierReader | None) -> None:
        self._source.tier = reader

    @property
    def mounts(self) -> MountedBounds | None:
        """Set: the queues of tiers mounted read-only."""
        return self._source.mounts

    @mounts.setter
    def mounts(self, mounts: MountedBounds | None) -> None:
        self._source.mounts = mounts

    @property
    def pending_deadlines(self) -> int:
        """Lease deadlines waiting on the revive schedule (statistics, tests)."""
        return len(self._schedule)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's leases and offsets of a deleted topic (memory and RocksDB)
        and the groups' retry topics."""
        self.forget_topics({topic})

    def forget_topics(self, topics: set[str]) -> None:
        """``forget_topic`` of each of ``topics``, the book read once (a start finishing
        the deletions a crash cut short: ``cluster.topics``)."""
        self._book.forget_topics(topics)
        for t in self._store.topics.list():
            if t.name.startswith(RETRY_PREFIX) and origin_of(t.name) in topics:
                self._store.delete_topic(t.name, system=True)

    def validate(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
                 cap: int | None = None) -> None:
        check_readable(topic)
        check_group(group)
        self._store.require_topic(topic)
        limit = cap or self.max_messages_cap
        if not 1 <= max_messages <= limit:
            raise InvalidArgument(f"max_messages must be between 1 and {limit}")
        if not 1 <= invisible_time_s <= MAX_INVISIBLE_TIME_S:
            raise InvalidArgument(
                f"invisible_time_s must be between 1 and {MAX_INVISIBLE_TIME_S} (12 h)")

    def pop(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
            tag_filter: TagFilter | None = None, cap: int | None = None) -> list[PoppedMessage]:
        """Lease up to ``max_messages`` visible messages for ``invisible_time_s``.  Every
        message whose Send was acknowledged before this call began is visible to it.
        ``cap`` raises the per-call limit (the Subscribe stream leases in larger batches)."""
        messages, ticket = self.pop_applied(topic, group, max_messages, invisible_time_s,
                                            tag_filter, cap)
        self.wait_popped(ticket)  # durable before the messages leave the broker
        return messages

    def wait_popped(self, ticket: int) -> None:
        """Return once the leases of ``ticket`` (``pop_applied``) are durable, then the
        fencing check; raises when they are not (the messages must not leave)."""
        if ticket:
            self._book.wait(ticket)
            crashpoint("pop.after_checkpoint")

    def pop_applied(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
                    tag_filter: TagFilter | None = None, cap: int | None = None
                    ) -> tuple[list[PoppedMessage], int]:
        """``pop`` without the wait: the messages and the ticket their leases' write must
        reach (``wait_popped``) before any of them leaves the broker."""
        self.validate(topic, group, max_messages, invisible_time_s, cap)
        tf = tag_filter or TagFilter(None)
        queue_count = self._store.require_topic(topic).queue_count
        rtopic = retry_topic(group, topic)
        retry = self._store.topics.get(rtopic)
        now = self._clock.now_ms()
        expire = now + invisible_time_s * 1000
        self._store.wait_visible()
        with self._book.lock(group, topic):
            out = self._leaser.lease(group, topic, rtopic, retry is not None, queue_count,
                                     max_messages, now, expire, tf)
            ticket = self._book.write(out.puts)
        self._schedule.add(out.deadlines)
        self._book.counts.popped(len(out.messages))
        return out.messages, ticket

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
        outcomes, ticket = self.ack_applied(group, receipt_handles, issued)
        self.wait_acked(ticket)  # an OK ack is final: durable before the answer
        return outcomes

    def ack_applied(self, group: str, receipt_handles: list[str],
                    issued: Container[str] = ()) -> tuple[list[ChronomqError | None], int]:
        """``ack_many`` without the wait: the outcomes, valid once ``wait_acked`` returned
        for the ticket (then the acks are durable: one fsync, or tier commit, for many)."""
        handles, results = self._book.receipts.decode_all(group, receipt_handles, issued)
        acked = self._book.ack(group, handles)
        self._schedule.remove(acked.retired)
        return [r or e for r, e in zip(results, acked.errors, strict=True)], acked.ticket

    def wait_acked(self, ticket: int) -> None:
        """Return once the acks of ``ticket`` (``ack_applied``) are durable, then the
        fencing check; raises when they are not."""
        if ticket:
            self._book.wait(ticket)
            crashpoint("pop.after_ack")

    def renewable(self, group: str, got: list[PoppedMessage]) -> list[PoppedMessage]:
        """``got``, just popped for ``group``, with renewable handles (``pop.handle``):
        each settles its entry at whatever deadline the entry has then, so renewing the
        lease (``change_invisible_time``) does not supersede it, here or at a broker
        that takes this one over."""
        receipts = self._book.receipts
        return [p._replace(receipt_handle=receipts.encode(group, receipts.decode(
                    group, p.receipt_handle, 0, verify=False)._replace(renewable=True)))
                for p in got]

    def handle_topic(self, group: str, receipt_handle: str) -> str | None:
        """The topic a receipt handle of ``group`` was signed for (``Receipts.topic_of``)."""
        return self._book.receipts.topic_of(group, receipt_handle)

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
        h = self._book.receipts.decode(group, receipt_handle, now)
        expire = now + invisible_time_s * 1000
        self._book.wait(self._book.change_invisible_time(group, h, expire))
        crashpoint("pop.after_change_invisible")
        self._schedule.add([(group, h.topic, h.queue_id, h.ck_start, expire)])
        return self._book.receipts.encode(group, ReceiptHandle(
            h.topic, h.queue_id, h.ck_start, h.queue_offset, expire, h.attempt))
