"""The vocabulary of POP consumption: system topic names, errors, filters and the records
the lease book, the requeue path and the POP service share.

Retry and dead-letter topics are named ``%RETRY%<group>%<topic>`` and
``%DLQ%<group>%<topic>``; group names hold no ``%``, so the user topic is recoverable
from either (``origin_of``).  Immutable data and pure functions only: thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from pop.checkpoint import PopCheckpoint, decode_checkpoint, decode_offset, parse_key
from pop.handle import ReceiptHandle
from store.errors import FailedPrecondition, InvalidArgument
from store.message import Message
from store.names import DLQ_PREFIX as DLQ_PREFIX
from store.names import MAX_NAME, check_name
from store.names import RETRY_PREFIX as RETRY_PREFIX
from store.queues import tag_hash

MAX_INVISIBLE_TIME_S = 12 * 3600
MAX_GROUP_BYTES = MAX_NAME
REVIVE_TICK_MS = 10
REVIVE_BATCH = 512  # leases revived per CommitLog append
REQUEUED_MEMORY = 65_536

# properties a dead-lettered message carries
PROP_DLQ_REASON = "chronomq.dlq.reason"
PROP_DLQ_ATTEMPTS = "chronomq.dlq.attempts"
PROP_DLQ_GROUP = "chronomq.dlq.group"
PROP_ORIGIN_TOPIC = "chronomq.origin_topic"

Deadline = tuple[str, str, int, int, int]  # group, leased topic, queue, ck_start, expire_at
LeaseQueue = tuple[str, str, int]  # group, leased topic, queue


def retry_topic(group: str, topic: str) -> str:
    return f"{RETRY_PREFIX}{group}%{topic}"


def dlq_topic(group: str, topic: str) -> str:
    return f"{DLQ_PREFIX}{group}%{topic}"


def origin_of(topic: str) -> str:
    """The user's topic a retry topic belongs to (group names hold no ``%``)."""
    if topic.startswith(RETRY_PREFIX):
        return topic[len(RETRY_PREFIX):].split("%", 1)[1]
    return topic


class MountedBounds(Protocol):
    """The queues of tiers mounted read-only (``tiered.mount``): all of a mounted queue is
    in its broker's tier."""

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """``(oldest, end)`` queue offsets of a mounted queue, None if not mounted."""
        ...


class TierReader(Protocol):
    """Where Pop finds a queue's messages once local retention deleted them (or the read
    strategy sends it there: ``tiered.reader``)."""

    def min_queue_offset(self, topic: str, queue_id: int) -> int | None:
        """The oldest queue offset the tier holds, or None."""
        ...

    def floor(self, topic: str, queue_id: int, local_low: int) -> int:
        """The queue offset below which the queue is read from the tier."""
        ...

    def read(self, topic: str, queue_id: int, queue_offset: int, count: int
             ) -> Sequence[tuple[int, int, int, bytes]]:
        """Up to ``count`` entries from ``queue_offset``: (queue offset, tag hash, store
        time, record)."""
        ...


class ReceiptHandleExpired(FailedPrecondition):
    """Raised when a receipt handle's lease ran out before the ack arrived."""


class HandleSuperseded(FailedPrecondition):
    """Raised for a handle replaced by ChangeInvisibleTime."""


class AlreadyDone(FailedPrecondition):
    """Raised when ChangeInvisibleTime, Ack or Nack names a lease no longer open (acked,
    or given back for redelivery; an Ack again of an entry this process acked is OK)."""


