"""AppendMessageCallback: what the CommitLog writer does to a batch of drafts (RocketMQ's
``DefaultAppendMessageCallback``).

Per draft, in order: its queue (CRC32 of its key modulo the topic's queue count; an
unkeyed one round robin per topic), its queue offset (``store.queues.NextOffsets``; a
delayed record takes one of the delayed stream, ``store.names.DELAYED_STREAM``, when
that exists, else none), its message id (assigned from its CommitLog offset and the id
floor's millisecond, ``store.idfloor``, unless the client chose one:
``FLAG_FOREIGN_ID``), and its bytes in the record layout of ``store.message``.  Every
topic of a batch is checked before any offset is taken.  A batch the full volume
refused gives its queue offsets back (``give_back``: it was the newest), so no hole is
left.

Not thread-safe: ``prepare`` and ``give_back`` run on the CommitLog writer thread only
(``store.commitlog``); the store changes the next offsets of a queue only while its
topic is created or deleted, when no batch is sent to it.
"""

from __future__ import annotations

import itertools
import zlib

from store.clock import Clock
from store.errors import TopicNotFound
from store.idfloor import IdFloor
from store.message import (
    FLAG_DELAYED,
    FLAG_FOREIGN_ID,
    HEADER_AFTER_CRC,
    HEADER_PREFIX,
    RECORD_MAGIC,
    DispatchInfo,
    Draft,
    MessageIdFormat,
    reframe_record,
)
from store.names import DELAYED_STREAM
from store.queues import NextOffsets
from store.topics import TopicCatalogue


class AppendMessageCallback:
    """Queues, queue offsets, ids and record bytes of appended drafts; see the module
    docstring.  ``appended``: drafts appended so far (less those given back)."""

    def __init__(self, topics: TopicCatalogue, ids: MessageIdFormat, id_floor: IdFloor,
                 next_offsets: NextOffsets, clock: Clock) -> None:
        self._topics = topics
        self._ids = ids
        self._id_floor = id_floor
        self._next_queue_offset = next_offsets
        self._clock = clock
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.appended = 0

    def prepare(self, drafts: list[Draft], offset: int
                ) -> tuple[list[bytes], list[DispatchInfo]]:
        """Assign queues, offsets and ids; encode.  ``offset``: where the first record
        goes in the CommitLog.

        The hottest loop of the broker: fields are unpacked once and the record layout of
        ``store.message`` is inlined (``encode_fields`` is the readable twin; a round-trip
        test keeps them equal)."""
        topics: dict[str, tuple[int, bytes]] = {}
        for name in {d[1] for d in drafts}:  # check every topic before any offset is taken
            topic = self._topics.get(name)
            if topic is None:
                raise TopicNotFound(name)
            topics[name] = (topic.queue_count, name.encode())
        # delayed records take offsets of the delayed stream when it exists (a broker that
        # uploads: the tier then holds the timer's pending set), else none
        delayed_slot = ((DELAYED_STREAM, 0) if self._topics.get(DELAYED_STREAM) is not None
                        else None)
        now = self._clock.now_ms()
        id_prefix, make_id = self._ids.prefix(self._id_floor.ms(now)), self._ids.make
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
                qo = next_qo[slot]  # the queue's end on disk the first time (NextOffsets)
                next_qo[slot] = qo + 1
            elif delayed_slot is not None:
                qid, qo = 0, next_qo[delayed_slot]
                next_qo[delayed_slot] = qo + 1
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
        self.appended += len(drafts)
        return records, infos

    def give_back(self, results: list[list[DispatchInfo]]) -> None:
        """CommitLog rollback: a batch the full volume refused gives its queue offsets
        back (it was the newest), so no hole is left."""
        next_qo = self._next_queue_offset
        for infos in results:
            stream = self._topics.get(DELAYED_STREAM)
            for info in infos:
                slot: tuple[str, int] | None = (info.topic, info.queue_id)
                if info.flags & FLAG_DELAYED:
                    slot = ((DELAYED_STREAM, 0) if stream is not None
                            and info.commit_offset >= stream.since_offset else None)
                if slot is not None:
                    next_qo[slot] = min(next_qo.get(slot, info.queue_offset), info.queue_offset)
            self.appended -= len(infos)
