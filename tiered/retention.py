"""TierRetention: what the tier keeps of each queue the dispatcher uploads, and for how
long.

Topic data by time, per topic (``tier_retention_ms``, else ``tier.retention_ms``; 0 keeps
forever): whole segments whose data is all older leave the queue's metadata, it is
persisted, then their objects are deleted; key-index files go when every topic they
index is past retention.  A deleted topic's segments all go at the next pass (its
deletion is in the catalogue's copy in the tier before DeleteTopic answers, so no
takeover reads them; a namesake created since has queues of its own).  System streams
never by time: only below the floors their snapshots set (``system_floors``, from
``cluster.compaction``), where no takeover reads them any more.

Order of durable steps: the metadata without the segments first, then the deletes, and
those only while the broker still holds its lease (``confirm_deletes``): a crash between
the two leaves orphan objects (space, never correctness); a broker taken over deletes
nothing its successor may read.  Named crash points: ``tier_retention.after_metadata``,
``tier_retention.mid_delete``.  One pass at a time; a pass never waits for an upload
(the dispatcher's locks are held for dictionary work only).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from store.clock import Clock
from store.crashpoint import crashpoint
from store.names import is_system_stream
from store.topics import TopicCatalogue
from tiered.config import TierConfig
from tiered.errors import TierError
from tiered.index import IndexFile, TieredIndex
from tiered.provider import Provider
from tiered.queue import TieredQueue

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
MAX_MS = (1 << 63) - 1  # stored before it: every entry


class Uploads(Protocol):
    """What retention needs of the dispatcher whose queues it trims."""

    index: TieredIndex
    confirm_deletes: Callable[[], bool]  # the lease still held (deletes are safe)
    system_floors: Callable[[], dict[str, int]]  # stream -> offset no takeover reads below

    @property
    def fenced(self) -> bool: ...

    def queues(self) -> list[tuple[QueueKey, TieredQueue]]: ...

    def save_if_current(self, key: QueueKey, q: TieredQueue) -> bool:
        """Persist ``q``'s metadata if it is still the queue of ``key`` (not re-created
        meanwhile); True when saved."""
        ...


class TierRetention:
    def __init__(self, uploads: Uploads, provider: Provider, topics: TopicCatalogue,
                 config: TierConfig, clock: Clock) -> None:
        self._uploads = uploads
        self._provider = provider
        self._topics = topics
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()  # one pass at a time
        self.expired = 0  # objects deleted since start

    def ttl_ms(self, topic: str) -> int:
        """How long the tier keeps ``topic``'s data (0: forever); -1 for a deleted topic:
        none of it."""
        t = self._topics.get(topic)
        if t is None:
            return -1 if not is_system_stream(topic) else self._config.retention_ms
        return t.tier_retention_ms or self._config.retention_ms

    def run(self) -> int:
        """Delete what is past each topic's tier retention; returns the objects deleted.
        0 at once when another pass is running or the broker was taken over."""
        if self._uploads.fenced or not self._lock.acquire(blocking=False):
            return 0
        try:
            doomed = self._expire(self._clock.now_ms())
        finally:
            self._lock.release()
        if not doomed:
            return 0
        crashpoint("tier_retention.after_metadata")
        if not self._uploads.confirm_deletes():
            return 0  # taken over (or not sure): the successor may read them, keep them
        for i, batch in enumerate((doomed[:1], doomed[1:])):  # after the metadata: a
            try:                                               # crash leaves orphans only
                if batch:
                    self._provider.delete_many(batch)  # (S3: 1,000 a request)
            except TierError as exc:  # orphans: cost space, never correctness
                log.warning("could not delete %d expired objects: %s", len(batch), exc)
            if i == 0:
                crashpoint("tier_retention.mid_delete")
        log.info("tier retention deleted %d objects", len(doomed))
        self.expired += len(doomed)
        return len(doomed)

    def _expire(self, now: int) -> list[str]:
        """Drop what is past retention from the metadata and persist it; returns the
        object paths to delete."""
        doomed: list[str] = []
        queues = self._uploads.queues()
        floors = self._uploads.system_floors() \
            if any(is_system_stream(q.topic) for _, q in queues) else {}
        for key, q in queues:
            if is_system_stream(q.topic):  # never by time: below their snapshots only
                floor = floors.get(q.topic, 0)
                paths = q.expire_below(floor) if floor > 0 else []
            else:  # a deleted topic's every segment (its data never comes back)
                ttl = self.ttl_ms(q.topic)
                paths = q.expire_stored_before(now - ttl) if ttl > 0 else \
                    q.expire_stored_before(MAX_MS) if ttl < 0 else []
            if paths and self._uploads.save_if_current(key, q):  # else re-created: orphans
                doomed += paths

        def keep(f: IndexFile) -> bool:
            ttls = [self.ttl_ms(topic) for topic, _, _ in f.queues]
            return any(t == 0 or (t > 0 and f.end_ms >= now - t) for t in ttls)
        return doomed + self._uploads.index.expire(keep)
