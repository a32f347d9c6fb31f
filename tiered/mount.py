"""A departed broker's tier, mounted read-only by a surviving broker.

The tier is shared storage: a broker that uploads (``tier.upload``) keeps beside its
data a copy of every queue's metadata, ``<broker>/meta/<topic>/<queue>.json`` (the
tiered dispatcher's mirror).  From those alone another broker can open the departed
broker's queues (``TieredQueue`` over the same objects, never written) and serve them:
``MountedBroker`` lists the topics and the queues, gives each queue's bounds (oldest
offset still in the tier, end of what was committed) and reads entries by queue offset.

What a mount can see: what the departed broker had uploaded and committed when it left.
Messages it acknowledged but had not uploaded yet are not there: the upload lag is the
loss window (bounded by ``tier.upload_batch_ms`` / ``upload_batch_bytes``, reported in
its Stats as ``tier.upload_lag_s``).  Metadata read at mount time: a mount of a broker
that is still running sees a snapshot (mount again to refresh).

QueryMessages by key or id reads the departed broker's sealed key-index files (their
catalogue's copy in the tier), the same digests its own broker would look up.

``MountReader`` is the POP service's tier reader with the mounts in front: a mounted
queue is read from the tier entirely; any other queue goes to the broker's own tiered
reader (its uploads), if it has one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Protocol

from store.clock import SystemClock
from store.errors import FailedPrecondition, InvalidArgument
from store.message import Message, decode_record
from store.names import is_name
from tiered.errors import TierError, TierNotFound
from tiered.index import IndexFile, IndexHit, TieredIndex, id_digest, key_digest
from tiered.provider import Provider
from tiered.queue import TieredEntry, TieredQueue

log = logging.getLogger(__name__)


class OwnTierReader(Protocol):
    """The broker's own tiered reader (``tiered.reader.TieredReader``)."""

    def min_queue_offset(self, topic: str, queue_id: int) -> int | None: ...

    def floor(self, topic: str, queue_id: int, local_low: int) -> int: ...

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> Sequence[tuple[int, int, int, bytes]]: ...


