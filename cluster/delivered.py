"""Delivered copies: which delayed messages a departed broker's timer delivered into topic
queues that reached the tier; what a takeover goes by for a departed broker's last moments.

A broker's timer delivers a due message by appending a copy of it under its topic
(``FLAG_TIMER_DELIVERY``, its id and due time) and, in the same CommitLog write, the
journal's record that it did (the timer stream's ``timer-done``).  The two go up to the
tier in different queues.  The record never gets there before the copy: the timer
stream's metadata copy in the tier waits until every queue is in the tier up to its
records (``tiered.uploads.Mirror``, ``after``).  But the copy may get there and the
broker die before the record does: its successor would deliver the message again.  So
a takeover asks ``DeliveredCopies.has`` for every pending message the broker may have
delivered (``cluster.adoption``) and leaves out those whose copy the tier holds.

Which may have been: a copy is stored at or after its due time by the clock of the
broker that delivered it, so none is due after the latest store time of that broker's
topic queues in the tier (their metadata holds it) plus ``SLACK_MS``
(``delivered_until_ms``).  That broker's clock only: no wall clock of another machine
(the successor's) decides which messages are looked for.

A copy is stored at or after its due time by the clock of the broker that delivered it
(a timer never fires early), so looking for the copy of a message due at ``d`` reads only
what that broker stored from ``d - SLACK_MS`` on, in the message's topic: found by a
binary search of store times over each queue (one ranged read per probe), then its log
read in order (``TieredQueue.scan``).  Each (broker, topic) is read once, from the
earliest due time asked; an earlier one reads only the stretch before it.  A takeover
asks for each batch's topics at once (``read_since``: their queues read in parallel).
Not thread-safe (one takeover's thread; its reads fan out inside a call).

A takeover does not wait for those reads at its timer step alone: ``Prefetch`` reads the
departed broker's topics from ``PREFETCH_MS`` before its latest store time on, on a
thread of its own from the moment the broker is mounted, while the journal is replayed
and the positions adopted (the messages it may have delivered are nearly all due that
late); the timer step takes the copies read so far and reads only what an earlier due
time needs more.  Its reads draw on readers of their own (``tiered.flatfile.reading_on``),
not ahead of the replay's.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from store.message import FLAG_TIMER_DELIVERY, decode_record
from tiered.flatfile import readers, reading_on
from tiered.mount import MountedBroker

log = logging.getLogger(__name__)

SLACK_MS = 10_000  # a wall clock stepped back this much still finds the copy
READ_THREADS = 8  # queues read at once
PREFETCH_MS = 20_000  # ``Prefetch`` reads from this long before the latest store time


class DeliveredCopies:
    """The timer-delivered copies in one broker's topic queues in the tier (module
    docstring)."""

    def __init__(self, mounted: MountedBroker, pool: str = "") -> None:
        self._mounted = mounted
        self._pool = pool  # its reads' readers (``reading_on``); "": the shared ones
        self._queues = mounted.topics()
        self._copies: set[tuple[str, bytes, int]] = set()  # (topic, id, due)
        self._from: dict[str, dict[int, int]] = {}  # topic -> queue -> first offset read
        self._since: dict[str, int] = {}  # topic -> the earliest store time read from
        # no message due later can have a copy here (module docstring)
        self.delivered_until_ms = mounted.latest_stored_ms() + SLACK_MS

    def topics(self) -> list[str]:
        """The topics of the broker's queues in the tier."""
        return sorted(self._queues)

    def has(self, topic: str, message_id: bytes, due_ms: int) -> bool:
        """Whether the broker delivered the message with this id, due at ``due_ms``, into
        ``topic`` and the copy is in the tier."""
        if topic not in self._queues:
            return False
        self.read_since({topic: due_ms - SLACK_MS})
        return (topic, message_id, due_ms) in self._copies

    def read_since(self, wants: dict[str, int]) -> None:
        """Read what each topic of ``wants`` stored from its time on (less what was read
        already): every queue of every topic at once, ``READ_THREADS`` at a time (each
        queue is a binary search by time, then its log; under load a round trip is tens
        of ms, and a takeover's timer step waits for this)."""
        todo: list[tuple[str, int, int, int, int]] = []  # topic, queue, low, until, at_ms
        for topic, at_ms in wants.items():
            if topic not in self._queues or at_ms >= self._since.get(topic, at_ms + 1):
                continue  # not here, or read already
            self._since[topic] = at_ms
            read = self._from.setdefault(topic, {})
            for qid in range(self._queues[topic]):
                bounds = self._mounted.bounds(topic, qid)
                if bounds is not None and bounds[0] < bounds[1]:
                    todo.append((topic, qid, bounds[0], read.get(qid, bounds[1]), at_ms))
        if len(todo) > 1:
            with ThreadPoolExecutor(min(READ_THREADS, len(todo)), "delivered") as pool:
                results = list(pool.map(lambda t: self._read_queue(*t), todo))
        else:
            results = [self._read_queue(*t) for t in todo]
        for (topic, qid, *_), (start, copies) in zip(todo, results, strict=True):
            self._copies |= copies
            if start is not None:
                self._from[topic][qid] = start

    def _read_queue(self, topic: str, qid: int, low: int, until: int, at_ms: int
                    ) -> tuple[int | None, set[tuple[str, bytes, int]]]:
        """The copies queue ``qid`` of ``topic`` (its oldest offset ``low``) stored from
        ``at_ms`` to before queue offset ``until``, and the first offset now read (None:
        unchanged)."""
        if self._pool:
            with reading_on(readers(self._pool)):
                return self._read_queue_here(topic, qid, low, until, at_ms)
        return self._read_queue_here(topic, qid, low, until, at_ms)

    def _read_queue_here(self, topic: str, qid: int, low: int, until: int, at_ms: int
                         ) -> tuple[int | None, set[tuple[str, bytes, int]]]:
        last = self._mounted.read(topic, qid, until - 1, 1) if until > low else []
        if not last or last[-1].store_at_ms < at_ms:  # (no copy can be this late)
            return until, set()
        start = self._mounted.first_stored(topic, qid, low, until, at_ms)
        if start >= until:
            return None, set()
        copies = set()
        for e in self._mounted.scan(topic, qid, start):  # its log alone, in order
            if e.queue_offset >= until:
                break
            m = decode_record(e.record)
            if m.flags & FLAG_TIMER_DELIVERY:
                copies.add((topic, m.message_id.encode(), m.deliver_at_ms))
        return start, copies


