"""QueueSource: where POP reads a queue's entries and messages.

A queue's messages are on local disk (the ConsumeQueue and the CommitLog), in the tier
once local retention deleted them (or the tier's read strategy sends a read there), or
all of them in another broker's tier mounted read-only.  ``bounds`` says which queue
offsets exist where; ``read_rows`` serves a Pop (entries first, then the messages of
the entries the tag filter kept); ``fill`` loads the message of each entry that goes
back for redelivery (``pop.requeue``), once ``serves`` says the queue is here at all (a
takeover adopts leases before it serves their queues: those wait, they are not lost).

A message that cannot be read (a hole in the ConsumeQueue, a damaged record, an entry
that points at another queue's record) is logged and skipped: it never blocks a queue.

Thread-safe: no state of its own besides ``tier`` and ``mounts``, set once at start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from pop.model import MountedBounds, Requeue, TierReader
from store.errors import ChronomqError, DamagedRecord, FailedPrecondition, StorageIOError
from store.message import Message, RecordError, decode_record
from store.store import MessageStore
from tiered.errors import TierError

log = logging.getLogger(__name__)

Loader = Callable[[list[int]], list[Message | None]]


class QueueBounds(NamedTuple):
    low: int  # the oldest queue offset readable (local or in the tier)
    local_low: int  # the oldest still on local disk
    high: int  # the end of the queue


class GoneLocally(Exception):
    """Raised when local retention deleted records between the read of their
    ConsumeQueue entries and the read of the records (the queue's low mark moves right
    after)."""


class QueueSource:
    """Reads for POP from local disk, the tier or a mounted tier.  Thread-safe."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self.tier: TierReader | None = None  # set: read what local retention deleted
        self.mounts: MountedBounds | None = None  # set: queues of mounted tiers

    def bounds(self, topic: str, qid: int) -> QueueBounds:
        if self.mounts is not None:
            mounted = self.mounts.bounds(topic, qid)
            if mounted is not None:  # all of it in another broker's tier
                return QueueBounds(mounted[0], mounted[1], mounted[1])
        local_low, high = self._store.queue_bounds(topic, qid)
        low = local_low
        if self.tier is not None:
            tier_low = self.tier.min_queue_offset(topic, qid)
            if tier_low is not None and tier_low < local_low:
                low = tier_low
        return QueueBounds(low, local_low, high)

    def serves(self, topic: str, qid: int) -> bool:
        """Whether this broker has the queue: a topic of its own (taken over ones too) or
        a mounted one.  A lease of a queue it does not have (yet) is not lost: a takeover
        adopts the departed broker's leases before it serves their queues
        (``cluster.takeover``), a mount may come back; only a queue served here can say
        a message is gone.  A topic held by a takeover (``store.holds``) is not served
        yet either: its leases wait until what the takeover adopts has settled them."""
        if self._store.holds.held_for(topic) is not None:
            return False
        t = self._store.topics.get(topic) or self._store.topics.mounted(topic)
        return t is not None and 0 <= qid < t.queue_count

    def read_rows(self, topic: str, qid: int, offset: int, want: int, local_low: int
                  ) -> tuple[list[tuple[int, int]], Loader]:
        """Up to ``want`` queue entries from ``offset`` as (queue offset, tag hash) rows,
        and a loader of the picked rows' messages: from the tier below the read
        strategy's floor, else from the local store.  A failing tier falls back to local
        disk when it still has the data.  The loader gives None for a row with no
        message (the caller skips it) and raises ``GoneLocally`` when retention deleted
        the records meanwhile."""
        floor = self.tier.floor(topic, qid, local_low) if self.tier is not None else 0
        if offset < floor and self.tier is not None:
            try:
                tiered = self.tier.read(topic, qid, offset, min(want, floor - offset))
            except TierError:
                if offset < local_low:
                    raise
                log.warning("tier read of %s/%d at %d failed; reading local disk", topic,
                            qid, offset, exc_info=True)
            else:
                records = [rec for _, _, _, rec in tiered]

                def load_tiered(picked: list[int]) -> list[Message | None]:
                    return [_decode_or_none(records[i], topic, qid, tiered[i][0])
                            for i in picked]
                return [(qo, tag) for qo, tag, _, _ in tiered], load_tiered
        entries = self._store.consume_queue_entries(topic, qid, offset, want)

        def load_local(picked: list[int]) -> list[Message | None]:
            present = [i for i in picked if not entries[i].is_hole]
            locations = [(entries[i].commit_offset, entries[i].record_size) for i in present]
            try:
                loaded = self._store.read_messages_skipping(locations)
            except StorageIOError:
                if all(self._store.reader.on_disk(o) for o, _ in locations):
                    raise  # an I/O error, not retention
                raise GoneLocally from None
            found: dict[int, Message] = {}
            for i, m in zip(present, loaded, strict=True):
                if isinstance(m, DamagedRecord):
                    log.error("skipping %s/%d queue offset %d: %s", topic, qid,
                              entries[i].queue_offset, m)
                elif (m.topic, m.queue_id, m.queue_offset) != (topic, qid,
                                                               entries[i].queue_offset):
                    log.error("skipping %s/%d queue offset %d: its entry points at the "
                              "record of %s/%d queue offset %d", topic, qid,
                              entries[i].queue_offset, m.topic, m.queue_id, m.queue_offset)
                else:
                    found[i] = m
            return [found.get(i) for i in picked]
        return [(e.queue_offset, e.tag_hash) for e in entries], load_local

    def fill(self, reqs: list[Requeue]) -> list[Requeue]:
        """Fill each request's message from its queue entry; returns the requests whose
        message is gone (a hole, a damaged record, or removed by retention), logged and
        left without one: they cannot be copied.  Only for queues this broker ``serves``:
        elsewhere nothing can be said gone."""
        local: list[Requeue] = []
        locations = []
        lost: list[Requeue] = []
        tiered: list[Requeue] = []
        for r in reqs:
            qo = r.ck_start + r.index
            (entry,) = self._store.consume_queue_entries(r.topic, r.queue_id, qo, 1) or (None,)
            if entry is None or entry.queue_offset != qo or entry.is_hole:  # below the
                tiered.append(r)  # local queue (retention took it), or before the offsets
                # of a topic taken over (``cluster.takeover``): a hole here, in the tier
            else:
                local.append(r)
                locations.append((entry.commit_offset, entry.record_size))
        loaded: list[Message | DamagedRecord | None]
        try:
            loaded = list(self._store.read_messages_skipping(locations))
        except StorageIOError:  # retention deleted some meanwhile: read them one by one
            loaded = [self._read_local(o, n) for o, n in locations]
        for r, m in zip(local, loaded, strict=True):
            if m is None:
                tiered.append(r)
            elif isinstance(m, DamagedRecord):
                log.error("cannot redeliver %s/%d queue offset %d: %s", r.topic, r.queue_id,
                          r.ck_start + r.index, m)
                lost.append(r)
            else:
                _take(r, m, lost)
        for r in tiered:
            qo = r.ck_start + r.index
            got = [] if self.tier is None else self.tier.read(r.topic, r.queue_id, qo, 1)
            try:
                if not got or got[0][0] != qo:
                    raise FailedPrecondition("no longer stored (removed by retention)")
                _take(r, decode_record(got[0][3]), lost)
            except (ChronomqError, RecordError, ValueError) as exc:
                log.error("cannot redeliver %s/%d queue offset %d: %s", r.topic, r.queue_id,
                          qo, exc)
                lost.append(r)
        return lost

    def _read_local(self, offset: int, size: int) -> Message | DamagedRecord | None:
        """One record from local disk; None when retention deleted it."""
        try:
            return self._store.read_messages_skipping([(offset, size)])[0]
        except StorageIOError:
            if self._store.reader.on_disk(offset):
                raise
            return None