class MountedBroker:
    """The queues of broker ``broker`` in the tier on ``provider``, read-only."""

    def __init__(self, provider: Provider, broker: str, work_dir: str) -> None:
        """``work_dir``: a local directory of the serving broker's for this mount's
        index slot caches."""
        if not is_name(broker):
            raise InvalidArgument(f"broker name {broker[:140]!r} is invalid")
        self.broker = broker
        self._provider = provider
        self._work_dir = work_dir
        self._index_files: list[IndexFile] | None = None
        self._index_reader: TieredIndex | None = None
        self._queues: dict[tuple[str, int], TieredQueue] = {}
        prefix = f"{broker}/meta/"
        for path in provider.list(prefix):
            topic, _, name = path[len(prefix):].partition("/")
            qid_text = name.removesuffix(".json")
            if not is_name(topic) or not qid_text.isdigit() or not name.endswith(".json"):
                continue  # not a queue's metadata (or a name no topic can have)
            try:
                meta = provider.read(path).decode()
                self._queues[(topic, int(qid_text))] = TieredQueue(
                    provider, broker, topic, int(qid_text), meta)
            except (TierNotFound, UnicodeDecodeError, ValueError, KeyError,
                    TierError) as exc:
                log.error("mount of %s: skipping %s: %s", broker, path, exc)
        if not self._queues:
            raise TierNotFound(f"broker {broker!r} has no queues in the tier (nothing "
                               f"under {prefix}: was tier.upload on?)")

    def topics(self) -> dict[str, int]:
        """Topic -> queue count (the highest queue id seen, plus one)."""
        out: dict[str, int] = {}
        for topic, qid in self._queues:
            out[topic] = max(out.get(topic, 0), qid + 1)
        return out

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """``(oldest, end)`` queue offsets of a mounted queue; None if not mounted here."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return None
        end = max(q.committed_queue_offset, 0)
        return min(q.min_queue_offset, end), end

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> list[TieredEntry]:
        q = self._queues.get((topic, queue_id))
        return q.read(queue_offset, count) if q is not None else []

    # ------------------------------------------------------------------ queries

    def _index(self) -> tuple[TieredIndex, list[IndexFile]] | None:
        """The departed broker's sealed key-index files, from its catalogue's copy in the
        tier (read once; the files its open index still held when it left are not
        there: QueryMessages misses at most its last ``tier.index_ms`` of keys)."""
        if self._index_files is None:
            try:
                raw = json.loads(self._provider.read(f"{self.broker}/index/catalog.json"))
                files = [IndexFile(**{**f, "queues": [tuple(q) for q in f["queues"]]})
                         for f in raw["files"]]
            except TierNotFound:
                files = []
            except (ValueError, KeyError, TypeError) as exc:
                log.error("mount of %s: its key-index catalogue is damaged: %s",
                          self.broker, exc)
                files = []
            self._index_files = files
            self._index_reader = TieredIndex(self._provider, self.broker,
                                             os.path.join(self._work_dir, "index"),
                                             SystemClock())
        assert self._index_reader is not None
        return (self._index_reader, self._index_files) if self._index_files else None

    def _found(self, hits: list[IndexHit]) -> list[Message]:
        out = []
        for h in hits:
            q = self._queues.get((h.topic, h.queue_id))
            if q is None or q.generation != h.generation:
                continue
            entries = q.read(h.queue_offset, 1)
            if entries and entries[0].queue_offset == h.queue_offset:
                out.append(decode_record(entries[0].record))
        return out

    def query_by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        """The newest ``limit`` messages of ``topic`` with ``key`` (oldest first)."""
        index = self._index()
        if index is None or limit <= 0:
            return []
        reader, files = index
        found = [m for m in self._found(reader.lookup(key_digest(topic, key), files))
                 if m.topic == topic and m.key == key]
        found.sort(key=lambda m: (m.store_at_ms, m.queue_id, m.queue_offset))
        return found[-limit:]

    def query_by_message_id(self, message_id: str) -> list[Message]:
        index = self._index()
        if index is None:
            return []
        reader, files = index
        return [m for m in self._found(reader.lookup(id_digest(message_id), files))
                if m.message_id == message_id][:1]

    def messages(self) -> int:
        """Messages the mount can serve (from each queue's oldest to its end)."""
        total = 0
        for topic, qid in self._queues:
            bounds = self.bounds(topic, qid)
            if bounds is not None:
                total += bounds[1] - bounds[0]
        return total


class MountReader:
    """The POP service's tier reader: mounted queues from their broker's tier, the rest
    from this broker's own tiered reader (or nowhere).  Thread-safe."""

    def __init__(self, own: OwnTierReader | None) -> None:
        self._own = own
        self._lock = threading.Lock()
        self._mounts: dict[str, MountedBroker] = {}  # broker -> mount
        self._by_topic: dict[str, MountedBroker] = {}

    def mount(self, mounted: MountedBroker, local_topics: set[str]) -> list[str]:
        """Serve ``mounted``'s topics; returns them.  A topic this broker has itself or
        another mount serves is refused (``FailedPrecondition``)."""
        with self._lock:
            clash = sorted(t for t in mounted.topics()
                           if t in local_topics or (t in self._by_topic and
                                                    self._by_topic[t].broker != mounted.broker))
            if clash:
                raise FailedPrecondition(f"cannot mount {mounted.broker}: topic(s) "
                                         f"{', '.join(clash)} exist here already")
            self.unmount(mounted.broker, locked=True)
            self._mounts[mounted.broker] = mounted
            for t in mounted.topics():
                self._by_topic[t] = mounted
            return sorted(mounted.topics())

    def unmount(self, broker: str, locked: bool = False) -> list[str]:
        """Stop serving ``broker``'s topics; returns them."""
        if not locked:
            with self._lock:
                return self.unmount(broker, locked=True)
        gone = self._mounts.pop(broker, None)
        if gone is None:
            return []
        for t in gone.topics():
            self._by_topic.pop(t, None)
        return sorted(gone.topics())

    def mounted(self, topic: str) -> MountedBroker | None:
        return self._by_topic.get(topic)

    def mounts(self) -> dict[str, MountedBroker]:
        with self._lock:
            return dict(self._mounts)

    # ------------------------------------------------------------------ TierReader

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        m = self._by_topic.get(topic)
        return m.bounds(topic, queue_id) if m is not None else None

    def min_queue_offset(self, topic: str, queue_id: int) -> int | None:
        m = self._by_topic.get(topic)
        if m is not None:
            b = m.bounds(topic, queue_id)
            return b[0] if b is not None else None
        return self._own.min_queue_offset(topic, queue_id) if self._own is not None else None

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        m = self._by_topic.get(topic)
        if m is not None:
            b = m.bounds(topic, queue_id)
            return b[1] if b is not None else 0
        return self._own.floor(topic, queue_id, local_low) if self._own is not None else 0

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> Sequence[tuple[int, int, int, bytes]]:
        m = self._by_topic.get(topic)
        if m is not None:
            return m.read(topic, queue_id, queue_offset, count)
        if self._own is None:
            return []
        return self._own.read(topic, queue_id, queue_offset, count)
