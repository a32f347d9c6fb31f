"""The topic catalogue's copy in the tier, ``<broker>/topics.json``: which topics a broker
has and which it deleted, so that its successor takes exactly those (docs/DESIGN.md,
"Takeover").

CreateTopic and DeleteTopic answer OK only once this copy names the change
(``CatalogueCopy.publish``, called by ``cluster.topics``); a takeover reads it after its
claim (``departed_topics``).  So a topic created with an OK is taken, and one deleted
with an OK is not, nor are its queues, which stay in the tier.

Format, version 2 (JSON, keys sorted):

=============  ==========================================================================
key            value
=============  ==========================================================================
``version``    ``2``
``topics``     ``[{"name", "queue_count", "retention_ms", "retention_bytes",
               "tier_retention_ms", "generation"}]``: every topic the broker has (its
               retry and dead-letter topics too; never its system streams)
``deleted``    ``{name: offset}``: names deleted and not created again since
=============  ==========================================================================

``generation`` is the topic's ``since_offset``, the CommitLog end when it was created,
which is also the ``<generation>`` of its queues in the tier (``tiered.queue``).
``deleted[name]`` is the broker's confirmed CommitLog end just after ``name`` was
deleted: every queue of that name (and of its retry and dead-letter topics) made before
has a lower generation, one made after (the name created again) one at least as high.

A queue in the tier, ``(topic, generation)``, is *live* (``Catalogue.live``) when the
copy names the topic at that generation or an older one, or, for a topic it does not
name (created, its copy not written yet, while a send to it went up; or a retry topic
made since), when no deletion or listed origin rules it out.  A takeover serves live
queues only and takes the topics listed plus those with live queues.

Version 1 (older brokers: no generations, no deletions) was written with the next
upload, not before the OK, so it is not authoritative: every queue of such a broker is
live, as before.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cluster.layout import catalogue_path
from store.names import is_name, is_system_stream, split_broker_made
from store.topics import Topic
from tiered.errors import TierError, TierNotFound
from tiered.mount import MountedBroker
from tiered.provider import Provider

log = logging.getLogger(__name__)

VERSION = 2
_SETTINGS = ("queue_count", "retention_ms", "retention_bytes", "tier_retention_ms")


class CatalogueError(TierError):
    """Raised when a catalogue copy cannot be decoded."""


@dataclass(frozen=True, slots=True)
class Catalogue:
    """A decoded copy: topics by name (``since_offset`` is the generation), deletions."""

    topics: dict[str, Topic] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    authoritative: bool = True  # False: a version 1 copy (see the module docstring)

    def live(self, topic: str, generation: int) -> bool:
        """Whether a queue of ``topic`` at ``generation`` in the tier belongs to a topic
        the broker has (see the module docstring)."""
        if not self.authoritative:
            return True
        listed = self.topics.get(topic)
        if listed is not None:
            return generation >= listed.since_offset
        origin = _origin(topic)
        floor = max(self.deleted.get(topic, 0), self.deleted.get(origin, 0))
        parent = self.topics.get(origin) if origin != topic else None
        return generation >= max(floor, parent.since_offset if parent else 0)


def _origin(topic: str) -> str:
    made = split_broker_made(topic)
    return made[2] if made is not None else topic


def encode(catalogue: Catalogue) -> bytes:
    """The version 2 copy of ``catalogue`` (deletions of listed names left out when the
    listed generation is past them)."""
    topics = [{"name": t.name, "generation": t.since_offset,
               **{k: getattr(t, k) for k in _SETTINGS}}
              for t in sorted(catalogue.topics.values(), key=lambda t: t.name)]
    deleted = {n: at for n, at in sorted(catalogue.deleted.items())
               if n not in catalogue.topics or catalogue.topics[n].since_offset < at}
    return json.dumps({"version": VERSION, "topics": topics, "deleted": deleted},
                      sort_keys=True).encode()


def decode(raw: bytes) -> Catalogue:
    """A copy of version 1 or 2; ``CatalogueError`` when it is neither."""
    try:
        doc = json.loads(raw)
        version = doc["version"]
        if version not in (1, VERSION):
            raise ValueError(f"unknown version {version!r}")
        topics = {str(t["name"]): _topic(t, version) for t in doc["topics"]}
        deleted = {str(n): _offset(at) for n, at in doc.get("deleted", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CatalogueError(f"the topic catalogue copy is damaged: {exc}") from exc
    if version == VERSION and "deleted" not in doc:
        raise CatalogueError("the topic catalogue copy is damaged: no deletions")
    return Catalogue(topics, deleted, authoritative=version == VERSION)


def _topic(t: dict[str, Any], version: int) -> Topic:
    name = t["name"]
    if not isinstance(name, str) or not (is_name(name) or split_broker_made(name)):
        raise ValueError(f"not a topic name: {name!r}")
    settings = {k: _offset(t.get(k, 0)) for k in _SETTINGS}
    return Topic(name, since_offset=_offset(t["generation"]) if version > 1 else 0,
                 **settings)


def _offset(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a count or offset: {value!r}")
    return value


def read_catalogue(provider: Provider, broker: str) -> Catalogue | None:
    """Broker ``broker``'s copy: None when it has none; ``CatalogueError`` when it is
    damaged, ``TierError`` when the tier fails."""
    try:
        raw = provider.read(catalogue_path(broker))
    except TierNotFound:
        return None
    return decode(raw)


def departed_topics(provider: Provider, mounted: MountedBroker) -> dict[str, Topic]:
    """The topics a takeover of ``mounted.broker`` takes (or a mount of it serves), by
    name, with their settings (``since_offset`` aside): its copy's, and those with live
    queues.  ``mounted`` keeps
    only its live queues from here on (``MountedBroker.keep``).  A damaged copy is
    logged and counts as none: every queue in the tier is taken, as before copies."""
    try:
        catalogue = read_catalogue(provider, mounted.broker)
    except CatalogueError as exc:
        log.error("takeover of %s: %s; its topics are taken from its queues",
                  mounted.broker, exc)
        catalogue = None
    if catalogue is None:
        catalogue = Catalogue(authoritative=False)
    dropped = mounted.keep(catalogue.live)
    if dropped:
        log.info("broker %s: %d queue(s) in its tier belong to topics it deleted: not "
                 "served (%s)", mounted.broker, len(dropped),
                 ", ".join(sorted({t for t, _ in dropped})[:10]))
    taken = dict(catalogue.topics)
    for name, count in mounted.topics().items():
        taken.setdefault(name, Topic(name, count))
    return taken


class CatalogueCopy:
    """Keeps ``<broker>/topics.json`` up to date (see the module docstring).

    ``topics()`` lists the broker's topics (its system streams are left out here);
    ``end()`` is its confirmed CommitLog end (a deletion's offset); ``fenced()`` is the
    error to raise instead of writing once the broker was taken over (None: not).

    Thread-safe.  Copies are written one at a time, each of the catalogue as it is when
    the write begins; ``publish`` returns once a copy begun after it was called is in
    the tier, so concurrent callers share one write (a group commit)."""

    def __init__(self, provider: Provider, broker: str, topics: Callable[[], list[Topic]],
                 end: Callable[[], int],
                 fenced: Callable[[], Exception | None] = lambda: None) -> None:
        self._provider, self._broker, self._path = provider, broker, catalogue_path(broker)
        self._topics, self._end, self._fenced = topics, end, fenced
        self._lock = threading.Lock()  # the fields below but ``_last``
        self._write_lock = threading.Lock()  # one write at a time, and ``_last``
        self._deleted: dict[str, int] = {}
        self._asked = self._written = 0  # publish calls, and the last one a write covers
        self._last: bytes | None = None  # what the tier holds (as far as this process knows)

    def open(self) -> list[str]:
        """At start, before the first ``publish``: take the deletions of the copy the
        tier holds, and record as deleted its topics this broker no longer has (a
        DeleteTopic cut short after its local step).  Returns the names deleted that
        this broker does not have: what it may still keep of them (group positions,
        retry topics) is to be dropped.  ``TierError`` when the tier fails; a damaged
        copy is logged and replaced."""
        try:
            raw = self._provider.read(self._path)
            old: Catalogue | None = decode(raw)
        except TierNotFound:
            raw, old = b"", None
        except CatalogueError as exc:
            log.error("%s: %s; written again from the local catalogue", self._path, exc)
            raw, old = b"", None
        with self._write_lock:
            self._last = raw or None  # a start that changed nothing writes nothing
        local = {t.name for t in self._topics()}
        end = self._end()
        with self._lock:
            if old is not None:
                self._deleted.update(old.deleted)
                for name in old.topics:
                    if name not in local:
                        self._deleted[name] = max(self._deleted.get(name, 0), end)
            return sorted(n for n in self._deleted if n not in local)

    def deleted(self, names: Iterable[str]) -> None:
        """Record that ``names`` were deleted here just now (their local step done)."""
        end = self._end()
        with self._lock:
            for name in names:
                self._deleted[name] = max(self._deleted.get(name, 0), end)

    def publish(self) -> None:
        """Return once a copy naming every change made before this call is in the tier
        (``TierError`` when the tier fails; the fence's error once taken over)."""
        with self._lock:
            self._asked += 1
            ticket = self._asked
        with self._write_lock:
            if self._written >= ticket:
                return  # a write begun after this call covered it
            with self._lock:
                covers = self._asked
            topics = {t.name: t for t in self._topics() if not is_system_stream(t.name)}
            with self._lock:  # after the topics: a deletion meanwhile is in one of them
                for name in [n for n, at in self._deleted.items()
                             if n in topics and topics[n].since_offset >= at]:
                    del self._deleted[name]  # created again since
                deleted = dict(self._deleted)
            data = encode(Catalogue(topics, deleted))
            if data != self._last:
                error = self._fenced()
                if error is not None:
                    raise error
                self._provider.write(self._path, data)
                self._last = data
            with self._lock:
                self._written = max(self._written, covers)