def _take(r: Requeue, m: Message, lost: list[Requeue]) -> None:
    """``m`` becomes ``r``'s message if it is the record of ``r``'s queue entry."""
    qo = r.ck_start + r.index
    if (m.topic, m.queue_id, m.queue_offset) == (r.topic, r.queue_id, qo):
        r.message = m
    else:
        log.error("cannot redeliver %s/%d queue offset %d: its entry points at the "
                  "record of %s/%d queue offset %d", r.topic, r.queue_id, qo, m.topic,
                  m.queue_id, m.queue_offset)
        lost.append(r)


def _decode_or_none(record: bytes, topic: str, qid: int, queue_offset: int) -> Message | None:
    """A record read from the tier, or None (logged) if it fails its checks."""
    try:
        m = decode_record(record)
    except (RecordError, ValueError) as exc:
        log.error("skipping %s/%d queue offset %d: damaged record from the tier: %s", topic,
                  qid, queue_offset, exc)
        return None
    if (m.topic, m.queue_id, m.queue_offset) != (topic, qid, queue_offset):
        log.error("skipping %s/%d queue offset %d: the tier's entry points at the record of "
                  "%s/%d queue offset %d", topic, qid, queue_offset, m.topic, m.queue_id,
                  m.queue_offset)
        return None
    return m
