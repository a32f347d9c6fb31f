"""The topic catalogue, kept durable in ``<data>/topics.log`` (``store.topiclog``: an
append-only log of puts and deletes with group commit, rewritten as a snapshot on start
when it has grown by more than its topics, and while running at ``4 x topics + 1024``
records).

A create or delete returns only once its record is durable (``TopicLog.wait``), so a
CreateTopic answered OK survives a kill -9; concurrent creates share one fsync.  A topic
being created is not visible (``get``) until then, and a second identical create of it
waits for the same record.  The catalogue of older versions, ``<data>/topics.json`` (one
JSON document, rewritten and fsynced on every change), is migrated on the first start:
the log is written and made durable, then the JSON file is deleted.

``since_offset`` is the CommitLog end when the topic was created: the dispatcher ignores
older records under the same name, so deleting and re-creating a topic never resurrects
the old topic's messages.  Thread-safe.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from store.errors import AlreadyExists, InvalidArgument, StoreError, TopicNotFound
from store.files import fsync_dir
from store.names import check_broker_made, check_name, check_readable
from store.topiclog import TopicLog

MAX_NAME_BYTES = 255
MAX_QUEUES = 1024
LOG_NAME = "topics.log"
LEGACY_NAME = "topics.json"
_COMPACT_SLACK = 1024  # records beyond 4 x topics the log may hold before a rewrite


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    queue_count: int = 4
    retention_ms: int = 0  # 0: the broker's default
    retention_bytes: int = 0
    since_offset: int = 0
    tier_retention_ms: int = 0  # 0: the broker's default (tier.retention_ms)


_FIELD_NAMES = tuple(f.name for f in fields(Topic))
_FIELDS = frozenset(_FIELD_NAMES)


def validate_topic_name(name: str) -> None:
    """The one name rule (``store.names``)."""
    check_name(name)


def _put(topic: Topic) -> dict[str, Any]:
    return {"op": "put", "topic": {f: getattr(topic, f) for f in _FIELD_NAMES}}


def replay(records: list[dict[str, Any]]) -> dict[str, Topic]:
    """The catalogue a log's records describe (records that are not a put or a delete of
    a well-formed topic are ignored)."""
    topics: dict[str, Topic] = {}
    for r in records:
        op = r.get("op")
        if op == "put":
            t = r.get("topic")
            if isinstance(t, dict) and _FIELDS.issuperset(t) and isinstance(t.get("name"), str):
                topics[t["name"]] = Topic(**t)
        elif op == "delete" and isinstance(r.get("name"), str):
            topics.pop(r["name"], None)
    return topics


class TopicCatalogue:
    """Topics by name; every change is durable before it returns."""

    def __init__(self, data_dir: str) -> None:
        self._dir = data_dir
        self._lock = threading.Lock()
        self._log = TopicLog(os.path.join(data_dir, LOG_NAME))
        self._topics: dict[str, Topic] = {}
        self._pending: dict[str, tuple[Topic, int]] = {}  # created, not yet durable
        self._mounted: dict[str, Topic] = {}  # served read-only from another broker's tier
        self._load()

    def _load(self) -> None:
        records = self._log.read()
        legacy = os.path.join(self._dir, LEGACY_NAME)
        if records is None:  # a new data dir, or one written by an older version
            self._topics = _read_legacy(legacy)
            self._log.rewrite([_put(t) for t in self._topics.values()])
        else:
            self._topics = replay(records)
            if self._log.damaged or len(records) > len(self._topics):
                self._log.rewrite([_put(t) for t in self._topics.values()])
        if os.path.exists(legacy):  # migrated: the log is durable now
            os.unlink(legacy)
            fsync_dir(self._dir)
        self._log.open_for_append()

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def require(self, name: str) -> Topic:
        """A local topic, or a mounted one (readable, not writable), or ``TopicNotFound``."""
        topic = self._topics.get(name) or self._mounted.get(name)
        if topic is None:
            check_readable(name)  # a name no topic can have: INVALID_ARGUMENT, not NOT_FOUND
            raise TopicNotFound(name)
        return topic

    def list(self) -> list[Topic]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def set_mounted(self, topics: dict[str, int]) -> None:
        """The topics served read-only from mounted tiers (name -> queue count), in
        memory only: ``get`` and ``list`` stay this broker's own."""
        self._mounted = {name: Topic(name, count) for name, count in topics.items()}

    def mounted(self, name: str) -> Topic | None:
        return self._mounted.get(name)

    def count(self) -> int:
        return len(self._topics)

    def create(self, topic: Topic, system: bool = False) -> tuple[Topic, bool]:
        """Create ``topic``; return ``(topic, created)`` once it is durable.  Same
        settings again is a no-op."""
        _validate(topic, system)
        with self._lock:
            old = self._topics.get(topic.name)
            if old is not None:
                _check_same(old, topic)
                return old, False
            pending = self._pending.get(topic.name)
            if pending is None:
                ticket = self._log.append([_put(topic)])
                self._pending[topic.name] = (topic, ticket)
                self._compact_if_grown()
            else:
                _check_same(pending[0], topic)
        if pending is not None:  # the same create, still on its way: answer with it
            self._wait(pending)
            return pending[0], False
        self._wait((topic, ticket))
        return topic, True

    def delete(self, name: str) -> Topic:
        """Delete topic ``name``; returns once that is durable."""
        while True:
            with self._lock:
                pending = self._pending.get(name)
                if pending is None:
                    topic = self._topics.pop(name, None)
                    if topic is None:
                        raise TopicNotFound(name)
                    ticket = self._log.append([{"op": "delete", "name": name}])
                    self._compact_if_grown()
                    break
            self._wait(pending)  # a create still on its way: let it finish first
        self._log.wait(ticket)
        return topic

    def _wait(self, pending: tuple[Topic, int]) -> None:
        """Wait for a create's record, then make the topic visible; on failure, forget
        every topic not yet durable."""
        try:
            self._log.wait(pending[1])
        except StoreError:
            with self._lock:
                self._pending.clear()
            raise
        name = pending[0].name
        with self._lock:
            if self._pending.get(name) == pending:
                del self._pending[name]
                self._topics[name] = pending[0]

    def _compact_if_grown(self) -> None:
        """Rewrite the log as a snapshot once it holds far more records than topics
        (called with the lock held; pending creates are in the snapshot, so it makes
        them durable too)."""
        live = len(self._topics) + len(self._pending)
        if self._log.records > 4 * live + _COMPACT_SLACK:
            topics = [*self._topics.values(), *(t for t, _ in self._pending.values())]
            self._log.rewrite([_put(t) for t in topics])

    def close(self) -> None:
        self._log.close()

    @property
    def syncs(self) -> int:
        """fsyncs of the topic log (group commit: fewer than creates under load)."""
        return self._log.syncs


