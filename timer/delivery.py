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

from operator import itemgetter

from store.message import DispatchInfo, decode_dispatch_infos
from timer.store import TimerStore, id_key_of, timer_key

Name = tuple[str, str, int]  # a copy's (message_id, topic, deliver_at_ms)
NAME_OF_DRAFT = itemgetter(0, 1, 7)  # a ``store.message.Draft``'s name


class CopyRegistry:
    def __init__(self, timers: TimerStore) -> None:
        self._timers = timers
        # a name's key, or its keys in append order when copies share the name (rare)
        self._keys: dict[Name, bytes | list[bytes]] = {}

    def register(self, names: list[Name], keys: list[bytes]) -> None:
        """Before the append: the copies named so stand for the entries at these keys."""
        registry = self._keys
        if len(set(names)) == len(names) and registry.keys().isdisjoint(names):
            registry.update(zip(names, keys, strict=True))  # no name twice: in one pass
            return
        for name, key in zip(names, keys, strict=True):
            registered = registry.setdefault(name, key)
            if registered is not key:
                registry[name] = [*registered, key] if isinstance(registered, list) \
                    else [registered, key]

    def unregister(self, name: Name, key: bytes) -> None:
        """The append of this copy failed: a copy found later is looked up instead."""
        keys = self._keys.pop(name, None)
        if isinstance(keys, list):
            if key in keys:
                keys.remove(key)
            if keys:
                self._keys[name] = keys[0] if len(keys) == 1 else keys
        elif keys is not None and keys != key:
            self._keys[name] = keys

    def registered(self) -> set[bytes]:
        """Every key whose copy is on its way into the log (a slow path: failures)."""
        out: set[bytes] = set()
        for keys in self._keys.values():
            if isinstance(keys, list):
                out.update(keys)
            else:
                out.add(keys)
        return out

    def take(self, delivered: list[DispatchInfo]
             ) -> tuple[list[bytes], list[bytes], list[DispatchInfo]]:
        """For copies the dispatcher reached: the keys to delete (each entry's key and
        id key), the timer keys this process fired, and the copies it did not register
        (for ``replayed_keys``)."""
        deletes: list[bytes] = []
        reaped: list[bytes] = []
        replayed: list[DispatchInfo] = []
        pop = self._keys.pop
        for r in delivered:
            name = (r.message_id, r.topic, r.deliver_at_ms)
            sent = pop(name, None)
            if sent is None:
                replayed.append(r)
                continue
            if isinstance(sent, list):  # the first appended: its copy is reached first
                key, rest = sent[0], sent[1:]
                self._keys[name] = rest[0] if len(rest) == 1 else rest
            else:
                key = sent
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
