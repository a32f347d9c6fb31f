"""MessageStore: the local store as one object: CommitLog + ConsumeQueues + key index +
topic catalogue + retention.  What each append writes (queue, queue offset, id, record
bytes) is ``store.append``'s, on the CommitLog writer thread.

Data directory layout::

    <data_dir>/commitlog/      CommitLog segments and checkpoint (store.commitlog), and
                               the message-id floor (store.idfloor)
    <data_dir>/consumequeue/   one folder per topic/queue (store.consumequeue)
    <data_dir>/checkpoint/     dispatcher checkpoints
    <data_dir>/index/          RocksDB key/message-id index (store.index)
    <data_dir>/topics.log      topic catalogue (store.topics, store.topiclog)

Start-up order: size the open-file budget (``store.openfiles``: fail now if RLIMIT_NOFILE
is too low) -> recover the CommitLog (truncate a torn tail, skip damaged records) -> if it
lost anything a dispatcher may have seen (``store.tailcheck``), turn ConsumeQueue
entries past its end into holes (queue offsets are never given out twice) -> rewind every
reader of the log (dispatch handlers, ``add_log_reader``s) that is past the end or inside
a record, durably -> replay the CommitLog into every dispatcher from its checkpoint ->
accept writes.  No other step reads every queue: a queue is loaded on first use, and its
low mark (local retention) and next queue offset are taken then (``store.queues``).

A damaged record (``DamagedRecord``) costs that record only: reads raise it for that
record (``read_messages_skipping`` returns it in its place), the dispatchers skip it, and
``statistics().damaged_records`` counts every distinct one.

Thread-safe.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from store.append import AppendMessageCallback
from store.checkpoint import OffsetCheckpoint
from store.clock import Clock
from store.commitlog import CommitLog, CommitLogStats
from store.consumequeue import CqEntry
from store.disk import unless_full
from store.dispatcher import Dispatcher, DispatchHandler, LogReader
from store.errors import DamagedRecord, FailedPrecondition, TopicNotFound
from store.holds import TopicHolds
from store.idfloor import IdFloor
from store.index import KeyIndex
from store.lookup import DelayedWitness, RecordLookup
from store.message import (
    DispatchInfo,
    Draft,
    Message,
    MessageIdFormat,
    draft_of,
    validate_message_fields,
    validate_times,
)
from store.names import check_broker_made, check_name
from store.openfiles import plan_open_files
from store.queues import ConsumeQueueTable, NextOffsets
from store.reader import RecordReader
from store.tailcheck import TailCheck
from store.topics import Topic, TopicCatalogue, TopicChanges

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    data_dir: str
    segment_bytes: int = 1 << 30
    flush: str = "sync"  # "sync": fsync before Send returns; "async": fsync every interval
    flush_interval_ms: int = 200
    queue_flush_interval_ms: int = 1000  # ConsumeQueues and key index made durable, and
    #                                      their checkpoint written, this often
    max_body_bytes: int = 4 << 20
    cq_entries_per_file: int = 300_000
    auto_create_topics: bool = False
    default_queue_count: int = 4
    retention_ms: int = 72 * 3600 * 1000
    retention_bytes: int = 0  # 0: no size limit
    node_id: int = 0
    max_open_files: int = 0  # ConsumeQueue file descriptors kept open (LRU); 0: derived
    #                          from RLIMIT_NOFILE (store.openfiles)
    dedupe_window_ms: int = 24 * 3600 * 1000  # a client-chosen id sent again (same topic) within
    #                                           this is dropped (0: never)
    disk_max_used_ratio: float = 0.90  # client sends are refused at or above this use of
    #                                    the data volume (store.disk)
    disk_clean_ratio: float = 0.80  # retention runs at once at or above this use
    disk_reserve_bytes: int = 64 << 20  # emergency room kept in <data_dir>/disk-reserve


@dataclass(frozen=True, slots=True)
class StoreStats:
    commitlog: CommitLogStats
    topics: int
    queues: int
    dispatched_offset: int
    messages_appended: int
    damaged_records: int  # distinct damaged CommitLog records seen (recovery, dispatch, reads)
    cq_files_open: int  # ConsumeQueue descriptors open now (at most store.max_open_files)


class MessageStore:
    """The local durable store.  Thread-safe."""

    def __init__(self, config: StoreConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        os.makedirs(config.data_dir, exist_ok=True)
        self._log_dir = log_dir = os.path.join(config.data_dir, "commitlog")
        self.open_files = plan_open_files(config.max_open_files, log_dir)
        self.topics = TopicCatalogue(config.data_dir)
        self.holds = TopicHolds()  # topics a takeover is still adopting (store.holds)
        self.commitlog = CommitLog(log_dir, clock, config.segment_bytes,
                                   config.flush == "sync", config.flush_interval_ms)
        self.queues = ConsumeQueueTable(config.data_dir, self.topics, config.cq_entries_per_file,
                                        self.open_files.cq_files, clock.now_ms)
        self.index = KeyIndex(os.path.join(config.data_dir, "index"))
        self._extra_handlers: list[DispatchHandler] = []
        self._log_readers: list[LogReader] = []
        self._retention_guards: list[Callable[[], int]] = []
        self.dispatcher: Dispatcher | None = None
        self.ids = MessageIdFormat(config.node_id)
        self._id_floor = IdFloor(os.path.join(log_dir, "id-floor"))  # ids never repeat
        self._next_queue_offset = NextOffsets(self.queues)
        # queues, queue offsets, ids and bytes of each batch, on the writer thread
        self._append = AppendMessageCallback(self.topics, self.ids, self._id_floor,
                                             self._next_queue_offset, clock)
        self._topic_changes = TopicChanges()
        self._stopped = False
        self._create_topic: Callable[[Topic], object] = self.create_topic
        # no record is bigger than its body and 1 MiB (properties, strings)
        self.reader = RecordReader(self.commitlog, config.max_body_bytes + (1 << 20))
        self.lookup = RecordLookup(self.commitlog, self.reader, self.index, self.queues,
                                   self.topics, self.ids, self._dispatched_offset,
                                   self.wait_visible)

    # ------------------------------------------------------------------ life cycle

    def add_dispatch_handler(self, handler: DispatchHandler) -> None:
        """Register another view of the CommitLog (timer, tier); call before ``open``."""
        self._extra_handlers.append(handler)

    def add_retention_guard(self, position: Callable[[], int]) -> None:
        """Local retention never deletes CommitLog data at or past ``position()`` (a
        reader that follows the log on its own, like the tiered dispatcher)."""
        self._retention_guards.append(position)

    def add_log_reader(self, reader: LogReader) -> None:
        """Register a reader that follows the CommitLog on its own (the tiered dispatcher):
        ``open`` rewinds it with the dispatch handlers after a torn tail (at once when the
        store is open already), and local retention keeps what it has not passed.  Call
        before ``start``."""
        self._log_readers.append(reader)
        self._retention_guards.append(reader.position)
        if self.dispatcher is not None:
            self._rewind(reader)

    def open(self) -> None:
        end_before, fsynced = _log_end_on_disk(self._log_dir), self._fsynced_end()
        end = self.commitlog.open()
        check = TailCheck(os.path.join(self.config.data_dir, "checkpoint"))
        why = check.reason(end, end_before, fsynced, self.queues.position(),
                           self.config.flush == "sync")
        if why:
            log.info("checking every consume queue for entries past the log end: %s", why)
            with check.walking(end):
                cleared = self.queues.clear_beyond(end)
            if cleared:
                log.warning("%d consume-queue entries pointed past the recovered log end %d: "
                            "now holes, so their queue offsets are not given out again",
                            cleared, end)
        check.done()
        handlers: list[DispatchHandler] = [self.queues, self.index, *self._extra_handlers]
        for reader in (*handlers, *self._log_readers):
            self._rewind(reader)
        self.dispatcher = Dispatcher("dispatcher", self.commitlog, handlers, self.clock,
                                     self.config.queue_flush_interval_ms)
        self.commitlog.add_listener(self._on_appended)
        self.commitlog.add_rollback(self._append.give_back)
        replayed_from = self.dispatcher.dispatched_offset
        self.dispatcher.catch_up()
        log.info("store open: commitlog end %d, replayed %d bytes", end, end - replayed_from)
        self.queues.expire(self.commitlog.min_offset)  # applied to each queue as it loads
        self._next_queue_offset.clear()  # taken from each queue's end on first use

    def _fsynced_end(self) -> int | None:
        """What the CommitLog's checkpoint says was fsynced, read before recovery."""
        return OffsetCheckpoint(os.path.join(self._log_dir, "checkpoint")).read()

    def _rewind(self, reader: LogReader) -> None:
        """Move ``reader`` back to a record boundary at or before the recovered end."""
        position = reader.position()
        safe = self.commitlog.record_boundary(position)
        if safe == position:
            return
        if position < self.commitlog.confirmed_offset:
            log.warning("%s: position %d is inside a record; resuming at %d", reader.name,
                        position, safe)
        else:
            log.warning("%s: position %d is past the recovered log end; rewinding to %d",
                        reader.name, position, safe)
        reader.rewind(safe)

    def start(self) -> None:
        assert self.dispatcher is not None, "open() first"
        self.commitlog.start()
        self.dispatcher.start()

    def close(self) -> None:
        """Release what the store holds without writing anything: for a store whose
        ``open`` did not complete (no thread started, no position to save).  An opened
        store is closed by ``stop``."""
        if self._stopped:
            return
        self._stopped = True
        self.commitlog.close()
        self.queues.close()
        self.index.close()
        self.topics.close()

    def stop(self) -> None:
        """Flush and close everything; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.commitlog.stop()
        self._id_floor.close()
        if self.dispatcher is not None:
            unless_full(self.dispatcher.stop, "the dispatcher's final flush")
        self.commitlog.close()
        self.queues.close()
        self.index.close()
        self.topics.close()

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: Topic, system: bool = False) -> tuple[Topic, bool]:
        """Create ``topic``; returns once it is durable (concurrent creates share a sync).
        ``system``: a retry or dead-letter topic the broker makes (``store.names``)."""
        with self._topic_changes.of(topic.name):
            return self.topics.create(
                Topic(topic.name, topic.queue_count, topic.retention_ms, topic.retention_bytes,
                      since_offset=self.commitlog.confirmed_offset,
                      tier_retention_ms=topic.tier_retention_ms),
                system=system,
            )

    def create_topic_at(self, topic: Topic, starts: dict[int, int], system: bool = False
                        ) -> tuple[Topic, bool]:
        """Create ``topic`` with queue ``q`` beginning at queue offset ``starts[q]`` (a
        topic taken over from another broker continues its offsets; the queues are made
        durable before the topic exists, so no send takes an offset below them)."""
        if self.topics.get(topic.name) is None:
            for qid, offset in starts.items():
                if 0 <= qid < topic.queue_count and offset > 0:
                    self.queues.queue(topic.name, qid).start_at(offset)
                    self._next_queue_offset.pop((topic.name, qid), None)
        return self.create_topic(topic, system)

    def delete_topic(self, name: str, system: bool = False) -> None:
        """Delete topic ``name``; returns once that is durable.  ``system``: a retry
        topic the broker made, going with its user's topic (``PopService.forget``);
        a user never deletes one."""
        if system:
            check_broker_made(name)
        else:
            check_name(name)
        with self._topic_changes.of(name):
            self.topics.delete(name)
            self.queues.drop_topic(name)
            for slot in list(self._next_queue_offset):
                if slot[0] == name:
                    self._next_queue_offset.pop(slot, None)

    # ------------------------------------------------------------------ writes

    def check(self, m: Message | Draft) -> None:
        """Raise ``InvalidArgument``/``TopicNotFound`` for a message that cannot be stored."""
        validate_message_fields(m.topic, m.key, m.tag, m.body, m.message_id,
                                self.config.max_body_bytes)
        validate_times(m.born_at_ms, m.deliver_at_ms)
        check_name(m.topic)  # never a retry or dead-letter topic: the broker writes those
        self.holds.check(m.topic)  # a topic a takeover is still adopting answers no send
        if self.topics.get(m.topic) is None and self.topics.mounted(m.topic) is not None:
            raise FailedPrecondition(f"topic {m.topic!r} is mounted read-only from another "
                                     "broker's tier: it can be consumed here, not sent to")
        if self.topics.get(m.topic) is None:
            if not self.config.auto_create_topics:
                raise TopicNotFound(m.topic)
            self._create_topic(Topic(m.topic, self.config.default_queue_count))

    def set_topic_creator(self, create: Callable[[Topic], object]) -> None:
        """How ``check`` auto-creates a topic (default: ``create_topic``): the broker
        passes its own, which claims the topic in the shared tier first."""
        self._create_topic = create

    def put(self, messages: list[Message]) -> Future[list[DispatchInfo]]:
        """Append checked messages; resolves once durable (see ``put_drafts``)."""
        return self.put_drafts([draft_of(m) for m in messages])

    def put_drafts(self, drafts: list[Draft]) -> Future[list[DispatchInfo]]:
        """Append checked drafts; the future resolves, once they are durable, to one
        ``DispatchInfo`` per draft (id, queue, offsets) in order."""
        return self.commitlog.append(partial(self._append.prepare, drafts))

    def _on_appended(self, results: list[Any]) -> None:
        """CommitLog listener: hand the batch's records to the dispatcher from memory."""
        if self.dispatcher is not None:
            for infos in results:
                self.dispatcher.offer(infos)

    # ------------------------------------------------------------------ reads

    def wait_visible(self, timeout_s: float = 1.0) -> bool:
        """Wait until every message acknowledged so far is in its ConsumeQueue, so a read
        that follows a Send sees it (read-your-writes); usually well under a millisecond."""
        assert self.dispatcher is not None
        return self.dispatcher.wait_dispatched(self.commitlog.confirmed_offset, timeout_s)

    def _dispatched_offset(self) -> int:
        return self.dispatcher.dispatched_offset if self.dispatcher is not None else 0

    def read_message(self, commit_offset: int, size: int) -> Message:
        """The record at ``commit_offset`` of ``size`` bytes (a ConsumeQueue entry's);
        raises ``DamagedRecord`` when it fails its checks (``store.reader``)."""
        return self.reader.read_message(commit_offset, size)

    def read_messages(self, locations: list[tuple[int, int]]) -> list[Message]:
        """Several records (``(commit_offset, size)``, in CommitLog order, never a hole);
        raises ``DamagedRecord`` naming the first damaged one."""
        return self.reader.read_messages(locations)

    def read_messages_skipping(self, locations: list[tuple[int, int]]
                               ) -> list[Message | DamagedRecord]:
        """Per location, its message or the ``DamagedRecord`` that stands for it."""
        return self.reader.read_messages_skipping(locations)

    def consume_queue_entries(
        self, topic: str, queue_id: int, queue_offset: int, max_entries: int
    ) -> list[CqEntry]:
        cq = self.queues.existing(topic, queue_id)
        return cq.get(queue_offset, max_entries) if cq is not None else []

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self.queues.existing(topic, queue_id)
        return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)

    def query_by_message_id(self, message_id: str) -> list[Message]:
        """The record with this id: the indexed one (client-chosen ids, redeliveries), else
        the record its broker-assigned id points at; only a record the store wrote, never
        bytes inside a body that look like one (``store.lookup``)."""
        return self.lookup.by_message_id(message_id)

    def query_by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        self.topics.require(topic)
        return self.lookup.by_key(topic, key, limit)

    def stored_at(self, messages: list[tuple[str, str]]) -> list[int | None]:
        """When a record with each (topic, client-chosen id) was last stored (None: never,
        or it was lost in a torn tail): what the send-side de-duplication looks up."""
        return self.lookup.stored_at(messages)

    def add_delayed_witness(self, holds: DelayedWitness) -> None:
        """``holds(message_id, commit_offset)``: whether that delayed record is pending
        (the timer); the proof a delayed record found by its id needs (``store.lookup``)."""
        self.lookup.add_delayed_witness(holds)

    # ------------------------------------------------------------------ retention

    def run_retention(self) -> int:
        """Delete CommitLog segments past local retention (age, then total size) that every
        dispatcher has passed; drop ConsumeQueue files that point only at deleted data.
        Returns the bytes deleted."""
        assert self.dispatcher is not None
        safe = min(self.dispatcher.dispatched_offset, self.queues.position(),
                   self.index.position(), *(h.position() for h in self._extra_handlers),
                   *(guard() for guard in self._retention_guards))
        cfg = self.config
        now_s = self.clock.now_ms() / 1000
        total = self.commitlog.statistics().bytes_on_disk
        freed = 0
        for _base, end, mtime_s in self.commitlog.segment_ends():
            too_old = cfg.retention_ms > 0 and (now_s - mtime_s) * 1000 > cfg.retention_ms
            too_big = cfg.retention_bytes > 0 and total - freed > cfg.retention_bytes
            if end > safe or not (too_old or too_big):
                break
            freed += self.commitlog.delete_oldest_segment()
        self.queues.expire(self.commitlog.min_offset)  # and each topic's retention_ms
        return freed

    def statistics(self) -> StoreStats:
        return StoreStats(
            commitlog=self.commitlog.statistics(),
            topics=self.topics.count(),
            queues=sum(t.queue_count for t in self.topics.list()),
            dispatched_offset=self.dispatcher.dispatched_offset if self.dispatcher else 0,
            messages_appended=self._append.appended,
            damaged_records=self.commitlog.damaged_records,
            cq_files_open=self.queues.statistics().open_files,
        )

    def require_topic(self, name: str) -> Topic:
        """The topic a client reads (Pop, Subscribe): ``TopicNotFound``, or
        ``Unavailable`` while a takeover holds it (``store.holds``)."""
        topic = self.topics.require(name)
        self.holds.check(name)
        return topic


def _log_end_on_disk(log_dir: str) -> int:
    """Where the newest CommitLog segment ends before recovery looks at it (0: none)."""
    try:
        newest = max(n for n in os.listdir(log_dir) if n.endswith(".log"))
    except (FileNotFoundError, ValueError):
        return 0
    return int(newest[:-4]) + os.stat(os.path.join(log_dir, newest)).st_size
