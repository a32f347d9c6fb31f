"""TieredDispatcher: follows the local CommitLog on its own thread and uploads each topic
queue to the tier (``tiered.queue``) in batches, with its own checkpoint, so that what the
broker holds outlives its disk.

Batches.  A queue's batch is committed when its buffer reaches ``tier.upload_batch_bytes``
or its oldest record is ``tier.upload_batch_ms`` old (every queue's when all buffers
together pass ``tier.upload_buffer_bytes``; past that it reads no more until they are
up).  A commit starts the uploads of every due queue and of a due key-index file at once
on the uploader pool and waits for them together (``tiered.uploads``): a stalled tier
costs one ``upload_timeout_s`` per commit, not one per queue; after a failed commit the
next waits a back-off.  Delayed records go up in the delayed stream
(``store.names.DELAYED_STREAM``, when the broker keeps it), so the tier holds every
pending one; a broker without it uploads them when they are delivered.

Order of durable steps.  Each uploaded queue's metadata is written locally
(``tiered.metafiles``), then the checkpoint: the CommitLog offset of the oldest record
not yet durable in the tier (the key index, ``tiered.index``, has persisted its entries
by then).  Copies of the metadata go to the tier for a broker that mounts it
(``Mirror``); until a copy is in, the position and the upload lag count its queue's
batch as not uploaded (what a mount sees); ``open`` writes every queue's copy again (a
crash may have cut one off).  With durable-ack (``record``) the lease write that
confirms a commit carries the metadata instead, and the copies follow it
(``tiered.carried``: a commit in two request rounds).  The journal's streams' copies
(``JOURNAL_STREAMS``) go in only once every other queue is in the tier up to their
records (``Mirror``, ``after``): the timer stream's records name deliveries whose
messages are in other queues, the state stream's name leases marked done for their retry
copies (``pop.requeue``), and a broker taking this one over must never read a delivery
whose message, or a mark whose copy, it cannot read (``cluster.delivered``; a mark
without its copy lost the message for its group in the failover chaos).  After a crash
it replays from the checkpoint, skipping queue offsets the tier has: nothing twice,
nothing lost.  As a log reader of the store its checkpoint is ``rewind``-ed after a torn
tail and guards local retention.

Retention (``run_retention``) is ``tiered.retention``'s: by time per topic, below their
snapshots for the system streams.

Locking: no lock is held across tier I/O.  ``_lock`` guards the queue map, what is
pending, the counters and the checkpoint value (dictionary work only: Pop, Subscribe,
Stats and Send never wait for an upload); ``_save_lock`` orders the local metadata and
checkpoint files of commit and retention; a retention pass never waits for an upload.
``step``/``commit`` come from the owner (its thread, or a test driving it while the
thread is not running); everything else is thread-safe.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from store.clock import Clock
from store.crashpoint import crashpoint
from store.message import FLAG_DELAYED, DispatchInfo
from store.names import DELAYED_STREAM, STATE_STREAM, TIMER_STREAM, is_system_stream
from store.store import MessageStore
from tiered.carried import CommitRecord, meta_path
from tiered.config import TierConfig
from tiered.durable import DurablePosition, Linger
from tiered.fold import TierFolding
from tiered.health import TierStats, upload_lag
from tiered.index import TieredIndex
from tiered.metafiles import MetaFiles
from tiered.provider import Provider
from tiered.queue import TieredEntry, TieredQueue
from tiered.recent import RecentRecords
from tiered.retention import TierRetention
from tiered.uploads import Mirror, await_uploads

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20
UPLOAD_THREADS = 16  # the uploader pool: every due queue's two objects go up at once
# the journal's streams: their records name what other queues hold (a delivery's copy,
# a lease's retry copy), so their copies in the tier wait for the rest (``Mirror``)
JOURNAL_STREAMS = (TIMER_STREAM, STATE_STREAM)
RETRY_MIN_MS, RETRY_MAX_MS = 200, 5000  # back-off after a failed commit, doubling
SYSTEM_SEGMENT_BYTES = 16 << 20  # the system streams' segments: what deletion frees at once


class TieredDispatcher:
    name = "tiered"

    def __init__(self, store: MessageStore, provider: Provider, broker: str, meta_dir: str,
                 config: TierConfig, clock: Clock) -> None:
        self._store = store
        self._provider = provider
        self._broker = broker
        self._files = MetaFiles(meta_dir)  # queues' metadata and the checkpoint, locally
        self.config = config
        self._clock = clock
        self._uploader = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="tier-upload")
        self._lock = threading.Lock()  # short: queue map, pending, counters, checkpoint
        self._save_lock = threading.Lock()  # local metadata and checkpoint files, in order
        self._queues: dict[tuple[str, int], TieredQueue] = {}
        self._first_unsaved: dict[tuple[str, int], int] = {}  # queue -> commitlog offset
        self._since: dict[tuple[str, int], float] = {}  # queue -> when it began buffering
        self._mirror = Mirror(provider, self._uploader)  # metadata copies in the tier
        # durable-ack: the metadata in the lease write that confirms a commit
        self.record = CommitRecord(self._mirror, broker, self.position)
        self._uploaded_records = self._uploaded_bytes = self._batches = 0
        self._failed = self._reused = 0
        self._consecutive = self._last_upload_ms = 0
        self._commits, self._commit_s = 0, 0.0  # commits that uploaded something, their time
        self._retry_at_ms = 0.0  # monotonic: no commit before (back-off after a failure)
        self.index = TieredIndex(provider, broker, os.path.join(meta_dir, "index"), clock,
                                 config.index_entries, config.index_ms, self._mirror)
        self._checkpoint = self._read_position = 0  # read by ``open``
        self._journal_end: dict[str, int] = {}  # a journal stream -> where its last
        #                                         buffered record ends
        self._journal_copies: dict[str, tuple[str, bytes]] = {}  # their copies to put
        #                                                           again, at start
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._recent = RecentRecords()  # what the store's dispatcher decoded (``offer``)
        # what a mount can read (checkpoint and copies in), behind the lease's gate
        self.durable = DurablePosition(0, config.upload_timeout_s)
        self.linger = Linger(config.durable_ack_ms)  # durable-ack: commits fill under load
        self.confirm_deletes: Callable[[], bool] = self.durable.confirm  # the lease held?
        # per system stream, the queue offset below which no takeover reads it any more
        self.system_floors: Callable[[], dict[str, int]] = dict
        self.retention = TierRetention(self, provider, store.topics, config, clock)
        self.folding = TierFolding(self, provider, broker, config.fold_objects,
                                   config.fold_keep_s, clock,
                                   lambda topic: self.retention.ttl_ms(topic) < 0)

    def open(self) -> None:
        """Load the queues' metadata and the checkpoint from local disk (every queue's
        copy goes to the tier again: a crash may have cut one off) and follow the store's
        log from there.  Before the store opens (it rewinds its log readers)."""
        self._files.open()
        self.index.open()
        self._checkpoint = self._read_position = self._load()
        self.durable.start_at(self._checkpoint)
        self._store.add_log_reader(self)

    # ------------------------------------------------------------------ durable ack

    def wait_durable(self, end_offset: int, timeout_s: float | None = None) -> None:
        """Return once everything below CommitLog offset ``end_offset`` is readable from
        the tier (uploaded, committed, its metadata copies in, the lease's gate passed:
        what a broker taking over reads; ``tiered.durable``)."""
        self.durable.wait(end_offset, timeout_s)

    def durable_position(self) -> int:
        """The CommitLog offset below which everything is readable from the tier (what
        ``wait_durable`` waits for)."""
        return self.durable.position()

    def _publish_durable(self) -> None:
        """After a commit: move the durable position to what the tier holds now (with a
        commit record, what it will once the record is written)."""
        with self._lock:
            position = self._checkpoint
        floor = self._floor(position)
        self.durable.publish(position if floor is None else min(position, floor[0]))

    def _floor(self, checkpoint: int) -> tuple[int, float] | None:
        """The offset below which alone a reader of the tier sees everything uploaded
        (once the next commit record is written, when carried) and when the oldest batch
        a missing copy holds back arrived (monotonic ms); None: nothing held back."""
        return self.record.floor(checkpoint) if self.record.on else self._mirror.floor()

    # ------------------------------------------------------------------ state

    def _load(self) -> int:
        for topic, qid, meta in self._files.saved_queues():
            self._queues[(topic, qid)] = self._new_queue(topic, qid, meta)
            # its copy in the tier again: a crash may have cut the last one off (the
            # timer stream's once the rest is in again, up to where the log ends: put
            # by the first ``step`` that finds nothing more to read)
            if topic in JOURNAL_STREAMS:
                self._journal_copies[topic] = (self._meta_copy(topic, qid), meta.encode())
            else:
                self._mirror.put(self._meta_copy(topic, qid), meta.encode())
        checkpoint = self._files.checkpoint()
        return self._store.commitlog.min_offset if checkpoint is None else checkpoint

    def _new_queue(self, topic: str, qid: int, meta: str | None = None,
                   generation: int = 0) -> TieredQueue:
        segment_bytes = self.config.segment_bytes
        if is_system_stream(topic):  # deleted below their snapshots, a segment at a time
            segment_bytes = min(segment_bytes, SYSTEM_SEGMENT_BYTES)
        return TieredQueue(self._provider, self._broker, topic, qid, meta, segment_bytes,
                           self.config.upload_timeout_s, self._uploader, generation,
                           self.config.segment_ms)

    def position(self) -> int:
        """The CommitLog offset below which everything is durable in the tier."""
        return self._checkpoint

    def rewind(self, offset: int) -> None:
        """Recovery after a torn tail: read again from ``offset`` when past it; the
        checkpoint moves back first (durably)."""
        with self._save_lock:
            if self._checkpoint > offset:
                self._files.save_checkpoint(offset, sync_dir=True)
                with self._lock:
                    self._checkpoint = offset
            with self._lock:
                self._read_position = min(self._read_position, offset)

    def queue(self, topic: str, qid: int) -> TieredQueue | None:
        with self._lock:
            return self._queues.get((topic, qid))

    def _queue_for(self, key: tuple[str, int], generation: int) -> TieredQueue:
        """The queue to append to: a new one for a new or re-created topic (owner)."""
        with self._lock:
            q = self._queues.get(key)
            if q is None or q.generation != generation:
                q = self._queues[key] = self._new_queue(key[0], key[1], generation=generation)
            return q

    def _full(self) -> bool:
        """The buffers together hold more than ``tier.upload_buffer_bytes`` (they could
        not go up)."""
        with self._lock:
            pending = [self._queues[k] for k in self._first_unsaved]
        return sum(q.buffered_bytes for q in pending) > self.config.upload_buffer_bytes

    # ------------------------------------------------------------------ work

    def offer(self, records: list[DispatchInfo]) -> None:
        """The store dispatcher's listener: a batch it dispatched (``tiered.recent``)."""
        self._recent.offer(records)

    def step(self) -> int:
        """Read what the CommitLog confirmed since the last step, buffer it per queue
        (one append per queue and stream), and commit what is due.  Returns the records
        buffered: none while the buffers are full (the tier is failing)."""
        if self._full():
            self.commit(force=False)
            return 0
        cl = self._store.commitlog
        offset, data = cl.read_from(self._read_position, READ_CHUNK)
        if not data and self._journal_copies:  # caught up after a start
            for path, meta in self._journal_copies.values():
                self._mirror.put(path, meta, None, self._read_position)
            self._journal_copies.clear()
        infos, used = self._recent.take(offset, len(data)) if data else ([], 0)
        self._reused += len(infos)
        if data and not used:
            offset, data, infos, used = cl.decode_records(offset, data, "tiered dispatcher")
        by_queue: dict[tuple[str, int], list[DispatchInfo]] = {}
        stream = self._store.topics.get(DELAYED_STREAM)
        for r in infos:
            if not r.flags & FLAG_DELAYED:
                by_queue.setdefault((r.topic, r.queue_id), []).append(r)
            elif stream is not None and r.commit_offset >= stream.since_offset:
                by_queue.setdefault((DELAYED_STREAM, 0), []).append(r)
        buffered = 0
        view = memoryview(data)
        covered = self.index.covered
        for key, records in by_queue.items():
            topic = self._store.topics.get(key[0])
            if topic is None:
                continue  # deleted
            if records[0].commit_offset < topic.since_offset:  # an older namesake's
                records = [r for r in records if r.commit_offset >= topic.since_offset]
                if not records:
                    continue
            q = self._queue_for(key, topic.since_offset)
            added, problem = q.append_batch(records, view, offset)
            if problem:
                log.error("not uploading part of a queue: %s", problem)
            if added:
                if key[0] in JOURNAL_STREAMS:  # its copy in the tier waits for the rest
                    self._journal_end[key[0]] = added[-1].commit_offset + added[-1].record_size
                self.index.add_batch(key[0], key[1], q.generation, added, covered)
                buffered += len(added)
                with self._lock:
                    if key not in self._first_unsaved:
                        self._first_unsaved[key] = added[0].commit_offset
                        self._since[key] = self._clock.monotonic_ms()
        with self._lock:
            self._read_position = offset + used
        self.commit(force=False)
        return buffered

    def _due(self, force: bool) -> list[TieredQueue] | None:
        """The queues to upload now; None when nothing is due (or a failed commit's
        back-off runs), so the checkpoint cannot move either."""
        cfg = self.config
        now = self._clock.monotonic_ms()
        with self._lock:
            if not force and now < self._retry_at_ms:
                return None
            pending = [self._queues[k] for k in self._first_unsaved]
            since = dict(self._since)
        batch_ms = self.linger.ms if cfg.durable_ack else cfg.upload_batch_ms
        if not force and sum(q.buffered_bytes for q in pending) <= cfg.upload_buffer_bytes:
            pending = [q for q in pending if q.buffered_bytes >= cfg.upload_batch_bytes
                       or now - since[(q.topic, q.queue_id)] >= batch_ms]
            if not pending and since:
                return None
        return pending

    def commit(self, force: bool = True) -> int:
        """Upload the buffered queues that are due (all when ``force``; else each one
        whose buffer reached ``tier.upload_batch_bytes`` or is ``tier.upload_batch_ms``
        old, or all when the buffers together exceed ``tier.upload_buffer_bytes``) and a
        due key-index file, all at once;
        persist their metadata, then the checkpoint.  Returns the queues committed."""
        if self.durable.fenced is not None:
            return 0  # taken over: nothing more goes to the tier (the successor's now)
        due = self._due(force)
        if due is None:
            if self.record.on:  # the copies' writes, not waited for, go on while idle
                failed_copies = self._mirror.sync(time.monotonic(), self.position)
                with self._lock:
                    self._failed += failed_copies
            self._publish_durable()  # a gate that failed is tried again
            return 0
        timeout_s = self.config.upload_timeout_s
        began = time.monotonic()
        deadline_s = began + timeout_s  # real time: it bounds real I/O
        sizes = [(q.next_queue_offset - q.committed_queue_offset, q.buffered_bytes)
                 for q in due]
        started = [(q, q.begin_commit()) for q in due]
        seal = self.index.begin_seal() if self.index.seal_due(force) else None
        if seal is not None:
            seal.start(self._provider, self._uploader)
        await_uploads([u for _, ups in started for u in ups if u is not None]
                      + ([seal] if seal is not None else []), timeout_s)
        done = []
        for (q, ups), (records, size) in zip(started, sizes, strict=True):
            if q.finish_commit(ups):
                done.append((q, records, size))
            else:
                log.warning("upload of %s/%d failed (%s); will retry", q.topic, q.queue_id,
                            "; ".join(u.error() for u in ups if u is not None and not u.outcome()))
        failed = len(started) - len(done)
        sealed = seal is not None and self.index.finish_seal(seal) is not None
        if seal is not None and not sealed:
            failed += 1
            log.warning("upload of key-index file %s failed (%s); will retry", seal.path,
                        seal.error())
        self._save(done, failed, sealed)
        self.linger.committed(sum(size for _, _, size in done))
        failed_copies = self._mirror.sync(  # (the copies a record carries: not waited for)
            deadline_s if self._mirror.copying() else time.monotonic(), self.position)
        with self._lock:
            self._failed += failed_copies
            if started or seal is not None:  # (a pass with nothing to upload is no commit)
                self._commits += 1
                self._commit_s += time.monotonic() - began
        self._publish_durable()
        return len(done)

    def _save(self, done: list[tuple[TieredQueue, int, int]], failed: int,
              sealed: bool) -> None:
        """Persist each uploaded queue's metadata, the key index's open file, then the
        checkpoint (never past what the metadata lists); count, and set the back-off."""
        with self._save_lock:
            for q, _, _ in done:
                crashpoint("tier.after_upload")
                since = self._since.get((q.topic, q.queue_id), self._clock.monotonic_ms())
                self._save_queue(q, floor=(self._checkpoint, since))
            self.index.persist()  # the open index file's entries, before the checkpoint
            with self._lock:
                for q, records, size in done:
                    del self._first_unsaved[(q.topic, q.queue_id)]
                    del self._since[(q.topic, q.queue_id)]
                    self._uploaded_records += records
                    self._uploaded_bytes += size
                    self._batches += 1
                self._failed += failed
                self._consecutive = self._consecutive + 1 if failed else 0
                backoff = min(RETRY_MAX_MS, RETRY_MIN_MS << min(self._consecutive, 9) >> 1)
                self._retry_at_ms = self._clock.monotonic_ms() + backoff if failed else 0.0
                if done or sealed:
                    self._last_upload_ms = self._clock.now_ms()
                checkpoint = min(self._first_unsaved.values(), default=self._read_position)
                moved = checkpoint != self._checkpoint
            if moved:
                self._files.save_checkpoint(checkpoint)
                crashpoint("tier.checkpoint")
                with self._lock:
                    self._checkpoint = checkpoint

    def _save_queue(self, q: TieredQueue, floor: tuple[int, float] | None = None) -> None:
        """Write ``q``'s metadata locally (the truth; the caller holds ``_save_lock``)
        and mark its copy in the tier due.  ``floor``: after an upload, the checkpoint
        before it (until the copy is in the tier, a mount sees only what is below it) and
        when the batch began buffering (``Mirror.put``)."""
        meta = q.to_json().encode()
        self._files.save_queue(q.topic, q.queue_id, meta)
        after = None
        if q.topic in JOURNAL_STREAMS:  # (newer than the one at start)
            after = self._journal_end.get(q.topic, 0)
            self._journal_copies.pop(q.topic, None)
        self._mirror.put(self._meta_copy(q.topic, q.queue_id), meta, floor, after)

    def publish(self, path: str, data: bytes) -> None:
        """Keep a small object in the tier up to date (the latest content, written with
        the next commit; ``tiered.uploads.Mirror``): the journal's snapshot pointer."""
        self._mirror.put(path, data)

    def _meta_copy(self, topic: str, qid: int) -> str:
        """Where the tier keeps the copy of a queue's metadata (what a mount reads)."""
        return meta_path(self._broker, topic, qid)

    # ------------------------------------------------------------------ retention

    def run_retention(self) -> int:
        """Delete what is past each topic's tier retention (``tiered.retention``), then
        fold the small objects left (``tiered.fold``); returns the objects retention
        deleted."""
        expired = self.retention.run()
        self.folding.run()
        return expired

    @property
    def fenced(self) -> bool:
        return self.durable.fenced is not None

    def queues(self) -> list[tuple[tuple[str, int], TieredQueue]]:
        with self._lock:
            return list(self._queues.items())

    def save_if_current(self, key: tuple[str, int], q: TieredQueue) -> bool:
        with self._save_lock:
            if self.queue(*key) is not q:
                return False
            self._save_queue(q)
            return True

    # ------------------------------------------------------------------ health

    def statistics(self) -> TierStats:
        """Counters and health, as a reader of the tier (a mount) sees it: ``position``
        is the checkpoint, or lower while a copy of uploaded queues' metadata is not in
        the tier yet; ``upload_lag_s`` is the age of the oldest record not yet readable
        from the tier (at the checkpoint, or of a batch whose copy is missing)."""
        with self._lock:
            queues, checkpoint = list(self._queues.values()), self._checkpoint
            buffering = min(self._since.values(), default=None)  # the oldest batch's start
            stats = TierStats(checkpoint, self._uploaded_records, self._uploaded_bytes,
                              self._batches, self._failed, len(queues), len(self.index.files),
                              self.retention.expired, self._reused,
                              last_upload_ms=self._last_upload_ms,
                              consecutive_failures=self._consecutive,
                              commits=self._commits, commit_seconds=self._commit_s)
        floor = self._floor(checkpoint)
        position, lag_s = upload_lag(self._store.commitlog, checkpoint, buffering, floor,
                                     self._clock)
        lag_bytes = self._store.commitlog.confirmed_offset - position
        return dataclasses.replace(stats, position=position, upload_lag_bytes=max(0, lag_bytes),
                                   upload_lag_s=lag_s,
                                   damaged_objects=sum(q.damaged_objects for q in queues))

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
        upload everything read (what is left, or all if the thread is stuck, is replayed
        on the next start: never two owners).  Uploads still running (a stalled S3)
        hold the process's exit until the S3 time-outs end them."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(30)
        if thread is not None and thread.is_alive():
            log.warning("the tier dispatcher did not stop within 30 s; not draining")
        else:
            deadline = self._clock.monotonic_ms() + drain_s * 1000
            while (self._read_position < self._store.commitlog.confirmed_offset
                   and self._clock.monotonic_ms() < deadline):
                if not self.step() and self._full():
                    break  # the tier is failing
            self.commit(force=True)
        self.durable.stop()
        self.folding.close()
        self._uploader.shutdown(wait=False, cancel_futures=True)

    def _poll_s(self) -> float:
        """The longest wait for new records: with durable-ack, until the oldest batch
        lingering is due (``tier.durable_ack_ms`` at most)."""
        if not self.config.durable_ack:
            return 0.2
        wait_ms = float(self.config.durable_ack_ms)
        with self._lock:
            oldest = min(self._since.values(), default=None)
        if self.linger.ms and oldest is not None:
            due_in = oldest + self.linger.ms - self._clock.monotonic_ms()
            wait_ms = min(wait_ms, max(1.0, due_in))
        return wait_ms / 1000

    def _run(self) -> None:
        cl = self._store.commitlog
        while not self._stop.is_set():
            try:
                if self.step():
                    continue
                if self._full():  # the tier is failing: wait, read nothing more
                    self._stop.wait(0.1)
                else:
                    cl.wait_beyond(self._read_position, self._poll_s())
            except Exception:  # keep following; the cause is logged
                log.exception("tiered dispatch failed")
                self._stop.wait(1.0)