class TopicChanges:
    """One change at a time per topic name (a create waits for a delete of the same name
    to finish dropping its queues, and the other way round); changes to different names
    run at once, so their records share a group commit.  Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy: set[str] = set()

    @contextmanager
    def of(self, name: str) -> Iterator[None]:
        with self._cond:
            while name in self._busy:
                self._cond.wait()
            self._busy.add(name)
        try:
            yield
        finally:
            with self._cond:
                self._busy.discard(name)
                self._cond.notify_all()


def _validate(topic: Topic, system: bool) -> None:
    if system:
        check_broker_made(topic.name)
    else:
        check_name(topic.name)
    if not 1 <= topic.queue_count <= MAX_QUEUES:
        raise InvalidArgument(f"queue_count must be between 1 and {MAX_QUEUES}")
    if topic.retention_ms < 0 or topic.retention_bytes < 0 or topic.tier_retention_ms < 0:
        raise InvalidArgument("retention must not be negative")
    if 0 < topic.tier_retention_ms < topic.retention_ms:
        raise InvalidArgument(
            f"tier_retention_ms ({topic.tier_retention_ms}) is shorter than the topic's "
            f"local retention_ms ({topic.retention_ms}): the tier keeps data longer")


def _check_same(old: Topic, topic: Topic) -> None:
    if replace(old, since_offset=topic.since_offset) != topic:
        raise AlreadyExists(
            f"topic {topic.name!r} exists with queue_count={old.queue_count}, "
            f"retention_ms={old.retention_ms}, tier_retention_ms="
            f"{old.tier_retention_ms}; delete it first to change them"
        )


def _read_legacy(path: str) -> dict[str, Topic]:
    """The catalogue of ``topics.json`` (older versions), or none."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    return {t["name"]: Topic(**t) for t in raw["topics"]}
