"""QueueLeaser: what one Pop leases, read from a group's queues into PopCheckpoints.

A Pop takes, in turn: a share of the entries held for their keys (``pop.flowcontrol``),
its retry topic up to half of what it asks for, the topic's queues (round robin from
``LeaseBook.next_queue``), the retry topic again, then held entries for the rest, so no
backlog of one kind starves another.  Each queue read becomes one PopCheckpoint: entries
the tag filter drops, holes and tag-hash collisions are marked done at once; an entry
whose key is at its limit is *held* (deadline ``HELD``) and the Pop reads on, up to
``HOLD_ROUNDS`` reads.  A read that local retention overtakes (``GoneLocally``) is made
again from where the queue is now, once.

The leaser only builds the leases and their writes (``Leased``); the caller
(``pop.service``) makes them durable before any message leaves, and schedules their
deadlines.  Not thread-safe: the caller holds the book's lock of (group, topic).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from pop.checkpoint import HELD, PopCheckpoint
from pop.flowcontrol import FlowControl, HeldEntry
from pop.handle import ReceiptHandle
from pop.leasebook import LeaseBook
from pop.model import Deadline, PoppedMessage, TagFilter
from pop.settle import PROP_LEASE
from pop.source import GoneLocally, Loader, QueueSource
from store.errors import ChronomqError
from store.message import Message

log = logging.getLogger(__name__)

HOLD_ROUNDS = 16  # reads of a Pop that held what it read, before it answers with less


class Leased(NamedTuple):
    """What a Pop leased from some queues: the messages, the writes that must be durable
    before they leave, the new leases' deadlines, and how many entries it held for their
    keys (``pop.flowcontrol``)."""

    messages: list[PoppedMessage]
    puts: list[tuple[bytes, bytes]]
    deadlines: list[Deadline]
    held: int = 0


_NOTHING = Leased([], [], [])


class QueueLeaser:
    """Leases for one Pop at a time per (group, topic); see the module docstring."""

    def __init__(self, book: LeaseBook, source: QueueSource, flow: FlowControl) -> None:
        self._book = book
        self._source = source
        self._flow = flow

    def lease(self, group: str, topic: str, rtopic: str, retry: bool, queue_count: int,
              max_messages: int, now: int, expire: int, tf: TagFilter) -> Leased:
        """Up to ``max_messages`` leases of ``topic`` and (``retry``: it exists) of its
        retry topic ``rtopic``, each until ``expire``."""
        flow = self._flow
        share = flow.first_share(group, max_messages)
        out = self._hand_out(group, topic, rtopic, share, now, expire)
        plan = [(rtopic, 1, (max_messages + 1) // 2)] if retry else []
        plan.append((topic, queue_count, max_messages))
        if retry:
            plan.append((rtopic, 1, max_messages))
        for ltopic, queues, limit in plan:
            for _ in range(HOLD_ROUNDS):  # what it held does not count: read on
                want = min(limit, max_messages) - len(out.messages)
                want = flow.read_room(group, topic, want)  # none past max_held
                if want <= 0:
                    break
                got = self._lease(group, ltopic, topic, queues, want, now, expire, tf)
                out = _join(out, got)
                if not got.held:
                    break
        return _join(out, self._hand_out(group, topic, rtopic,
                                         max_messages - len(out.messages), now, expire))

    def _lease(self, group: str, ltopic: str, origin: str, queue_count: int, want: int,
               now: int, expire: int, tf: TagFilter) -> Leased:
        first = self._book.next_queue(group, ltopic)
        out = _NOTHING
        for i in range(queue_count):
            if len(out.messages) >= want:
                break
            qid = (first + i) % queue_count
            out = _join(out, self._lease_queue(group, ltopic, origin, qid,
                                               want - len(out.messages), now, expire, tf))
        return out

    def _lease_queue(self, group: str, ltopic: str, origin: str, qid: int, want: int,
                     now: int, expire: int, tf: TagFilter) -> Leased:
        """Lease up to ``want`` messages of one queue."""
        for again in (False, True):
            bounds = self._source.bounds(ltopic, qid)
            offset = self._book.pop_offset(group, ltopic, qid, bounds)
            rows, load = self._source.read_rows(ltopic, qid, offset, want, bounds.local_low)
            try:
                return self._lease_rows(group, ltopic, origin, qid, rows, load, now, expire,
                                        tf)
            except GoneLocally:  # nothing changed yet: read again, from where they are now
                log.log(logging.WARNING if again else logging.DEBUG,
                        "%s/%d: local retention deleted records this Pop was reading%s",
                        ltopic, qid, "; leasing nothing from the queue this time"
                        if again else "; reading again")
        return _NOTHING

    def _lease_rows(self, group: str, ltopic: str, origin: str, qid: int,
                    rows: list[tuple[int, int]], load: Loader, now: int, expire: int,
                    tf: TagFilter) -> Leased:
        if not rows:
            return _NOTHING
        count = len(rows)
        ck = PopCheckpoint(rows[0][0], now, expire, count, bytearray((count + 7) // 8))
        wanted = []
        for i, (_, tag) in enumerate(rows):
            if tf.tags is None or tag in tf.hashes:
                wanted.append(i)
            else:
                ck.mark(i)  # filtered out: done for this group
        loaded = load(wanted)  # GoneLocally: nothing changed yet
        out: list[PoppedMessage] = []
        flow = self._flow if self._flow.limits(group) is not None else None
        held: list[tuple[HeldEntry, str]] = []
        for i, msg in zip(wanted, loaded, strict=True):
            if msg is None or not tf.accepts(msg.tag):  # no message there, or a tag-hash
                ck.mark(i)  # collision: done for this group
                continue
            if flow is not None and not flow.admit(group, origin, msg.key, now):
                ck.overrides[i] = HELD  # its key is at its limit: held, the Pop reads on
                held.append((HeldEntry(ltopic, qid, ck.ck_start, i), msg.key))
                continue
            out.append(self._popped(group, ltopic, origin, qid, ck.ck_start, rows[i][0],
                                    expire, msg))
        recorded = self._book.record_lease(group, ltopic, qid, ck)
        for entry, key in held:
            self._flow.hold(group, origin, key, entry)
        deadlines = [recorded.deadline] if recorded.deadline is not None else []
        return Leased(out, recorded.puts, deadlines, len(held))

    def _popped(self, group: str, ltopic: str, origin: str, qid: int, ck_start: int,
                offset: int, expire: int, msg: Message) -> PoppedMessage:
        attempt = msg.delivery_attempt + 1
        msg.topic = origin
        msg.properties.pop(PROP_LEASE, None)  # internal: the entry a copy replaced
        handle = self._book.receipts.encode(
            group, ReceiptHandle(ltopic, qid, ck_start, offset, expire, attempt))
        self._flow.leased(group, origin, msg.key, ltopic, qid, offset)
        return PoppedMessage(msg, handle, attempt)

    def _hand_out(self, group: str, topic: str, rtopic: str, want: int, now: int,
                  expire: int) -> Leased:
        """Held entries of ``group`` whose keys have room now, handed out with this Pop's
        deadline (``pop.flowcontrol``); after a start, first read back those held in
        checkpoints."""
        flow = self._flow
        if flow.needs_rebuild(group, topic):
            entries = self._book.held(group, topic) + self._book.held(group, rtopic)
            found = [(e, self._read_entry(e)) for e in entries]
            flow.rebuilt(group, topic, [(e, m.key) for e, m in found if m is not None])
        out: list[PoppedMessage] = []
        puts: list[tuple[bytes, bytes]] = []
        deadlines: list[Deadline] = []
        for entry, key in flow.take_ready(group, topic, want, now):
            recorded = self._book.hand_out(group, entry, expire)
            msg = self._read_entry(entry) if recorded is not None else None
            if recorded is not None:
                puts += recorded.puts
                deadlines += [recorded.deadline] if recorded.deadline else []
            if recorded is None or msg is None:  # it ended meanwhile, or cannot be read:
                flow.returned(group, topic, key, entry)  # (then its lease runs out)
                continue
            out.append(self._popped(group, entry.ltopic, topic, entry.queue_id,
                                    entry.ck_start, entry.queue_offset, expire, msg))
        return Leased(out, puts, deadlines)

    def _read_entry(self, entry: HeldEntry) -> Message | None:
        """The message of one leased entry (None: not readable now)."""
        try:
            bounds = self._source.bounds(entry.ltopic, entry.queue_id)
            rows, load = self._source.read_rows(entry.ltopic, entry.queue_id,
                                                entry.queue_offset, 1, bounds.local_low)
            if not rows or rows[0][0] != entry.queue_offset:
                return None
            return load([0])[0]
        except (GoneLocally, ChronomqError):
            return None


def _join(a: Leased, b: Leased) -> Leased:
    if not b.messages and not b.puts:
        return a
    return Leased(a.messages + b.messages, a.puts + b.puts, a.deadlines + b.deadlines,
                  a.held + b.held)