class AlreadyRequeued(FailedPrecondition):
    """Raised when a handle names a message recently put back for redelivery."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """``""``/``"*"`` accepts everything; ``"a || b"`` accepts tags a and b."""

    tags: frozenset[str] | None
    hashes: frozenset[int] = frozenset()

    @staticmethod
    def parse(expression: str) -> TagFilter:
        expr = expression.strip()
        if expr in ("", "*"):
            return TagFilter(None)
        tags = frozenset(t.strip() for t in expr.split("||"))
        if "" in tags or any(" " in t for t in tags):
            raise InvalidArgument(f"tag expression {expression!r} is not '*' or 'a || b'")
        return TagFilter(tags, frozenset(tag_hash(t) for t in tags))

    def accepts(self, tag: str) -> bool:
        return self.tags is None or tag in self.tags


@dataclass(slots=True)
class QueueLeases:
    ack_offset: int
    pop_offset: int
    checkpoints: dict[int, PopCheckpoint] = field(default_factory=dict)


def leases_from_keys(items: Iterable[tuple[bytes, bytes]]
                     ) -> tuple[dict[LeaseQueue, QueueLeases], set[LeaseQueue]]:
    """The lease state of every queue with an open checkpoint among POP RocksDB keys
    (``pop.checkpoint``: ``o`` ack offsets, ``p`` pop offsets, ``c`` checkpoints; other
    keys ignored), and every queue the keys name.  A queue without its ``o`` key acks
    from its oldest checkpoint; the pop offset is past every checkpoint."""
    offsets: dict[LeaseQueue, int] = {}
    popped: dict[LeaseQueue, int] = {}
    checkpoints: list[tuple[LeaseQueue, PopCheckpoint]] = []
    for k, v in items:
        kind = k[:1]
        if kind not in (b"o", b"p", b"c"):
            continue
        group, topic, qid, start = parse_key(k)
        if kind == b"o":
            offsets[(group, topic, qid)] = decode_offset(v)
        elif kind == b"p":
            popped[(group, topic, qid)] = decode_offset(v)
        elif start is not None:
            checkpoints.append(((group, topic, qid), decode_checkpoint(start, v)))
    out: dict[LeaseQueue, QueueLeases] = {}
    for key, ck in checkpoints:
        leases = out.get(key)
        if leases is None:
            ack = offsets.get(key, ck.ck_start)
            leases = out[key] = QueueLeases(ack, ack)
        leases.checkpoints[ck.ck_start] = ck
        leases.pop_offset = max(leases.pop_offset, ck.end)
    for key, leases in out.items():
        leases.pop_offset = max(leases.pop_offset, popped.get(key, 0))
    return out, {*offsets, *popped, *out}


class PoppedMessage(NamedTuple):
    message: Message
    receipt_handle: str
    delivery_attempt: int


@dataclass(frozen=True, slots=True)
class PopStats:
    open_checkpoints: int
    popped: int
    acked: int
    revived: int
    released: int
    dead_lettered: int
    durable_syncs: int  # WAL fsyncs that made leases, acks and deadlines durable (each
    #                     covers every consumer waiting at that moment)


@dataclass(frozen=True, slots=True)
class GroupStats:
    group: str
    topic: str
    in_flight: int  # leased, not yet acked, released or revived
    backlog: int  # visible and not yet leased (topic and retry topic)
    lag: int  # not yet settled: backlog + in flight (not the distance from the ack offset)
    redelivered: int  # copies put on the retry topic (revive and release), since start
    dead_lettered: int  # since start


@dataclass(slots=True)
class Requeue:
    """One entry on its way to the retry or dead-letter topic."""

    group: str
    topic: str  # the leased topic (user or retry)
    queue_id: int
    ck_start: int
    index: int
    message: Message
    delay_ms: int | None  # None: the group's back-off
    reason: str | None  # set: dead-letter it


def placeholder() -> Message:
    return Message("", "", b"")


def by_origin(handles: list[ReceiptHandle | None]
               ) -> dict[str, list[tuple[int, ReceiptHandle]]]:
    """Decoded handles by the user topic whose lock covers them, with their positions."""
    out: dict[str, list[tuple[int, ReceiptHandle]]] = {}
    for n, h in enumerate(handles):
        if h is not None:
            out.setdefault(origin_of(h.topic), []).append((n, h))
    return out


def check_group(group: str) -> None:
    """A group name follows the one name rule (``store.names``)."""
    check_name(group, "group")
