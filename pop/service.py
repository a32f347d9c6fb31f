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

Redelivery goes through the CommitLog, never by rewinding an offset (``pop.requeue``):
a revived or released entry gets a copy on the group's retry topic (or, past
``max_attempts``, its dead-letter topic), and the copy settles its entry across any crash
(``pop.settle``).  Pop takes from the retry topic and the topic itself in turn, so
neither starves the other.

Layers: ``pop.model`` (names, errors, records) <- ``pop.leasebook`` (lease state and its
persistence) <- ``pop.requeue`` (release, dead-letter, revive) <- this module (Pop, Ack,
ChangeInvisibleTime).  Thread-safe: a lock per (group, topic) orders that group's leases
and their writes (its retry topic shares the lock); different groups and topics work in
parallel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

from pop.checkpoint import (
    PopCheckpoint,
    checkpoint_key,
    encode_checkpoint,
    encode_offset,
    offset_key,
    pop_offset_key,
)
from pop.handle import ReceiptHandle
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
    Deadline,
    GroupStats,
    HandleSuperseded,
    PoppedMessage,
    PopStats,
    ReceiptHandleExpired,
    TagFilter,
    TierReader,
    by_origin,
    check_group,
    dlq_topic,
    origin_of,
    retry_topic,
)
from pop.requeue import Requeuer
from pop.settle import PROP_LEASE
from store.crashpoint import crashpoint
from store.errors import ChronomqError, DamagedRecord, InvalidArgument, StorageIOError
from store.message import Message, RecordError, decode_record
from store.names import check_readable
from tiered.errors import TierError

log = logging.getLogger(__name__)

__all__ = [  # the POP API, whichever module of the package defines it
    "DLQ_PREFIX", "MAX_GROUP_BYTES", "MAX_INVISIBLE_TIME_S", "PROP_DLQ_ATTEMPTS",
    "PROP_DLQ_GROUP", "PROP_DLQ_REASON", "PROP_ORIGIN_TOPIC", "RETRY_PREFIX", "AlreadyDone",
    "AlreadyRequeued", "GroupStats", "HandleSuperseded", "PopService", "PopStats",
    "PoppedMessage", "ReceiptHandleExpired", "TagFilter", "TierReader", "check_group",
    "dlq_topic", "origin_of", "retry_topic",
]


class _GoneLocally(Exception):
    """Local retention deleted records between the read of their ConsumeQueue entries and
    the read of the records (the queue's low mark moves right after)."""


class PopService(Requeuer):
    """Leases, acks, releases and revives for all groups.  Thread-safe."""

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
        deadlines: list[Deadline] = []
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
               deadlines: list[Deadline]) -> list[PoppedMessage]:
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

    def _read_rows(self, topic: str, qid: int, offset: int, want: int, local_low: int
                   ) -> tuple[list[tuple[int, int]], Callable[[list[int]], list[Message | None]]]:
        """Up to ``want`` queue entries from ``offset`` as (queue offset, tag hash) rows,
        and a loader of the picked rows' messages: from the tier below the read
        strategy's floor, else from the local store.  A failing tier falls back to local
        disk when it still has the data.  The loader gives None for a row with no
        message: a hole in the ConsumeQueue, or a damaged record (logged, counted by the
        store); the caller skips it, so it never blocks the queue."""
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

                def load_tiered(picked: list[int]) -> list[Message | None]:
                    return [_decode_or_none(records[i], topic, qid, tiered[i][0])
                            for i in picked]
                return [(qo, tag) for qo, tag, _, _ in tiered], load_tiered
        entries = self._store.consume_queue_entries(topic, qid, offset, want)

        def load_local(picked: list[int]) -> list[Message | None]:
            present = [i for i in picked if not entries[i].is_hole]
            locations = [(entries[i].commit_offset, entries[i].record_size) for i in present]
            try:
                loaded = self._store.read_messages_skipping(locations)
            except StorageIOError:
                if all(self._store.reader.on_disk(o) for o, _ in locations):
                    raise  # an I/O error, not retention
                raise _GoneLocally from None
            found: dict[int, Message] = {}
            for i, m in zip(present, loaded, strict=True):
                if isinstance(m, DamagedRecord):
                    log.error("skipping %s/%d queue offset %d: %s", topic, qid,
                              entries[i].queue_offset, m)
                elif (m.topic, m.queue_id, m.queue_offset) != (topic, qid,
                                                               entries[i].queue_offset):
                    log.error("skipping %s/%d queue offset %d: its entry points at the "
                              "record of %s/%d queue offset %d", topic, qid,
                              entries[i].queue_offset, m.topic, m.queue_id, m.queue_offset)
                else:
                    found[i] = m
            return [found.get(i) for i in picked]
        return [(e.queue_offset, e.tag_hash) for e in entries], load_local

    def _lease_queue(self, group: str, ltopic: str, origin: str, qid: int, want: int,
                     now: int, expire: int, tf: TagFilter, puts: list[tuple[bytes, bytes]],
                     deadlines: list[Deadline]) -> list[PoppedMessage]:
        leases = self._queue(group, ltopic, qid)
        low, local_low, high = self._bounds(ltopic, qid)
        if leases.pop_offset < low:  # retention removed what the group had not reached
            leases.pop_offset = leases.ack_offset = low
        elif leases.pop_offset > high:  # the queue's tail was lost (flush = "async" and
            # an OS crash): new messages take those queue offsets again; lease them
            log.warning("%s/%d ends at %d, below group %s's pop offset %d: the tail was "
                        "lost; leasing from %d", ltopic, qid, high, group,
                        leases.pop_offset, high)
            leases.pop_offset = high
            leases.ack_offset = min(leases.ack_offset, high)
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
        try:
            loaded = load(wanted)
        except _GoneLocally:  # nothing changed yet: the next Pop reads where they are now
            log.info("%s/%d: local retention deleted records this Pop was reading; "
                     "leasing nothing from the queue this time", ltopic, qid)
            return []
        encode = self._handles.encode
        for i, msg in zip(wanted, loaded, strict=True):
            if msg is None or not tf.accepts(msg.tag):  # no message there, or a tag-hash
                ck.mark(i)  # collision: done for this group
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
        for origin, items in by_origin(handles).items():
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


def _decode_or_none(record: bytes, topic: str, qid: int, queue_offset: int) -> Message | None:
    """A record read from the tier, or None (logged) if it fails its checks."""
    try:
        m = decode_record(record)
    except (RecordError, ValueError) as exc:
        log.error("skipping %s/%d queue offset %d: damaged record from the tier: %s", topic,
                  qid, queue_offset, exc)
        return None
    if (m.topic, m.queue_id, m.queue_offset) != (topic, qid, queue_offset):
        log.error("skipping %s/%d queue offset %d: the tier's entry points at the record of "
                  "%s/%d queue offset %d", topic, qid, queue_offset, m.topic, m.queue_id,
                  m.queue_offset)
        return None
    return m
