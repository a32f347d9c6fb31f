"""Looking messages up by id and by key, wherever they are: this broker's local disk, its
tier, the tiers mounted here, and (by id) the pending messages only its timer holds
(adopted in a takeover: ``timer.lookup``).  Thread-safe."""

from __future__ import annotations

from store.message import Message
from store.store import MessageStore
from tiered.mount import MountReader
from tiered.reader import TieredReader
from timer.service import TimerService


class Queries:
    """See the module docstring.  ``tier_reader`` is None without ``tier.upload``."""

    def __init__(self, store: MessageStore, tier_reader: TieredReader | None,
                 mount_reader: MountReader, timer: TimerService) -> None:
        self._store, self._tier_reader = store, tier_reader
        self._mounts, self._timer = mount_reader, timer

    def by_message_id(self, message_id: str) -> list[Message]:
        """The message with this id: from local disk, else from the tier (then the
        mounted tiers); and the pending ones only the timer holds."""
        found = self._store.query_by_message_id(message_id)
        if not found and self._tier_reader is not None:
            found = self._tier_reader.query_by_message_id(
                message_id, self._store.ids.locate(message_id))
        for mounted in [] if found else self._mounts.mounts().values():
            found = mounted.query_by_message_id(message_id)
            if found:
                break
        topics = {m.topic for m in found}
        return found + [m for m in self._timer.pending_messages(
            message_id, known={m.commit_offset for m in found}) if m.topic not in topics]

    def by_key(self, topic: str, key: str, limit: int) -> list[Message]:
        """The newest ``limit`` messages of ``topic`` with ``key`` (oldest first): local
        disk first, the tier for older ones."""
        mounted = self._mounts.mounted(topic)
        if mounted is not None:
            return mounted.query_by_key(topic, key, limit)
        found = self._store.query_by_key(topic, key, limit)
        if len(found) >= limit or self._tier_reader is None:
            return found
        older = self._tier_reader.query_by_key(
            topic, key, limit - len(found), self._store.commitlog.min_offset,
            {(m.queue_id, m.queue_offset) for m in found})
        return older + found
