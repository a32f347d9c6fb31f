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
the cq, so a committed entry always points at committed bytes: both go up at once
(``begin_commit``, then ``finish_commit`` after the owner awaited them), and the cq's
object is listed only when the log's is (else it switches segment, like a failed
upload).  Appends of queue offsets already in the tier are skipped: a dispatcher that
replays after a crash adds nothing twice.  Appends and commits come from one owner
thread; retention (``expire_stored_before``) may come from another: it leaves a queue
alone while its upload is in flight (the next pass takes it), so it never cuts the log
under entries on their way up.  ``read`` from any thread.

Damage in the tier (an object cut short or missing, a record that fails its magic, CRC,
topic or queue-offset check) never fails a read: the entries it hides are skipped and
reported (``FlatFile.read_available``; ERROR log lines name the object, the byte and the
queue offsets), everything else stays readable.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from store.consumequeue import ENTRY
from store.message import FLAG_DELAYED, HEADER, DispatchInfo, RecordError, check_record
from store.names import DELAYED_STREAM
from store.queues import tag_hash
from tiered.errors import TierError
from tiered.flatfile import FlatFile, FlatFileMeta
from tiered.provider import Provider
from tiered.uploads import Upload, await_uploads

log = logging.getLogger(__name__)

_SKIP_SPAN = 256  # entries read per step while skipping a damaged stretch
_QUEUE_OFFSET = struct.Struct(">Q")  # record bytes 16-24 (store.message layout)
_FLAGS = struct.Struct(">H")  # record bytes 12-14
_NAME_LENGTHS = struct.Struct(">BH")  # record bytes 52-55: id_len, topic_len
_NAMES_AT = HEADER.size  # where the id, then the topic, start in a record
_STORE_AT = struct.Struct(">Q")  # record bytes 32-40
_LENGTHS = struct.Struct(">BHHH")  # record bytes 52-59: id, topic, key and tag lengths
SCAN_BYTES = 4 << 20  # log bytes a scan reads per step


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
        self.seq = 0  # one more at every save: of two metadata, the newer (tiered.carried)
        if meta_json:
            raw = json.loads(meta_json)
            if raw.get("version") != 1:
                raise TierError(f"unknown tiered queue metadata version {raw.get('version')!r}")
            self.first_queue_offset = raw["first_queue_offset"]
            self.generation = raw["generation"]
            self.seq = int(raw.get("seq", 0))
            log_meta = FlatFileMeta.from_json(raw["log"])
            cq_meta = FlatFileMeta.from_json(raw["cq"])
        prefix = f"{broker}/data/{topic}/{self.generation}/{queue_id}"
        self.log = FlatFile(provider, prefix + "/log", log_meta, segment_bytes,
                            upload_timeout_s, uploader, segment_ms)
        self.cq = FlatFile(provider, prefix + "/cq", cq_meta,
                           max(ENTRY.size, segment_bytes // 64 // ENTRY.size * ENTRY.size),
                           upload_timeout_s, uploader, segment_ms)
        self._topic_bytes = topic.encode()
        self._reported: set[int] = set()  # damaged queue offsets already logged
        self._report_lock = threading.Lock()
        self._meta_lock = threading.Lock()  # both streams' metadata: commit vs. retention

    def to_json(self) -> str:
        """The metadata of both streams, as of one moment (never a cq ahead of its log),
        numbered one more than the last (``seq``)."""
        with self._meta_lock:
            self.seq += 1
            return json.dumps({"version": 1, "generation": self.generation, "seq": self.seq,
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
        records go back in the queue, why the rest were not added ("" otherwise).  A gap
        (queue offsets the local ConsumeQueue has as holes: a lost tail, a skipped damaged
        record) is kept as hole entries, ``record_size`` 0, so the queue goes on."""
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
        expected = nxt
        for j, r in enumerate(todo):
            if r.queue_offset < expected:
                gap, todo = r.queue_offset, todo[:j]
                break
            expected = r.queue_offset + 1
        if todo:
            pos = self.log.append_position
            chunks, entries = [], []
            pack = ENTRY.pack
            expected = nxt
            for r in todo:
                if r.queue_offset > expected:  # holes
                    entries.append(pack(pos, 0, 0, r.store_at_ms) * (r.queue_offset - expected))
                at = r.commit_offset - data_offset
                chunks.append(data[at : at + r.record_size])
                entries.append(pack(pos, r.record_size, tag_hash(r.tag), r.store_at_ms))
                pos += r.record_size
                expected = r.queue_offset + 1
            first_ms, last_ms = todo[0].store_at_ms, todo[-1].store_at_ms
            self.log.append(b"".join(chunks), first_ms, last_ms)
            self.cq.append(b"".join(entries), first_ms, last_ms)
        if gap is not None:
            return todo, (f"{self.topic}/{self.queue_id}: queue offset {gap} goes back "
                          f"before {expected}")
        return todo, ""

    def commit(self) -> bool:
        """Upload the buffered records and their entries.  True when both are durable;
        False after a failed upload (its FlatFile switched segment; retry later)."""
        ups = self.begin_commit()
        await_uploads([u for u in ups if u is not None], self.log.upload_timeout_s)
        return self.finish_commit(ups) is True

    def begin_commit(self) -> tuple[Upload | None, Upload | None]:
        """Reserve and start the uploads of the log's and the cq's buffers (None where a
        stream has nothing buffered); the cq's is not started when the log's was not, or
        failed at once.  The owner awaits them (``await_uploads``), then calls
        ``finish_commit``."""
        with self._meta_lock:  # retention sees both streams uploading, or neither
            log_up, cq_up = self.log.begin_commit(), self.cq.begin_commit()
        if log_up is not None:
            self.log.start_upload(log_up)
        if cq_up is not None and (log_up is None or (log_up.future is not None
                                                     and not log_up.failed)):
            self.cq.start_upload(cq_up)
        return log_up, cq_up

    def finish_commit(self, ups: tuple[Upload | None, Upload | None]) -> bool | None:
        """Apply both outcomes: True when everything buffered is durable and listed,
        False when an upload failed or timed out (retry later), None when one never got
        a thread (nothing written; retry later)."""
        log_up, cq_up = ups
        with self._meta_lock:
            log_ok = self.log.finish_commit(log_up) if log_up is not None else True
            cq_ok = (self.cq.finish_commit(cq_up, accept=log_ok is True)
                     if cq_up is not None else True)
        if log_ok is False or cq_ok is False:
            return False
        return None if log_ok is None or cq_ok is None else True

    def expire_stored_before(self, at_ms: int) -> list[str]:
        """Retention by time: drop the leading segments of entries all stored before
        ``at_ms``, and the log segments only they point into.  Returns the object paths
        to delete once the caller has persisted ``to_json()``; nothing while an upload
        of this queue is in flight.  Any thread; never waits for an upload."""
        return self._expire_to(self.cq.segments_before(at_ms))

    def expire_below(self, queue_offset: int) -> list[str]:
        """Retention by position (a system stream below its snapshot): drop the leading
        segments of entries all below ``queue_offset`` (committed ones only), and the
        log segments only they point into; as ``expire_stored_before``."""
        if self.first_queue_offset < 0:
            return []
        cq_pos = min(self.cq.commit_position,
                     max(0, queue_offset - self.first_queue_offset) * ENTRY.size)
        return self._expire_to(self.cq.segments_ending_by(cq_pos))

    def _expire_to(self, cq_pos: int) -> list[str]:
        if self.first_queue_offset < 0 or cq_pos <= self.cq.start_position:
            return []
        if cq_pos < self.cq.commit_position:  # the first entry that stays: its record too
            pieces = self.cq.read_available(cq_pos, ENTRY.size)
            if pieces and pieces[0][0] == cq_pos and len(pieces[0][1]) == ENTRY.size:
                log_pos = ENTRY.unpack(pieces[0][1])[0]
            else:  # that entry is damaged: keep every log segment rather than guess
                log_pos = self.log.start_position
        else:
            log_pos = self.log.commit_position
        # both cuts are positions in committed data, which only grows at the end: still
        # right after a commit that finished meanwhile
        with self._meta_lock:
            if self.log.uploading or self.cq.uploading:
                return []
            return self.cq.expire_before(cq_pos) + self.log.expire_before(log_pos)

    # ------------------------------------------------------------------ reads

    @property
    def damaged_objects(self) -> int:
        """Objects of this queue found damaged (short, missing, a bad record), since start."""
        return self.log.damaged_objects + self.cq.damaged_objects

    def read(self, queue_offset: int, count: int) -> list[TieredEntry]:
        """Up to ``count`` committed entries with their records, consecutive, from the
        first readable queue offset at or after ``queue_offset``.

        Damaged entries are skipped, never raised: the run ends before damage that
        follows readable entries, and begins after damage at ``queue_offset`` (a reader
        asking there learns where to go on; the first entry's queue offset is then past
        ``queue_offset``).  Empty when nothing readable is left from ``queue_offset``."""
        if self.first_queue_offset < 0:
            return []
        start = max(queue_offset, self.min_queue_offset)
        span = count
        while start < (committed := self.committed_queue_offset) and count > 0:
            end = min(start + span, committed)
            run: list[TieredEntry] = []
            for entry in self._read_slots(start, end):
                if entry is not None:
                    run.append(entry)
                    if len(run) == count:
                        break
                elif run:
                    break
            if run:
                return run
            start, span = end, max(count, _SKIP_SPAN)
        return []

    def scan(self, queue_offset: int) -> Iterator[TieredEntry]:
        """Every committed entry from the first readable one at or after
        ``queue_offset``, in order: what repeated ``read`` calls give, in about half the
        requests.  One cq read finds the first entry's log position; from there the log's
        objects are read in order and their records cut one after the other, each
        checked as ``read`` checks it (a stream of small commits, a journal, is one cq
        and one log object per commit: a takeover replaying one reads the log alone).
        At a hole, damage or anything unexpected it goes on by ``read`` (which skips and
        reports damage) for a step, then scans again."""
        if self.first_queue_offset < 0:
            return
        qo = max(queue_offset, self.min_queue_offset)
        while qo < (committed := self.committed_queue_offset):
            first = self._read_entries(qo, qo + 1, set()).get(qo)
            if first is not None:
                for entry in self._scan_log(qo, first[0], committed):
                    yield entry
                    qo = entry.queue_offset + 1
                if qo >= committed:
                    return
            run = self.read(qo, _SKIP_SPAN)
            if not run:
                return
            yield from run
            qo = run[-1].queue_offset + 1

    def _scan_log(self, qo: int, pos: int, committed: int) -> Iterator[TieredEntry]:
        """The records of queue offsets ``qo``.. from log position ``pos``, while each
        is the next queue offset's and passes its check; stops at the first that is not."""
        want = SCAN_BYTES
        while qo < committed and pos < (end := self.log.commit_position):
            try:
                pieces = self.log.read_available(pos, min(want, end - pos))
            except TierError:
                return  # expired meanwhile, or an outage: ``read`` decides
            if not pieces or pieces[0][0] != pos:
                return
            data, at = pieces[0][1], 0
            while qo < committed and len(data) - at >= _NAMES_AT:
                size = struct.unpack_from(">I", data, at + 4)[0]
                if at + size > len(data):
                    break  # cut by this step's read: the next one starts with it
                record = data[at : at + size]
                if self._check(record, qo):
                    return
                id_len, topic_len, key_len, tag_len = _LENGTHS.unpack_from(record, 52)
                tag_at = _NAMES_AT + id_len + topic_len + key_len
                yield TieredEntry(qo, tag_hash(record[tag_at : tag_at + tag_len].decode()),
                                  _STORE_AT.unpack_from(record, 32)[0], record)
                at += size
                qo += 1
            if at == 0:
                if len(data) < min(want, end - pos) or want >= end - pos:
                    return  # a hole in the log, or a record running past its end
                want = max(want * 2, struct.unpack_from(">I", data, 4)[0]
                           if len(data) >= 8 else want)
                continue  # one record larger than a step
            pos, want = pos + at, SCAN_BYTES

    def stored_at(self, queue_offset: int) -> int | None:
        """The store time of the entry at ``queue_offset``, from its consume-queue entry
        alone (no log read: a binary search by time probes with it); None for a hole,
        damage or an offset not committed."""
        if self.first_queue_offset < 0 or \
                not self.min_queue_offset <= queue_offset < self.committed_queue_offset:
            return None
        entry = self._read_entries(queue_offset, queue_offset + 1, set()).get(queue_offset)
        return None if entry is None else entry[3]

    def _read_slots(self, start: int, end: int) -> list[TieredEntry | None]:
        """Queue offsets ``[start, end)`` (committed): each entry with its record, or
        None where the tier's data is damaged (reported)."""
        holes: set[int] = set()
        entries = self._read_entries(start, end, holes)
        slots: list[TieredEntry | None] = [None] * (end - start)
        if entries:
            first_pos = min(pos for pos, _, _, _ in entries.values())
            last_end = max(pos + size for pos, size, _, _ in entries.values())
            pieces = self.log.read_available(first_pos, last_end - first_pos)
            for qo, (pos, size, tag, at_ms) in entries.items():
                record = _cut(pieces, pos, size)
                if record is None:
                    continue  # in a short or missing object (reported by the FlatFile)
                problem = self._check(record, qo)
                if problem:
                    where = self.log.report_damage(pos, problem)
                    self._report(qo, qo + 1, f"bad record in {where}")
                    continue
                slots[qo - start] = TieredEntry(qo, tag, at_ms, record)
        missing = [start + i for i, e in enumerate(slots) if e is None and start + i not in holes]
        if missing:
            self._report(missing[0], missing[-1] + 1, "unreadable", missing)
        return slots

    def _read_entries(self, start: int, end: int, holes: set[int]
                      ) -> dict[int, tuple[int, int, int, int]]:
        """The cq entries of ``[start, end)`` that are there, by queue offset; an entry
        pointing outside the committed log is damage (reported); hole entries go to
        ``holes``."""
        first, size = self.first_queue_offset, ENTRY.size
        out: dict[int, tuple[int, int, int, int]] = {}
        for pos, raw in self.cq.read_available((start - first) * size, (end - start) * size):
            skip = -pos % size  # a piece after a hole begins on an object, so on an entry
            for at in range(skip, len(raw) - size + 1, size):
                entry = ENTRY.unpack_from(raw, at)
                log_pos, rec_size = entry[0], entry[1]
                if rec_size == 0:
                    holes.add(first + (pos + at) // size)
                    continue  # a hole: no message has this queue offset
                if (log_pos < self.log.start_position or rec_size < _NAMES_AT
                        or log_pos + rec_size > self.log.commit_position):
                    self.cq.report_damage(pos + at, f"entry ({log_pos}, {rec_size}) points "
                                                    "outside the committed log")
                    continue
                out[first + (pos + at) // size] = entry
        return out

    def _check(self, record: bytes, queue_offset: int) -> str:
        """Why ``record`` is not the record of ``queue_offset`` in this queue ("": it is)."""
        try:
            if check_record(record, 0) != len(record):
                return "the record is shorter than its entry says"
        except RecordError as exc:
            return str(exc)
        if _QUEUE_OFFSET.unpack_from(record, 16)[0] != queue_offset:
            return f"the record is not the one of queue offset {queue_offset}"
        if self.topic == DELAYED_STREAM:  # records of every topic, in the stream's offsets
            return "" if _FLAGS.unpack_from(record, 12)[0] & FLAG_DELAYED else \
                "the record is not a delayed one"
        id_len, topic_len = _NAME_LENGTHS.unpack_from(record, 52)
        topic_at = _NAMES_AT + id_len
        if record[topic_at : topic_at + topic_len] != self._topic_bytes:
            return f"the record is not of topic {self.topic}"
        return ""

    def _report(self, lo: int, hi: int, why: str, offsets: list[int] | None = None) -> None:
        """Log once, at ERROR, that queue offsets ``[lo, hi)`` (or ``offsets``) are skipped."""
        todo = range(lo, hi) if offsets is None else offsets
        with self._report_lock:
            new = [qo for qo in todo if qo not in self._reported]
            self._reported.update(new)
        if new:
            log.error("tier %s/%d: %d damaged entries skipped, queue offsets %d..%d (%s)",
                      self.topic, self.queue_id, len(new), new[0], new[-1], why)


def _cut(pieces: list[tuple[int, bytes]], position: int, size: int) -> bytes | None:
    """Bytes ``[position, position + size)`` if one piece holds all of them."""
    for start, data in pieces:
        if start <= position and position + size <= start + len(data):
            return data[position - start : position - start + size]
    return None
