"""TieredQueue: one topic queue on the tier, as two FlatFiles.

::

    <broker>/data/<topic>/<generation>/<queue>/log/...   the queue's records, byte for
                                byte as in the local CommitLog (same codec, CRC included)
    <broker>/data/<topic>/<generation>/<queue>/cq/...    24-byte entries
                                (store.consumequeue.ENTRY): log position, record size,
                                tag hash, store time

The generation is the topic's ``since_offset``: a topic deleted and created again under
the same name starts a new generation, so its queue offsets never meet the old ones.

Entry ``i`` of the cq stream is queue offset ``first_queue_offset + i``, so a lookup by
queue offset is one ranged read of the cq and one of the log.  The log is committed before
the cq, so a committed entry always points at committed bytes.  Appends of queue offsets
already in the tier are skipped: a dispatcher that replays after a crash adds nothing
twice.  Writes (append, commit, expire) come from one owner thread; ``read`` from any.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from store.consumequeue import ENTRY
from store.message import DispatchInfo
from store.queues import tag_hash
from tiered.errors import TierError
from tiered.flatfile import FlatFile, FlatFileMeta
from tiered.provider import Provider


class TieredEntry(NamedTuple):
    queue_offset: int
    tag_hash: int
    store_at_ms: int
    record: bytes


class TieredQueue:
    def __init__(self, provider: Provider, broker: str, topic: str, queue_id: int,
                 meta_json: str | None = None, segment_bytes: int = 1 << 30,
                 upload_timeout_s: float = 30.0,
                 uploader: ThreadPoolExecutor | None = None, generation: int = 0,
                 segment_ms: int = 0) -> None:
        self.topic, self.queue_id = topic, queue_id
        log_meta = cq_meta = None
        self.first_queue_offset = -1  # none yet
        self.generation = generation
        if meta_json:
            raw = json.loads(meta_json)
            if raw.get("version") != 1:
                raise TierError(f"unknown tiered queue metadata version {raw.get('version')!r}")
            self.first_queue_offset = raw["first_queue_offset"]
            self.generation = raw["generation"]
            log_meta = FlatFileMeta.from_json(raw["log"])
            cq_meta = FlatFileMeta.from_json(raw["cq"])
        prefix = f"{broker}/data/{topic}/{self.generation}/{queue_id}"
        self.log = FlatFile(provider, prefix + "/log", log_meta, segment_bytes,
                            upload_timeout_s, uploader, segment_ms)
        self.cq = FlatFile(provider, prefix + "/cq", cq_meta,
                           max(ENTRY.size, segment_bytes // 64 // ENTRY.size * ENTRY.size),
                           upload_timeout_s, uploader, segment_ms)

    def to_json(self) -> str:
        return json.dumps({"version": 1, "generation": self.generation,
                           "first_queue_offset": self.first_queue_offset,
                           "log": self.log.to_json(), "cq": self.cq.to_json()})

    # ------------------------------------------------------------------ offsets

    @property
    def next_queue_offset(self) -> int:
        """The queue offset the next appended record must have (accepted, maybe not yet
        committed)."""
        if self.first_queue_offset < 0:
            return -1
        return self.first_queue_offset + self.cq.append_position // ENTRY.size

    @property
    def committed_queue_offset(self) -> int:
        """Every queue offset below this is durable in the tier."""
        if self.first_queue_offset < 0:
            return -1
        return self.first_queue_offset + self.cq.commit_position // ENTRY.size

    @property
    def min_queue_offset(self) -> int:
        """The oldest queue offset still in the tier."""
        return self.first_queue_offset + self.cq.start_position // ENTRY.size

    @property
    def buffered_bytes(self) -> int:
        return self.log.buffered_bytes + self.cq.buffered_bytes

    # ------------------------------------------------------------------ writes

    def append(self, queue_offset: int, record: bytes, tag_hash: int, store_at_ms: int) -> bool:
        """Buffer one record; False if the tier already has this queue offset."""
        nxt = self.next_queue_offset
        if nxt < 0:
            self.first_queue_offset = queue_offset
        elif queue_offset < nxt:
            return False
        elif queue_offset > nxt:
            raise TierError(f"{self.topic}/{self.queue_id}: queue offset {queue_offset} "
                            f"leaves a gap after {nxt - 1}")
        pos = self.log.append(record, store_at_ms)
        self.cq.append(ENTRY.pack(pos, len(record), tag_hash, store_at_ms), store_at_ms)
        return True

    def append_batch(self, records: list[DispatchInfo], data: bytes | memoryview,
                     data_offset: int) -> tuple[list[DispatchInfo], str]:
        """Buffer this queue's ``records`` (in queue order; their bytes are in ``data``,
        which starts at CommitLog offset ``data_offset``) with one append per stream.
        Returns the records added (those the tier already has are skipped) and, if the
        records leave a gap in the queue, why the rest were not added ("" otherwise)."""
        nxt = self.next_queue_offset
        i = 0
        while i < len(records) and nxt >= 0 and records[i].queue_offset < nxt:
            i += 1  # a replay: already in the tier
        todo = records[i:]
        if not todo:
            return [], ""
        if nxt < 0:
            self.first_queue_offset = nxt = todo[0].queue_offset
        gap = None
        for j, r in enumerate(todo):
            if r.queue_offset != nxt + j:
                gap, todo = r.queue_offset, todo[:j]
                break
        if todo:
            pos = self.log.append_position
            chunks, entries = [], []
            pack = ENTRY.pack
            for r in todo:
                at = r.commit_offset - data_offset
                chunks.append(data[at : at + r.record_size])
                entries.append(pack(pos, r.record_size, tag_hash(r.tag), r.store_at_ms))
                pos += r.record_size
            first_ms, last_ms = todo[0].store_at_ms, todo[-1].store_at_ms
            self.log.append(b"".join(chunks), first_ms, last_ms)
            self.cq.append(b"".join(entries), first_ms, last_ms)
        if gap is not None:
            return todo, (f"{self.topic}/{self.queue_id}: queue offset {gap} leaves a gap "
                          f"after {nxt + len(todo) - 1}")
        return todo, ""

    def commit(self) -> bool:
        """Upload the buffered records, then their entries.  True when both are durable;
        False after a failed upload (its FlatFile switched segment; retry later)."""
        return self.log.commit() and self.cq.commit()

    def expire_stored_before(self, at_ms: int) -> list[str]:
        """Retention by time: drop the leading segments of entries all stored before
        ``at_ms``, and the log segments only they point into.  Returns the object paths
        to delete once the caller has persisted ``to_json()``."""
        cq_pos = self.cq.segments_before(at_ms)
        if self.first_queue_offset < 0 or cq_pos <= self.cq.start_position:
            return []
        if cq_pos < self.cq.commit_position:  # the first entry that stays: its record too
            log_pos = ENTRY.unpack(self.cq.read(cq_pos, ENTRY.size))[0]
        else:
            log_pos = self.log.commit_position
        return self.cq.expire_before(cq_pos) + self.log.expire_before(log_pos)

    # ------------------------------------------------------------------ reads

    def read(self, queue_offset: int, count: int) -> list[TieredEntry]:
        """Up to ``count`` committed entries from ``queue_offset`` with their records."""
        start = max(queue_offset, self.min_queue_offset)
        end = min(queue_offset + count, self.committed_queue_offset)
        if self.first_queue_offset < 0 or start >= end:
            return []
        raw = self.cq.read((start - self.first_queue_offset) * ENTRY.size,
                           (end - start) * ENTRY.size)
        entries = [ENTRY.unpack_from(raw, i) for i in range(0, len(raw), ENTRY.size)]
        first_pos = entries[0][0]
        last_pos, last_size = entries[-1][0], entries[-1][1]
        span = self.log.read(first_pos, last_pos + last_size - first_pos)  # contiguous: one span
        return [TieredEntry(start + i, tag, at, span[pos - first_pos : pos - first_pos + size])
                for i, (pos, size, tag, at) in enumerate(entries)]