def read_ahead(mounted: MountedBroker, pool: str) -> DeliveredCopies:
    """``DeliveredCopies`` of ``mounted``, its topics read from ``PREFETCH_MS`` before its
    latest store time on (on the readers ``pool``)."""
    copies = DeliveredCopies(mounted, pool)
    copies.read_since(dict.fromkeys(copies.topics(),
                                    copies.delivered_until_ms - SLACK_MS - PREFETCH_MS))
    return copies


class Prefetch:
    """``DeliveredCopies`` of ``mounted``, its topics read from ``PREFETCH_MS`` before
    its latest store time on, on a thread of its own started now (module docstring)."""

    def __init__(self, mounted: MountedBroker) -> None:
        self.broker = mounted.broker
        self._done = threading.Event()
        self._copies: DeliveredCopies | None = None
        threading.Thread(target=self._run, args=(mounted,), daemon=True,
                         name=f"delivered-{mounted.broker}").start()

    def _run(self, mounted: MountedBroker) -> None:
        try:
            self._copies = read_ahead(mounted, "delivered-read")
        except Exception as exc:  # the timer step reads what it needs itself
            log.warning("the delivered copies of %s not read ahead: %s", self.broker, exc)
        finally:
            self._done.set()

    def get(self) -> DeliveredCopies | None:
        """The copies read ahead (waits for them), or None: not read."""
        self._done.wait()
        return self._copies
