"""The topic catalogue, persisted as ``<data>/topics.json`` (written to a temp file, fsynced
and renamed, so a crash leaves the old or the new catalogue, never half of one).

``since_offset`` is the CommitLog end when the topic was created: the dispatcher ignores
older records under the same name, so deleting and re-creating a topic never resurrects
the old topic's messages.  Thread-safe.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import asdict, dataclass, replace

from store.errors import AlreadyExists, InvalidArgument, TopicNotFound

_NAME = re.compile(r"^[A-Za-z0-9_.%-]{1,255}$")
MAX_NAME_BYTES = 255
MAX_QUEUES = 1024
SYSTEM_PREFIX = "%"  # names the broker reserves for itself (retry, dead-letter, ...)


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    queue_count: int = 4
    retention_ms: int = 0  # 0: the broker's default
    retention_bytes: int = 0
    since_offset: int = 0
    tier_retention_ms: int = 0  # 0: the broker's default (tier.retention_ms)


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidArgument("topic name is empty")
    if not _NAME.match(name):
        raise InvalidArgument(
            f"topic name {name!r} is invalid: use 1-255 characters from A-Z a-z 0-9 _ . -"
        )


class TopicCatalogue:
    """Topics by name; every change is persisted before it returns."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._topics: dict[str, Topic] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
            self._topics = {t["name"]: Topic(**t) for t in raw["topics"]}

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def require(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    def list(self) -> list[Topic]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def create(self, topic: Topic, system: bool = False) -> tuple[Topic, bool]:
        """Create ``topic``; return ``(topic, created)``.  Same settings again is a no-op."""
        if not system:
            validate_topic_name(topic.name)
            if topic.name.startswith(SYSTEM_PREFIX):
                raise InvalidArgument(f"topic names starting with {SYSTEM_PREFIX!r} are reserved")
        if not 1 <= topic.queue_count <= MAX_QUEUES:
            raise InvalidArgument(f"queue_count must be between 1 and {MAX_QUEUES}")
        if topic.retention_ms < 0 or topic.retention_bytes < 0 or topic.tier_retention_ms < 0:
            raise InvalidArgument("retention must not be negative")
        if 0 < topic.tier_retention_ms < topic.retention_ms:
            raise InvalidArgument(
                f"tier_retention_ms ({topic.tier_retention_ms}) is shorter than the topic's "
                f"local retention_ms ({topic.retention_ms}): the tier keeps data longer")
        with self._lock:
            old = self._topics.get(topic.name)
            if old is not None:
                if replace(old, since_offset=topic.since_offset) != topic:
                    raise AlreadyExists(
                        f"topic {topic.name!r} exists with queue_count={old.queue_count}, "
                        f"retention_ms={old.retention_ms}, tier_retention_ms="
                        f"{old.tier_retention_ms}; delete it first to change them"
                    )
                return old, False
            self._topics[topic.name] = topic
            self._save()
            return topic, True

    def delete(self, name: str) -> Topic:
        with self._lock:
            topic = self._topics.pop(name, None)
            if topic is None:
                raise TopicNotFound(name)
            self._save()
            return topic

    def _save(self) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "topics": [asdict(t) for t in self._topics.values()]}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
