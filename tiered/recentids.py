"""RecentIds: a departed broker's recent ids, indexed once and kept in the tier for every
broker that takes its topics over after.

A broker that takes a topic over drops a resend of an id the departed broker accepted in
its last minute (``cluster.handover``): it indexes that minute of the departed broker's
queues (``tiered.mountindex``, the part no sealed key-index file covers), one object-store
round trip per chunk of every queue.  In a chain (A taken by B, B by C, ...) each
successor holds every broker of the chain within the resend horizon, and indexed each of
them again: a dozen brokers' last minutes, seconds of every takeover.  So the first
broker that indexes a departed broker's last minute keeps what it read in the tier::

    <broker>/index/recent-ids    a JSON header line, then the packed entries

The header: the format version, ``since_ms`` (the tail holds what was stored from then
on), ``records`` (how many), ``files`` (the sealed key-index files that tail starts
after: the departed broker's catalogue only grows, so a reader that knows as many files
has nothing the tail lacks), and per queue ``[topic, queue id, generation, end, bytes]``:
the queue offset the tail was read to, and how many bytes of packed entries
(``tiered.index.OPEN_ENTRY``) follow for it, in that order.  A later successor uses it
instead of reading the queues when it covers what that successor would read: ``since_ms``
no later than its own, no more sealed files than it knows, and every queue read to at
least the end it serves of that queue (``MountedBroker.serve_below``: the ends the chain's
takeover took; a commit the departed broker had on its way when fenced lands past them,
and is read by no broker of the chain), or its end in the mount if it was told none (a
queue it does not name counts as read to 0: one with nothing to read is covered).
Else, or when the object is missing, damaged or of another version, it reads the queues
itself.  The departed broker is fenced and writes nothing more, so the content is the
same whoever writes it: a plain write, last one wins, and any one is right.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from tiered.index import OPEN_ENTRY

VERSION = 1

QueueRef = tuple[str, int, int]  # topic, queue, generation


class RecentIds(NamedTuple):
    """One departed broker's indexed last records, per queue."""

    since_ms: int
    files: int  # sealed key-index files it starts after
    records: int  # records indexed (an id and a key each, or an id alone)
    ends: dict[QueueRef, int]  # per queue, the queue offset read to
    bodies: dict[QueueRef, bytes]  # per queue, its packed OPEN_ENTRYs (in queue order)


def path_of(broker: str) -> str:
    return f"{broker}/index/recent-ids"


def encode(recent: RecentIds) -> bytes:
    queues = [[*ref, end, len(recent.bodies.get(ref, b""))] for ref, end in recent.ends.items()]
    header = json.dumps({"version": VERSION, "since_ms": recent.since_ms,
                         "files": recent.files, "records": recent.records,
                         "queues": queues}).encode()
    return header + b"\n" + b"".join(recent.bodies.get(ref, b"") for ref in recent.ends)


def decode(raw: bytes) -> RecentIds:
    """Raises ValueError when ``raw`` is not one ``encode`` made (damaged, torn, another
    version)."""
    head, sep, rest = raw.partition(b"\n")
    if not sep:
        raise ValueError("no header line")
    try:
        header = json.loads(head)
        if header.get("version") != VERSION:
            raise ValueError(f"unknown version {header.get('version')!r}")
        since_ms, files = int(header["since_ms"]), int(header["files"])
        records = int(header["records"])
        ends: dict[QueueRef, int] = {}
        bodies: dict[QueueRef, bytes] = {}
        at = 0
        for topic, queue_id, generation, end, size in header["queues"]:
            ref = (str(topic), int(queue_id), int(generation))
            size = int(size)
            if size < 0 or size % OPEN_ENTRY.size or at + size > len(rest):
                raise ValueError(f"queue {ref}: {size} bytes of entries do not fit")
            ends[ref] = int(end)
            if size:
                bodies[ref] = rest[at : at + size]
            at += size
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed header: {exc!r}") from exc
    if at != len(rest):
        raise ValueError(f"{len(rest) - at} bytes after the entries")
    return RecentIds(since_ms, files, records, ends, bodies)


def covers(recent: RecentIds, since_ms: int, files: int, ends: dict[QueueRef, int]) -> bool:
    """Does ``recent`` hold all that a read of the queues' tails from ``since_ms`` on,
    after ``files`` sealed files, to ``ends`` would?"""
    return recent.since_ms <= since_ms and recent.files <= files and not short_of(recent, ends)


def short_of(recent: RecentIds, ends: dict[QueueRef, int]) -> list[tuple[QueueRef, int, int]]:
    """The queues ``recent`` was read short of ``ends`` on: (queue, read to, end), sorted;
    a queue it does not name was read to 0 (one with nothing to read is covered)."""
    return sorted((ref, recent.ends.get(ref, 0), end) for ref, end in ends.items()
                  if recent.ends.get(ref, 0) < end)
