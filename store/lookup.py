"""RecordLookup: reads that start from a CommitLog offset the store did not just take from
a ConsumeQueue (a broker-assigned id, which names its record's offset; a key-index or
dedupe entry) and the proof that what they find is a record the store wrote there.

An offset from outside is not trusted.  A client can predict where its next message
lands and send a body that holds a whole, CRC-valid record naming another topic; an id
naming the offset of those bytes must not serve them.  An index entry can be stale: the
record it was written for may have been lost in a torn tail, its offset since taken by
another record.  So a record read at such an offset counts only with a proof
(``written_here``):

* a record in a ConsumeQueue: the entry at its own topic, queue id and queue offset
  points back at this offset with this size.  Bytes forged inside a body name a topic
  and queue offset whose entry points elsewhere, or nowhere.
* a delayed record (in no ConsumeQueue until the timer delivers it): a witness added
  with ``add_delayed_witness`` holds that id at that offset (the timer).  Without a
  witness no delayed record is found by id.  Once delivered, the id names the delivered
  copy (through the key index) and that copy is in its ConsumeQueue.

A dedupe entry (``stored_at``) counts only while the record at its location has its
topic, id and store time; one whose location is gone to local retention counts as it
is (it was checked while it could be; past retention nothing is left to check).

A lookup that finds nothing while the dispatcher has not caught up with the log waits
for it once (up to ``VISIBLE_WAIT_S``): a Send that returned is then found.

Thread-safe (reads; witnesses are added before the store starts).
"""

from __future__ import annotations

from collections.abc import Callable

from store.commitlog import CommitLog
from store.errors import StoreError
from store.index import KeyIndex
from store.message import FLAG_DELAYED, HEADER, Message, MessageIdFormat, record_size_at
from store.queues import ConsumeQueueTable
from store.reader import RecordReader
from store.topics import TopicCatalogue

VISIBLE_WAIT_S = 1.0
DelayedWitness = Callable[[str, int], bool]  # (message id, commit offset) -> pending there


class RecordLookup:
    def __init__(self, commitlog: CommitLog, reader: RecordReader, index: KeyIndex,
                 queues: ConsumeQueueTable, topics: TopicCatalogue, ids: MessageIdFormat,
                 dispatched: Callable[[], int], wait_visible: Callable[[float], bool]
                 ) -> None:
        self._log = commitlog
        self._reader = reader
        self._index = index
        self._queues = queues
        self._topics = topics
        self._ids = ids
        self._dispatched = dispatched
        self._wait_visible = wait_visible
        self._witnesses: list[DelayedWitness] = []

    def add_delayed_witness(self, holds: DelayedWitness) -> None:
        self._witnesses.append(holds)

    def by_message_id(self, message_id: str) -> list[Message]:
        """The record with this id: the indexed one (client-chosen ids, redeliveries),
        else the record its broker-assigned id points at; only one the store wrote."""
        found = self._by_message_id(message_id)
        if not found and self._lagging():
            self._wait_visible(VISIBLE_WAIT_S)
            found = self._by_message_id(message_id)
        return found

    def _by_message_id(self, message_id: str) -> list[Message]:
        loc = self._index.by_message_id(message_id)
        if loc is None:
            offset = self._ids.locate(message_id)
            if offset is None or not self._reader.on_disk(offset):
                return []
            try:
                loc = offset, record_size_at(self._log.read(offset, HEADER.size))
            except StoreError:
                return []
        m = self._reader.read_located(*loc)
        if m is None or m.message_id != message_id or not self.written_here(m):
            return []
        return [m]

    def by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        """The newest ``limit`` records of ``topic`` with ``key`` on local disk."""
        found = (self._reader.read_located(o, n)
                 for o, n in self._index.by_key(topic, key, limit))
        return [m for m in found if m is not None and m.topic == topic and m.key == key
                and self.written_here(m)]

    def written_here(self, m: Message) -> bool:
        """Whether ``m``, read at ``m.commit_offset``, is a record the store appended
        there (the proofs in the module docstring)."""
        if m.flags & FLAG_DELAYED:
            return any(holds(m.message_id, m.commit_offset) for holds in self._witnesses)
        topic = self._topics.get(m.topic)
        if topic is None or m.queue_id >= topic.queue_count:
            return False
        cq = self._queues.existing(m.topic, m.queue_id)
        entries = cq.get(m.queue_offset, 1) if cq is not None else []
        return bool(entries) and entries[0].queue_offset == m.queue_offset \
            and entries[0].commit_offset == m.commit_offset \
            and entries[0].record_size == m.record_size

    def stored_at(self, messages: list[tuple[str, str]]) -> list[int | None]:
        """When a record with each (topic, client-chosen id) was last stored (None:
        never, or that record was lost in a torn tail)."""
        out: list[int | None] = []
        for (topic, mid), e in zip(messages, self._index.dedupe_entries(messages),
                                   strict=True):
            now = self._topics.get(topic)
            if e is not None and now is not None and 0 <= e.commit_offset < now.since_offset:
                out.append(None)  # the topic's namesake, deleted since: another topic
                continue
            if e is None or e.commit_offset < self._log.min_offset:  # -1: an old entry
                out.append(None if e is None else e.store_at_ms)
                continue
            m = self._reader.read_located(e.commit_offset, e.record_size)
            same = m is not None and m.topic == topic and m.message_id == mid \
                and m.store_at_ms == e.store_at_ms
            gone = m is None and e.commit_offset < self._log.min_offset  # retention, now
            out.append(e.store_at_ms if same or gone else None)
        return out

    def _lagging(self) -> bool:
        return self._dispatched() < self._log.confirmed_offset
