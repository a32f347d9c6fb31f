"""CopyRegistry: which timer entry each delivered copy stands for, so that the
dispatcher deletes the entry by its key, with no read, when it reaches the copy.

The timer fires an entry, registers its key under the copy's name (id, topic, due time)
before the append, and deletes nothing itself; the dispatcher, on reaching a copy in the
CommitLog, takes the key registered for it and deletes the entry and its id key in the
same write as the timer's position (``TimerService.dispatch``), so the entry is never gone
while its copy is not in the log, and a crash in between never delivers twice.  A copy
this process did not register (appended before a restart, replayed) is looked up by its
id and checked against the pending record instead.  Copies may share a name (one
client-chosen id pending in one topic twice at one due time): the keys of a name are
kept in the order of their appends.

Not thread-safe: the owner's lock guards every call (``TimerService._lock``) but
``replayed_keys``, which only reads the timer store.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from store.message import DispatchInfo, decode_dispatch_infos
from timer.store import TimerStore, id_key_of, timer_key

Name = tuple[str, str, int]  # a copy's (message_id, topic, deliver_at_ms)
NAME_OF_DRAFT = itemgetter(0, 1, 7)  # a ``store.message.Draft``'s name


class CopyRegistry:
    def __init__(self, timers: TimerStore) -> None:
        self._timers = timers
        self._keys: dict[Name, list[bytes]] = {}

    def register(self, names: Iterable[Name], keys: Iterable[bytes]) -> None:
        """Before the append: the copies named so stand for the entries at these keys."""
        registry = self._keys
        for name, key in zip(names, keys, strict=True):
            registered = registry.get(name)
            if registered is None:
                registry[name] = [key]
            else:
                registered.append(key)

    def unregister(self, name: Name, key: bytes) -> None:
        """The append of this copy failed: a copy found later is looked up instead."""
        keys = self._keys.get(name)
        if keys and key in keys:
            keys.remove(key)
            if not keys:
                del self._keys[name]

    def registered(self) -> set[bytes]:
        """Every key whose copy is on its way into the log (a slow path: failures)."""
        return {k for keys in self._keys.values() for k in keys}

    def take(self, delivered: list[DispatchInfo]
             ) -> tuple[list[bytes], list[bytes], list[DispatchInfo]]:
        """For copies the dispatcher reached: the keys to delete (each entry's key and
        id key), the timer keys this process fired, and the copies it did not register
        (for ``replayed_keys``)."""
        deletes: list[bytes] = []
        reaped: list[bytes] = []
        replayed: list[DispatchInfo] = []
        registry = self._keys
        for r in delivered:
            name = (r.message_id, r.topic, r.deliver_at_ms)
            sent = registry.get(name)
            if not sent:
                replayed.append(r)
                continue
            if len(sent) == 1:
                key = sent[0]
                del registry[name]
            else:
                key = sent.pop(0)
            deletes += (key, id_key_of(r.message_id, key))
            reaped.append(key)
        return deletes, reaped, replayed

    def replayed_keys(self, delivered: list[DispatchInfo]) -> list[bytes]:
        """The keys to delete for copies appended before a restart: found by their id,
        and only an entry of the copy's topic and due time."""
        pending: list[tuple[DispatchInfo, bytes]] = []
        for r in delivered:
            # removed already (or pending again, for another time): nothing to do
            pending += [(r, timer_key(*loc)) for loc in self._timers.locate(r.message_id)
                        if loc[0] == r.deliver_at_ms]
        records = self._timers.records([key for _, key in pending])
        deletes: list[bytes] = []
        for (r, key), record in zip(pending, records, strict=True):
            if record is not None and decode_dispatch_infos(record, 0)[0][0].topic == r.topic:
                deletes += (key, id_key_of(r.message_id, key))
        return deletes
