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
its Stats as ``tier.upload_lag_s``).  Metadata read at mount time (the queues' copies at
once, ``index_threads`` reads at a time): a mount of a broker
that is still running sees a snapshot (mount again to refresh; after ``tier.fold_keep_s``
the objects its folds replaced may be gone, ``tiered.fold``).

QueryMessages by key or id reads the departed broker's key index
(``tiered.mountindex.MountIndex``: its sealed files in the tier, and what they miss
indexed here on the first query).  ``stored_since`` is the same lookup for a broker that
took the topics over (its send dedupe), limited to the files of a time window that list
the topic, and to what that broker serves of this one (``serve_below``: the ends its
takeover took, not what landed in the tier since: a commit this broker had on its way
when it was fenced still lands, with plain PUTs, and no broker serves it).

``MountReader`` is the POP service's tier reader with the mounts in front: a mounted
queue is read from the tier entirely; any other queue goes to the broker's own tiered
reader (its uploads), if it has one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from store.errors import FailedPrecondition, InvalidArgument
from store.message import FLAG_ASSIGNED_ID, FLAG_FOREIGN_ID, Message, decode_record
from store.names import DELAYED_STREAM, is_name, is_system_stream, split_broker_made
from tiered.carried import carried, meta_prefix, read_meta
from tiered.errors import TierError, TierNotFound
from tiered.index import IndexHit, id_digest, key_digest
from tiered.mountindex import TAIL_THREADS, MountIndex, first_offset_stored
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

    def __init__(self, provider: Provider, broker: str, work_dir: str,
                 empty: bool = False, index_threads: int = TAIL_THREADS,
                 lazy: bool = False) -> None:
        """``work_dir``: a local directory of the serving broker's for this mount's
        index slot caches.  ``empty``: a broker with no queue in the tier is mounted too
        (a takeover of one that made topics and never uploaded a message), else
        ``TierNotFound``.  ``index_threads``: queues whose tails its key index reads at
        once.  ``lazy``: the tier is read at the first use, not now (a link of a chain
        of takeovers, whose older offsets are seldom read: a takeover mounting a chain of
        a hundred brokers read each one's metadata, and took seconds); ``empty`` then,
        and a first use that cannot read the tier raises ``TierError`` and is tried
        again at the next."""
        if not is_name(broker):
            raise InvalidArgument(f"broker name {broker[:140]!r} is invalid")
        self.broker = broker
        self._provider, self._empty, self._threads = provider, empty or lazy, index_threads
        self._load_lock = threading.Lock()
        self._loaded = False
        self._served_lock = threading.Lock()
        self._served: dict[tuple[str, int], int] | None = None  # (``serve_below``)
        self._told: dict[tuple[str, int], int] = {}  # ``serve_below`` before the load
        self._queues_read: dict[tuple[str, int], TieredQueue] = {}
        self.index = MountIndex(provider, broker, work_dir, self._queues_read, index_threads,
                                self._served_end)
        if not lazy:
            self._load()

    @property
    def _queues(self) -> dict[tuple[str, int], TieredQueue]:
        if not self._loaded:
            self._load()
        return self._queues_read

    def _load(self) -> None:
        with self._load_lock:
            if self._loaded:
                return
            self._read_queues()
            self._loaded = True

    def _read_queues(self) -> None:
        provider, broker = self._provider, self.broker
        prefix = meta_prefix(broker)
        lease = carried(provider, broker)  # first: see ``tiered.carried``
        found: list[tuple[str, str, int]] = []
        for path in sorted(set(provider.list(prefix)) | set(lease)):
            topic, _, name = path[len(prefix):].partition("/")
            qid_text = name.removesuffix(".json")
            if not (is_name(topic) or split_broker_made(topic) or is_system_stream(topic)) \
                    or not qid_text.isdigit() or not name.endswith(".json"):
                continue  # not a queue's metadata (or a name no topic can have)
            found.append((path, topic, int(qid_text)))

        def one(item: tuple[str, str, int]) -> TieredQueue | None:
            path, topic, qid = item
            try:
                meta = read_meta(provider, path, lease)
                if meta is None:
                    return None  # deleted since the listing (its topic was)
                return TieredQueue(provider, broker, topic, qid, meta.decode())
            except (UnicodeDecodeError, ValueError, KeyError, TierError) as exc:
                log.error("mount of %s: skipping %s: %s", broker, path, exc)
                return None

        if len(found) > 1:  # a read each, at once (a takeover waits for its mounts)
            with ThreadPoolExecutor(min(len(found), self._threads),
                                    thread_name_prefix="mount-meta") as pool:
                queues = list(pool.map(one, found))
        else:
            queues = [one(item) for item in found]
        for (_, topic, qid), q in zip(found, queues, strict=True):
            if q is not None:
                self._queues_read[(topic, qid)] = q
        if not self._queues_read and not self._empty:
            raise TierNotFound(f"broker {broker!r} has no queues in the tier (nothing "
                               f"under {prefix}: was tier.upload on?)")

    def topics(self) -> dict[str, int]:
        """Topic -> queue count (the highest queue id seen, plus one)."""
        out: dict[str, int] = {}
        for topic, qid in self._queues:
            if not is_system_stream(topic):  # the broker's own streams: read by a takeover
                out[topic] = max(out.get(topic, 0), qid + 1)
        return out

    def keep(self, live: Callable[[str, int], bool]) -> list[tuple[str, int]]:
        """Serve from now on only the queues of its topics for which ``live(topic,
        generation)`` (a takeover: those of topics the departed broker did not delete,
        ``cluster.catalogue``); its system streams are kept.  Returns the queues
        dropped."""
        dropped = [key for key, q in self._queues.items()
                   if not is_system_stream(key[0]) and not live(key[0], q.generation)]
        for key in dropped:
            del self._queues[key]
        return dropped

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

    def scan(self, topic: str, queue_id: int, queue_offset: int) -> Iterator[TieredEntry]:
        """Every readable entry of a mounted queue from ``queue_offset`` on, in order
        (``TieredQueue.scan``: the log read alone); nothing if not mounted here."""
        q = self._queues.get((topic, queue_id))
        return q.scan(queue_offset) if q is not None else iter(())

    def last_stored_ms(self, topics: list[str]) -> int:
        """The store time of the latest record of ``topics`` here (0: none), from their
        queues' metadata (``_last_at``)."""
        return max((_last_at(q) for (topic, _), q in self._queues.items()
                    if topic in topics), default=0)

    def latest_stored_ms(self) -> int:
        """The store time of the latest record of its topics' queues in the tier (0:
        none), by its clock, from their metadata (``_last_at``)."""
        return max((_last_at(q) for (topic, _), q in self._queues.items()
                    if not is_system_stream(topic)), default=0)

    def first_stored(self, topic: str, queue_id: int, lo: int, hi: int, at_ms: int) -> int:
        """The first queue offset in ``[lo, hi)`` of a mounted queue stored at or after
        ``at_ms``; ``hi`` if none (or not mounted)."""
        q = self._queues.get((topic, queue_id))
        return hi if q is None else first_offset_stored(q, lo, hi, at_ms)

    def serve_below(self, ends: dict[str, dict[int, int]]) -> None:
        """What a broker that took this one over serves of it: queue offsets below
        ``ends[topic][queue]``, and of the delayed stream (the pending messages it
        adopted) those below ``ends[DELAYED_STREAM][0]``, else below this mount's end at
        the first call (a takeover adopts from the mount it serves).  ``stored_since``
        counts only these.  Called again, it adds to what it was told."""
        with self._served_lock:
            told = self._told if self._served is None else self._served
            for topic, queues in ends.items():
                told.update(((topic, q), end) for q, end in queues.items())
            if self._served is None and self._loaded:  # (a lazy mount: at its first use)
                self._settle_served()

    def _settle_served(self) -> None:
        """What ``serve_below`` was told, with the delayed stream's end now if it was
        not told that.  Under ``_served_lock``."""
        if self._served is None and self._told:
            bounds = self.bounds(DELAYED_STREAM, 0)
            self._served = {(DELAYED_STREAM, 0): bounds[1] if bounds else 0, **self._told}

    def _served_end(self, queue: tuple[str, int]) -> int | None:
        """The end of ``queue`` (topic, queue id) the broker asking serves; None: it
        was told none (``serve_below``), all of it counts."""
        with self._served_lock:
            self._settle_served()
            return None if self._served is None else self._served.get(queue, 0)

    def _served_only(self, hits: list[IndexHit]) -> list[IndexHit]:
        with self._served_lock:
            self._settle_served()
        served = self._served
        if served is None:
            return hits
        return [h for h in hits if h.queue_offset < served.get((h.topic, h.queue_id), 0)]

    # ------------------------------------------------------------------ queries

    def warm(self, since_ms: int) -> None:
        """Index now what ``stored_since(..., since_ms)`` would at its first call."""
        self._load()  # (the index reads the queues)
        self.index.warm(since_ms)

    def _found(self, hits: list[IndexHit]) -> list[Message]:
        out = []
        seen: set[tuple[str, int, int]] = set()  # a tail that overlaps a sealed file
        for h in hits:
            q = self._queues.get((h.topic, h.queue_id))
            if q is None or q.generation != h.generation or \
                    (h.topic, h.queue_id, h.queue_offset) in seen:
                continue
            seen.add((h.topic, h.queue_id, h.queue_offset))
            entries = q.read(h.queue_offset, 1)
            if entries and entries[0].queue_offset == h.queue_offset:
                out.append(decode_record(entries[0].record))
        return out

    def query_by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        """The newest ``limit`` messages of ``topic`` with ``key`` (oldest first)."""
        self._load()
        if limit <= 0:
            return []
        found = [m for m in self._found(self.index.lookup(key_digest(topic, key)))
                 if m.topic == topic and m.key == key]
        found.sort(key=lambda m: (m.store_at_ms, m.queue_id, m.queue_offset))
        return found[-limit:]

    def query_by_message_id(self, message_id: str) -> list[Message]:
        self._load()
        return [m for m in self._found(self.index.lookup(id_digest(message_id)))
                if m.message_id == message_id][:1]

    def stored_since(self, topic: str, message_id: str, since_ms: int) -> int | None:
        """When this broker last stored a message of ``topic`` with the client-chosen id
        ``message_id`` (a delayed one too, wherever it was since) at or after
        ``since_ms``, of what the broker asking serves (``serve_below``); None: the tier
        holds none.  What a broker that took ``topic`` over
        asks to drop a resend (``cluster.takeover``).  Raises ``TierError``."""
        self._load()
        found = [m.store_at_ms for m in self._found(self._served_only(self.index.lookup_since(
                     id_digest(message_id), topic, since_ms)))
                 if m.topic == topic and m.message_id == message_id
                 and m.flags & (FLAG_FOREIGN_ID | FLAG_ASSIGNED_ID) == FLAG_FOREIGN_ID
                 and m.store_at_ms >= since_ms]
        return max(found, default=None)

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
        # taken-over topics: their broker of origin and each queue's end there
        self._before: dict[str, list[tuple[MountedBroker, dict[int, int]]]] = {}

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

    def adopt(self, mounted: MountedBroker, ends: dict[str, dict[int, int]]) -> None:
        """Serve queue offsets below ``ends[topic][queue]`` of topics this broker took
        over (``cluster.takeover``) from ``mounted``, the broker they came from; the
        offsets from there on are this broker's own.  Called once per broker of a chain
        (a broker that had itself taken the topics over from another): each serves the
        offsets below its end and from the previous broker's end on."""
        mounted.serve_below(ends)  # and only these count as its ids (``stored_since``)
        with self._lock:
            for topic, queues in ends.items():
                chain = [b for b in self._before.get(topic, []) if b[0].broker != mounted.broker]
                chain.append((mounted, dict(queues)))
                self._before[topic] = chain

    def forget(self, topic: str) -> None:
        """Serve no older offsets of ``topic`` (and its retry and dead-letter topics)
        from the brokers it was taken over from: the name is created anew here."""
        with self._lock:
            for t in [t for t in self._before
                      if t == topic or (split_broker_made(t) or ("", "", ""))[2] == topic]:
                del self._before[t]

    def adopted(self) -> dict[str, str]:
        """Topic -> the broker it was taken over from (the last of a chain)."""
        with self._lock:
            return {t: max(chain, key=lambda b: max(b[1].values(), default=0))[0].broker
                    for t, chain in self._before.items()}

    def _earlier(self, topic: str, queue_id: int, queue_offset: int | None = None
                 ) -> tuple[MountedBroker, int] | None:
        """The broker of origin that holds ``queue_offset`` of a taken-over queue and its
        end there (``queue_offset`` None: the last of the chain)."""
        chain = self._before.get(topic)
        if not chain:
            return None
        ranked = sorted(((m, e.get(queue_id, 0)) for m, e in chain), key=lambda b: b[1])
        ranked = [b for b in ranked if b[1] > 0]
        if not ranked:
            return None
        if queue_offset is None:
            return ranked[-1]
        return next((b for b in ranked if queue_offset < b[1]), None)

    def _first(self, topic: str, queue_id: int) -> tuple[MountedBroker, int] | None:
        chain = self._before.get(topic)
        ranked = sorted(((m, e.get(queue_id, 0)) for m, e in chain or []), key=lambda b: b[1])
        return next((b for b in ranked if b[1] > 0), None)

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
        first = self._first(topic, queue_id)
        if first is not None:
            b = first[0].bounds(topic, queue_id)
            if b is not None:
                return b[0]
        return self._own.min_queue_offset(topic, queue_id) if self._own is not None else None

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        m = self._by_topic.get(topic)
        if m is not None:
            b = m.bounds(topic, queue_id)
            return b[1] if b is not None else 0
        own = self._own.floor(topic, queue_id, local_low) if self._own is not None else 0
        earlier = self._earlier(topic, queue_id)
        return max(own, earlier[1]) if earlier is not None else own

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> Sequence[tuple[int, int, int, bytes]]:
        m = self._by_topic.get(topic)
        if m is not None:
            return m.read(topic, queue_id, queue_offset, count)
        earlier = self._earlier(topic, queue_id, queue_offset)
        if earlier is not None:
            return earlier[0].read(topic, queue_id, queue_offset,
                                   min(count, earlier[1] - queue_offset))
        if self._own is None:
            return []
        return self._own.read(topic, queue_id, queue_offset, count)


def _last_at(q: TieredQueue) -> int:
    """The store time of the latest committed record of ``q`` (0: none), from its
    consume-queue metadata; a queue whose metadata predates the store times is read."""
    end = q.committed_queue_offset
    if end <= q.min_queue_offset:
        return 0
    at = max((seg.last_at_ms for seg in q.cq.meta.segments if seg.length), default=0)
    if not at:
        got = q.read(end - 1, 1)
        at = got[-1].store_at_ms if got else 0
    return at
