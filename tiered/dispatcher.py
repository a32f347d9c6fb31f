"""TieredDispatcher: follows the local CommitLog on its own thread and uploads each topic
queue to the tier (``tiered.queue``), in batches, with its own checkpoint.

A queue's batch is committed when its buffered bytes reach ``batch_bytes`` or its oldest
buffered record is ``batch_ms`` old, whichever comes first (and every queue's when all
buffers together pass ``buffer_bytes``, which bounds the memory many queues can take).
After each commit the queue's metadata is written to
``<meta_dir>/queues/<topic>/<queue>.json`` (atomically, locally) and then the checkpoint:
the CommitLog offset of the oldest record not yet durable in the tier (the key index,
``tiered.index``, kept in ``<meta_dir>/index``, has persisted its entries by then).
After a crash the dispatcher replays from the checkpoint; queue offsets already in the
tier are skipped, so the tier gets nothing twice and loses nothing.  It registers with
the store as a log reader (``MessageStore.add_log_reader``): after a torn tail the store
``rewind``s its checkpoint to the recovered end before anything new is appended.  It
reads the file with CRC checks when it cannot reuse the store dispatcher's records, and
skips a damaged record (reported by the CommitLog) instead of stopping at it.  Delayed records (the
timer's) are not uploaded: they reach their topic, and the tier, when they are delivered.

Retention in the tier (``run_retention``) is by time, per topic (``tier_retention_ms``,
else ``TieredConfig.retention_ms``; 0 keeps forever): whole segments whose data is all
older are dropped from the metadata, the metadata is persisted, then their objects are
deleted.

It runs beside the store's own dispatcher and never slows it: a slow or failing tier only
makes this checkpoint lag (uploads switch segment on failure and retry).  Local retention
must not delete what it has not passed: ``position()`` is registered as a guard.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from store.clock import Clock
from store.crashpoint import crashpoint
from store.files import fsync_dir, write_atomic
from store.message import FLAG_DELAYED, DispatchInfo
from store.store import MessageStore
from tiered.errors import TierError
from tiered.index import IndexFile, TieredIndex
from tiered.provider import Provider
from tiered.queue import TieredEntry, TieredQueue

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20
RECENT_RECORDS = 1 << 16  # decoded records held from the store's dispatcher, at most


@dataclass(frozen=True, slots=True)
class TieredConfig:
    batch_bytes: int = 4 << 20  # upload a queue's buffer at this size ...
    batch_ms: int = 5000  # ... or at this age
    buffer_bytes: int = 64 << 20  # all buffers together beyond this: upload them all
    segment_bytes: int = 256 << 20
    upload_timeout_s: float = 30.0
    segment_ms: int = 3_600_000  # a segment also closes after this span of data
    retention_ms: int = 0  # tier retention of topics that set none (0: forever)
    index_entries: int = 1 << 20  # a key-index file is sealed at this many entries ...
    index_ms: int = 300_000  # ... or this age


@dataclass(frozen=True, slots=True)
class TierStats:
    position: int  # CommitLog offset below which everything is durable in the tier
    uploaded_records: int  # since start
    uploaded_bytes: int  # records and entries
    upload_batches: int  # committed queue batches
    failed_uploads: int  # each one switched a segment
    queues: int
    index_files: int
    expired_objects: int
    reused_records: int  # taken as the store's dispatcher decoded them, not decoded again
    damaged_objects: int = 0  # tier objects found short, missing or with a bad record


class TieredDispatcher:
    name = "tiered"

    def __init__(self, store: MessageStore, provider: Provider, broker: str, meta_dir: str,
                 config: TieredConfig, clock: Clock) -> None:
        self._store = store
        self._provider = provider
        self._broker = broker
        self._meta_dir = meta_dir
        self.config = config
        self._clock = clock
        self._uploader = ThreadPoolExecutor(4, thread_name_prefix="tier-upload")
        self._lock = threading.Lock()  # guards queues and positions
        self._queues: dict[tuple[str, int], TieredQueue] = {}
        self._first_unsaved: dict[tuple[str, int], int] = {}  # queue -> commitlog offset
        self._since: dict[tuple[str, int], float] = {}  # queue -> when it began buffering
        self._uploaded_records = self._uploaded_bytes = self._batches = 0
        self._failed = self._expired = self._reused = 0
        os.makedirs(os.path.join(meta_dir, "queues"), exist_ok=True)
        self.index = TieredIndex(provider, broker, os.path.join(meta_dir, "index"), clock,
                                 config.index_entries, config.index_ms)
        self._checkpoint = self._load()
        self._read_position = self._checkpoint
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # batches the store's dispatcher decoded, in log order (``offer``): reused instead
        # of decoding the same bytes again while this dispatcher keeps up
        self._recent: deque[list[DispatchInfo]] = deque()
        self._recent_lock = threading.Lock()
        self._recent_records = 0
        store.add_log_reader(self)

    # ------------------------------------------------------------------ state

    def _load(self) -> int:
        qdir = os.path.join(self._meta_dir, "queues")
        for topic in os.listdir(qdir):
            tdir = os.path.join(qdir, topic)
            if not os.path.isdir(tdir):
                continue
            for name in os.listdir(tdir):
                if name.endswith(".json"):
                    qid = int(name[:-5])
                    with open(os.path.join(tdir, name), encoding="utf-8") as f:
                        self._queues[(topic, qid)] = self._new_queue(topic, qid, f.read())
        try:
            with open(os.path.join(self._meta_dir, "checkpoint"), encoding="utf-8") as f:
                return int(f.read().strip())
        except FileNotFoundError:
            return self._store.commitlog.min_offset

    def _new_queue(self, topic: str, qid: int, meta: str | None = None,
                   generation: int = 0) -> TieredQueue:
        return TieredQueue(self._provider, self._broker, topic, qid, meta,
                           self.config.segment_bytes, self.config.upload_timeout_s,
                           self._uploader, generation, self.config.segment_ms)

    def position(self) -> int:
        """The CommitLog offset below which everything is durable in the tier."""
        return self._checkpoint

    def rewind(self, offset: int) -> None:
        """Recovery after a torn tail: read again from ``offset`` when past it; the
        checkpoint moves back first (durably)."""
        with self._lock:
            if self._checkpoint > offset:
                write_atomic(os.path.join(self._meta_dir, "checkpoint"), str(offset).encode())
                fsync_dir(self._meta_dir)
                self._checkpoint = offset
            self._read_position = min(self._read_position, offset)

    def queue(self, topic: str, qid: int) -> TieredQueue | None:
        with self._lock:
            return self._queues.get((topic, qid))

    # ------------------------------------------------------------------ work

    def offer(self, records: list[DispatchInfo]) -> None:
        """The store dispatcher's listener: a batch it dispatched (its thread)."""
        with self._recent_lock:
            self._recent.append(records)
            self._recent_records += len(records)
            while self._recent_records > RECENT_RECORDS:  # lagging far behind: decode then
                self._recent_records -= len(self._recent.popleft())

    def _take_recent(self, offset: int, length: int) -> tuple[list[DispatchInfo], int]:
        """The offered records that tile ``[offset, offset + length)`` from its start, and
        the bytes they cover; ``([], 0)`` when the offers do not start at ``offset``."""
        out: list[DispatchInfo] = []
        end, limit = offset, offset + length
        with self._recent_lock:
            recent = self._recent
            while recent and recent[0][-1].commit_offset < offset:  # behind us
                self._recent_records -= len(recent.popleft())
            while recent:
                batch = recent[0]
                last = batch[-1]
                batch_end = last.commit_offset + last.record_size
                if batch[0].commit_offset != end or batch_end > limit:
                    break
                out += batch
                end = batch_end
                self._recent_records -= len(recent.popleft())
        return out, end - offset

    def step(self) -> int:
        """Read what the CommitLog confirmed since the last step, buffer it per queue
        (one append per queue and stream), and commit what is due.  Returns the records
        buffered."""
        cl = self._store.commitlog
        offset, data = cl.read_from(self._read_position, READ_CHUNK)
        infos, used = self._take_recent(offset, len(data)) if data else ([], 0)
        self._reused += len(infos)
        if data and not used:
            offset, data, infos, used = cl.decode_records(offset, data, "tiered dispatcher")
        by_queue: dict[tuple[str, int], list[DispatchInfo]] = {}
        for r in infos:
            if not r.flags & FLAG_DELAYED:
                by_queue.setdefault((r.topic, r.queue_id), []).append(r)
        buffered = 0
        view = memoryview(data)
        covered = self.index.covered
        with self._lock:
            for key, records in by_queue.items():
                topic = self._store.topics.get(key[0])
                if topic is None:
                    continue  # deleted
                if records[0].commit_offset < topic.since_offset:  # an older namesake's
                    records = [r for r in records if r.commit_offset >= topic.since_offset]
                    if not records:
                        continue
                q = self._queues.get(key)
                if q is None or q.generation != topic.since_offset:  # new, or re-created
                    q = self._queues[key] = self._new_queue(key[0], key[1],
                                                            generation=topic.since_offset)
                added, problem = q.append_batch(records, view, offset)
                if problem:
                    log.error("not uploading part of a queue: %s", problem)
                if added:
                    self.index.add_batch(key[0], key[1], q.generation, added, covered)
                    buffered += len(added)
                    if key not in self._first_unsaved:
                        self._first_unsaved[key] = added[0].commit_offset
                        self._since[key] = self._clock.monotonic_ms()
            self._read_position = offset + used
        self.commit(force=False)
        return buffered

    def commit(self, force: bool = True) -> int:
        """Upload the buffered queues that are due (all when ``force``; else each one
        whose buffer reached ``batch_bytes`` or is ``batch_ms`` old, or all when the
        buffers together exceed ``buffer_bytes``), persist their metadata, then the
        checkpoint.  Returns the queues committed."""
        with self._lock:
            cfg = self.config
            pending = [self._queues[k] for k in self._first_unsaved]
            if not force and sum(q.buffered_bytes for q in pending) <= cfg.buffer_bytes:
                now = self._clock.monotonic_ms()
                pending = [q for q in pending if q.buffered_bytes >= cfg.batch_bytes
                           or now - self._since[(q.topic, q.queue_id)] >= cfg.batch_ms]
                if not pending and self._first_unsaved:
                    return 0  # nothing due: the checkpoint cannot move either
            done = 0
            for q in pending:
                records, size = q.next_queue_offset - q.committed_queue_offset, q.buffered_bytes
                if q.commit():
                    crashpoint("tier.after_upload")
                    self._save_queue(q)
                    del self._first_unsaved[(q.topic, q.queue_id)]
                    del self._since[(q.topic, q.queue_id)]
                    done += 1
                    self._uploaded_records += records
                    self._uploaded_bytes += size
                    self._batches += 1
                else:
                    self._failed += 1
                    log.warning("upload of %s/%d failed; switched segment, will retry",
                                q.topic, q.queue_id)
            if self.index.seal_due(force):
                try:
                    self.index.seal()
                except TierError as exc:
                    log.warning("upload of a key-index file failed, will retry: %s", exc)
            self.index.persist()  # the open index file's entries, before the checkpoint
            checkpoint = min(self._first_unsaved.values(), default=self._read_position)
            if checkpoint != self._checkpoint:
                write_atomic(os.path.join(self._meta_dir, "checkpoint"), str(checkpoint).encode())
                crashpoint("tier.checkpoint")
                self._checkpoint = checkpoint
            return done

    def _save_queue(self, q: TieredQueue) -> None:
        meta = q.to_json()
        tdir = os.path.join(self._meta_dir, "queues", q.topic)
        os.makedirs(tdir, exist_ok=True)
        write_atomic(os.path.join(tdir, f"{q.queue_id}.json"), meta.encode())
        # a copy beside the data, so another broker can mount the tier read-only
        self._provider.write(f"{self._broker}/meta/{q.topic}/{q.queue_id}.json",
                             meta.encode())

    # ------------------------------------------------------------------ retention

    def tier_retention_ms(self, topic: str) -> int:
        t = self._store.topics.get(topic)
        ttl = t.tier_retention_ms if t is not None else 0
        return ttl or self.config.retention_ms

    def run_retention(self) -> int:
        """Delete what is past each topic's tier retention; returns the objects deleted."""
        now = self._clock.now_ms()
        doomed: list[str] = []
        with self._lock:
            for q in list(self._queues.values()):
                ttl = self.tier_retention_ms(q.topic)
                if ttl <= 0:
                    continue
                paths = q.expire_stored_before(now - ttl)
                if paths:
                    self._save_queue(q)  # persisted first: a crash leaves orphans only
                    doomed += paths

            def keep(f: IndexFile) -> bool:
                ttls = [self.tier_retention_ms(topic) for topic, _, _ in f.queues]
                return any(t <= 0 or f.end_ms >= now - t for t in ttls)
            doomed += self.index.expire(keep)
        for path in doomed:
            try:
                self._provider.delete(path)
            except TierError as exc:  # an orphan: costs space, never correctness
                log.warning("could not delete expired %s: %s", path, exc)
        if doomed:
            log.info("tier retention deleted %d objects", len(doomed))
        self._expired += len(doomed)
        return len(doomed)

    def statistics(self) -> TierStats:
        with self._lock:
            return TierStats(self._checkpoint, self._uploaded_records, self._uploaded_bytes,
                             self._batches, self._failed, len(self._queues),
                             len(self.index.files), self._expired, self._reused,
                             sum(q.damaged_objects for q in self._queues.values()))

    # ------------------------------------------------------------------ reads

    def min_queue_offset(self, topic: str, qid: int) -> int | None:
        q = self.queue(topic, qid)
        if q is None or q.committed_queue_offset <= q.min_queue_offset:
            return None
        return q.min_queue_offset

    def read(self, topic: str, qid: int, queue_offset: int, count: int) -> list[TieredEntry]:
        q = self.queue(topic, qid)
        return q.read(queue_offset, count) if q is not None else []

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tiered-dispatcher",
                                        daemon=True)
        self._thread.start()

    def stop(self, drain_s: float = 10.0) -> None:
        """Stop following; first catch up with the CommitLog for up to ``drain_s`` and
        upload everything read (what is left is replayed on the next start)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        try:
            deadline = self._clock.monotonic_ms() + drain_s * 1000
            while (self._read_position < self._store.commitlog.confirmed_offset
                   and self._clock.monotonic_ms() < deadline):
                self.step()
            self.commit(force=True)
        except TierError as exc:
            log.warning("final tier upload failed (replayed on start): %s", exc)
        self._uploader.shutdown(wait=False)

    def _run(self) -> None:
        cl = self._store.commitlog
        while not self._stop.is_set():
            try:
                if not self.step():
                    cl.wait_beyond(self._read_position, 0.2)
            except Exception:  # keep following; the cause is logged
                log.exception("tiered dispatch failed")
                self._stop.wait(1.0)
