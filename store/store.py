"""MessageStore: the local store as one object: CommitLog + ConsumeQueues + key index +
topic catalogue + retention.

Data directory layout::

    <data_dir>/commitlog/      CommitLog segments and checkpoint (store.commitlog)
    <data_dir>/consumequeue/   one folder per topic/queue (store.consumequeue)
    <data_dir>/checkpoint/     dispatcher checkpoints
    <data_dir>/index/          RocksDB key/message-id index (store.index)
    <data_dir>/topics.json     topic catalogue (store.topics)

Start-up order: recover the CommitLog (truncate a torn tail) -> drop ConsumeQueue entries
past its end -> replay the CommitLog into every dispatcher from its checkpoint -> take the
next queue offsets from the ConsumeQueues -> accept writes.

Thread-safe.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from store.clock import Clock
from store.commitlog import CommitLog, CommitLogStats
from store.consumequeue import ConsumeQueue, CqEntry
from store.dispatcher import Dispatcher, DispatchHandler
from store.errors import StorageIOError, StoreError, TopicNotFound
from store.index import KeyIndex
from store.message import (
    FLAG_DELAYED,
    FLAG_FOREIGN_ID,
    HEADER,
    HEADER_AFTER_CRC,
    HEADER_PREFIX,
    RECORD_MAGIC,
    DispatchInfo,
    Draft,
    Message,
    MessageIdFormat,
    RecordError,
    decode_record,
    draft_of,
    record_size_at,
    reframe_record,
    validate_message_fields,
)
from store.queues import ConsumeQueueTable
from store.topics import Topic, TopicCatalogue

log = logging.getLogger(__name__)


_COALESCE_BYTES = 1 << 20  # read_messages merges reads whose span stays under this


@dataclass(frozen=True, slots=True)
class StoreConfig:
    data_dir: str
    segment_bytes: int = 1 << 30
    flush: str = "sync"  # "sync": fsync before Send returns; "async": fsync every interval
    flush_interval_ms: int = 200
    max_body_bytes: int = 4 << 20
    cq_entries_per_file: int = 300_000
    auto_create_topics: bool = False
    default_queue_count: int = 4
    retention_ms: int = 72 * 3600 * 1000
    retention_bytes: int = 0  # 0: no size limit
    node_id: int = 0
    dedupe_window_ms: int = 24 * 3600 * 1000  # a client-chosen id sent again (same topic) within
    #                                           this is dropped (0: never)


@dataclass(frozen=True, slots=True)
class StoreStats:
    commitlog: CommitLogStats
    topics: int
    queues: int
    dispatched_offset: int
    messages_appended: int


class MessageStore:
    """The local durable store.  Thread-safe."""

    def __init__(self, config: StoreConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        os.makedirs(config.data_dir, exist_ok=True)
        self.topics = TopicCatalogue(os.path.join(config.data_dir, "topics.json"))
        self.commitlog = CommitLog(
            os.path.join(config.data_dir, "commitlog"), clock, config.segment_bytes,
            config.flush == "sync", config.flush_interval_ms,
        )
        self.queues = ConsumeQueueTable(config.data_dir, self.topics, config.cq_entries_per_file)
        self.index = KeyIndex(os.path.join(config.data_dir, "index"))
        self._extra_handlers: list[DispatchHandler] = []
        self._retention_guards: list[Callable[[], int]] = []
        self.dispatcher: Dispatcher | None = None
        self.ids = MessageIdFormat(config.node_id)
        self._next_queue_offset: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._appended = 0
        self._topic_lock = threading.Lock()
        self._stopped = False

    # ------------------------------------------------------------------ life cycle

    def add_dispatch_handler(self, handler: DispatchHandler) -> None:
        """Register another view of the CommitLog (timer, tier); call before ``open``."""
        self._extra_handlers.append(handler)

    def add_retention_guard(self, position: Callable[[], int]) -> None:
        """Local retention never deletes CommitLog data at or past ``position()`` (a
        reader that follows the log on its own, like the tiered dispatcher)."""
        self._retention_guards.append(position)

    def open(self) -> None:
        end = self.commitlog.open()
        dropped = self.queues.truncate_beyond(end)
        if dropped:
            log.warning("dropped %d consume-queue entries past the recovered log end", dropped)
        handlers: list[DispatchHandler] = [self.queues, self.index, *self._extra_handlers]
        self.dispatcher = Dispatcher("dispatcher", self.commitlog, handlers, self.clock)
        self.commitlog.add_listener(self._on_appended)
        replayed_from = self.dispatcher.dispatched_offset
        self.dispatcher.catch_up()
        log.info("store open: commitlog end %d, replayed %d bytes", end, end - replayed_from)
        self._next_queue_offset = self.queues.max_offsets()

    def start(self) -> None:
        assert self.dispatcher is not None, "open() first"
        self.commitlog.start()
        self.dispatcher.start()

    def stop(self) -> None:
        """Flush and close everything; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.commitlog.stop()
        if self.dispatcher is not None:
            self.dispatcher.stop()
        self.commitlog.close()
        self.queues.close()
        self.index.close()

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: Topic) -> tuple[Topic, bool]:
        with self._topic_lock:
            return self.topics.create(
                Topic(topic.name, topic.queue_count, topic.retention_ms, topic.retention_bytes,
                      since_offset=self.commitlog.confirmed_offset,
                      tier_retention_ms=topic.tier_retention_ms),
                system=topic.name.startswith("%"),
            )

    def delete_topic(self, name: str) -> None:
        with self._topic_lock:
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
        if self.topics.get(m.topic) is None:
            if not self.config.auto_create_topics:
                raise TopicNotFound(m.topic)
            self.create_topic(Topic(m.topic, self.config.default_queue_count))

    def put(self, messages: list[Message]) -> Future[list[DispatchInfo]]:
        """Append checked messages; resolves once durable (see ``put_drafts``)."""
        return self.put_drafts([draft_of(m) for m in messages])

    def put_drafts(self, drafts: list[Draft]) -> Future[list[DispatchInfo]]:
        """Append checked drafts; the future resolves, once they are durable, to one
        ``DispatchInfo`` per draft (id, queue, offsets) in order."""
        return self.commitlog.append(partial(self._prepare, drafts))

    def _prepare(self, drafts: list[Draft], offset: int) -> tuple[list[bytes], list[DispatchInfo]]:
        """Runs on the CommitLog writer thread: assign queues, offsets and ids; encode.

        The hottest loop of the broker: fields are unpacked once and the record layout of
        ``store.message`` is inlined (``encode_fields`` is the readable twin; a round-trip
        test keeps them equal)."""
        topics: dict[str, tuple[int, bytes]] = {}
        for name in {d[1] for d in drafts}:  # check every topic before any offset is taken
            topic = self.topics.get(name)
            if topic is None:
                raise TopicNotFound(name)
            topics[name] = (topic.queue_count, name.encode())
        now = self.clock.now_ms()
        id_prefix, make_id = self.ids.prefix(now), self.ids.make
        records: list[bytes] = []
        infos: list[DispatchInfo] = []
        next_qo = self._next_queue_offset
        round_robin = self._round_robin
        new_info = tuple.__new__  # a NamedTuple's own __new__ is Python code: skip it
        pack_head, pack_prefix, crc32 = HEADER_AFTER_CRC.pack, HEADER_PREFIX.pack, zlib.crc32
        for mid, name, key, tag, body, props, born, due, flags, attempt, again in drafts:
            queue_count, topic_b = topics[name]
            key_b = key.encode() if key else b""
            if key_b:
                qid = crc32(key_b) % queue_count
            else:
                rr = round_robin.get(name)
                if rr is None:
                    rr = round_robin[name] = itertools.count()
                qid = next(rr) % queue_count
            qo = 0
            if not flags & FLAG_DELAYED:
                slot = (name, qid)
                qo = next_qo.get(slot, 0)
                next_qo[slot] = qo + 1
            if mid:
                flags |= FLAG_FOREIGN_ID
            else:
                mid = make_id(id_prefix, offset)
            if again:  # a stored record appended again: new header, same contents
                rec = reframe_record(again, flags, qid, qo, born, now, due, attempt)
                size = len(rec)
                records.append(rec)
            else:
                mid_b = mid.encode("ascii")
                tag_b = tag.encode() if tag else b""
                tail = b"".join((
                    pack_head(flags, qid, qo, born, now, due, attempt, len(mid_b),
                              len(topic_b), len(key_b), len(tag_b), len(props), len(body)),
                    mid_b, topic_b, key_b, tag_b, props, body))
                size = len(tail) + 12
                records.append(pack_prefix(RECORD_MAGIC, size, crc32(tail)) + tail)
            infos.append(new_info(DispatchInfo, (offset, size, flags, qid, qo, now, due, mid,
                                                 name, key, tag)))
            offset += size
        self._appended += len(drafts)
        return records, infos

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

    def read_message(self, commit_offset: int, size: int) -> Message:
        try:
            data = self.commitlog.read(commit_offset, size)
            return decode_record(data, 0, commit_offset)
        except RecordError as exc:
            raise StorageIOError(f"record at commitlog offset {commit_offset}: {exc}") from exc

    def read_messages(self, locations: list[tuple[int, int]]) -> list[Message]:
        """Read several records (``(commit_offset, size)``, in CommitLog order); records
        close together are read with one ``pread`` of the span that holds them."""
        out: list[Message] = []
        i = 0
        while i < len(locations):
            start, size = locations[i]
            end, j = start + size, i + 1
            while j < len(locations):
                nxt, nsize = locations[j]
                if nxt < end or nxt + nsize - start > _COALESCE_BYTES:
                    break
                end, j = nxt + nsize, j + 1
            try:
                span = self.commitlog.read(start, end - start)
            except StorageIOError:  # spans a segment boundary: read one by one
                span, j = b"", i + 1
            for offset, rec_size in locations[i:j]:
                if span:
                    out.append(decode_record(span, offset - start, offset))
                else:
                    out.append(self.read_message(offset, rec_size))
            i = j
        return out

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
        the record its broker-assigned id points at."""
        loc = self.index.by_message_id(message_id)
        if loc is not None:
            return self._read_located([loc])
        offset = self.ids.locate(message_id)
        log_ = self.commitlog
        if offset is None or not log_.min_offset <= offset < log_.confirmed_offset:
            return []
        try:
            head = self.commitlog.read(offset, HEADER.size)
            m = self.read_message(offset, record_size_at(head))
        except StoreError:
            return []
        return [m] if m.message_id == message_id else []

    def query_by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        self.topics.require(topic)
        return self._read_located(self.index.by_key(topic, key, limit))

    def _read_located(self, locations: list[tuple[int, int]]) -> list[Message]:
        low = self.commitlog.min_offset  # anything below was removed by retention
        return self.read_messages([(o, n) for o, n in locations if o >= low])

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
        if freed:
            self._trim_queues(self.commitlog.min_offset)
        self._apply_topic_retention()
        return freed

    def _trim_queues(self, min_commit_offset: int) -> None:
        for _, cq in self.queues.all_queues():
            _expire_entries(cq, lambda e: e.commit_offset < min_commit_offset)

    def _apply_topic_retention(self) -> None:
        now = self.clock.now_ms()
        for topic in self.topics.list():
            if topic.retention_ms <= 0:
                continue
            horizon = now - topic.retention_ms
            for qid in range(topic.queue_count):
                cq = self.queues.existing(topic.name, qid)
                if cq is not None:
                    _expire_entries(cq, partial(_stored_before, horizon))

    def statistics(self) -> StoreStats:
        queues = self.queues.all_queues()
        return StoreStats(
            commitlog=self.commitlog.statistics(),
            topics=len(self.topics.list()),
            queues=len(queues),
            dispatched_offset=self.dispatcher.dispatched_offset if self.dispatcher else 0,
            messages_appended=self._appended,
        )

    def require_topic(self, name: str) -> Topic:
        return self.topics.require(name)


def _expire_entries(cq: ConsumeQueue, expired: Callable[[CqEntry], bool]) -> None:
    """Move the queue's low mark past the (sorted) prefix of expired entries; drop files."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        e = cq.get(mid, 1)
        if e and expired(e[0]):
            lo = mid + 1
        else:
            hi = mid
    cq.set_min_offset(lo)
    cq.delete_files_before(lo)


def _stored_before(horizon_ms: int, entry: CqEntry) -> bool:
    return entry.store_at_ms < horizon_ms
