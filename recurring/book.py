"""ScheduleBook: the recurring schedules of this broker and where each one stands,
mirrored in memory over a durable key-value store the broker gives it.

Keys and values (JSON, keys sorted; a field missing from an older record reads as 0)::

    b"Rs" + name -> {"spec", "next_ms", "paused", "fired", "last_error",
                     "generation", "last_ms", "recent"}            a schedule
    b"Rg" + name -> {"generation", "deleted_ms"}                   a deleted name

``next_ms`` is the next tick not yet sent (None: the schedule has ended); ``last_ms``
the latest tick handed to a send (an update or a resume starts after it: a tick is never
sent twice); ``recent`` the last ``RECENT_TICKS`` ticks sent, scheduled or by hand
(``[tick ms, message id]``, oldest first; missing: none); ``generation`` tells the
creates of one name apart, and is in the ticks' ids (``recurring.model.tick_id``).  A
delete leaves the name's tombstone with its generation; the next create of the name
takes the next one and removes the tombstone in its own write, so a schedule deleted and
created again is a new schedule whose ticks never have the old one's ids.  A tombstone
goes after ``TOMBSTONE_KEEP_MS`` (swept by a later delete): a create then starts again
at generation 0, its ticks after now, a day after any tick of the old schedule, so no id
can be the same either.

Every change is one durable write (``StateStore.write`` returns once it is), so a
schedule answered OK, and the tick a send moved past, survive a crash.  The broker keeps
these keys in its POP database, whose writes go through the state journal to the tier
(``chronomq.recurrence``): they are snapshotted with the groups' state and a broker
taking this one over adopts the schedules (``adopt``).

An engine step plans outside the lock, keeps of its plan what no change overtook
(``sending``: a schedule updated, paused or deleted meanwhile waits for the next step)
and, once the ticks are durable, moves the schedules past them (``advance``): a
schedule changed between the two keeps its change, one deleted (and created again) is
left alone.  Thread-safe.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from apscheduler.triggers.base import BaseTrigger

from recurring.model import (
    MAX_GENERATION,
    MAX_NAME_BYTES,
    RECENT_TICKS,
    ScheduleSpec,
    encode_state,
    next_fire,
    tick_id,
)
from store.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted

KEY_PREFIX = b"Rs"
TOMBSTONE_PREFIX = b"Rg"
TOMBSTONE_KEEP_MS = 86_400_000  # a deleted name's generation is kept this long
WRITE_CHUNK = 1_000  # schedules per write after a step (a journal record each)


class StateStore(Protocol):
    def items(self) -> Iterable[tuple[bytes, bytes]]: ...

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None: ...


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    """``[schedules]``."""

    max_schedules: int = 100_000  # schedules a broker holds (RESOURCE_EXHAUSTED past it)
    max_body_bytes: int = 65_536  # a schedule's message body


class TooManySchedules(ResourceExhausted):
    """The broker holds ``max_schedules`` already."""


@dataclass(slots=True)
class ScheduleState:
    spec: ScheduleSpec
    next_ms: int | None  # the next tick to send; None: ended
    paused: bool = False
    fired: int = 0  # ticks sent
    last_error: str = ""
    generation: int = 0  # which create of the name (module docstring)
    last_ms: int = 0  # the latest tick handed to a send
    recent: list[tuple[int, str]] = field(default_factory=list)  # (tick ms, id), oldest first
    _trigger: BaseTrigger | None = None

    def trigger(self) -> BaseTrigger:
        """The spec's trigger, built once (a changed spec is a new state)."""
        if self._trigger is None:
            self._trigger = self.spec.trigger()
        return self._trigger

    def message_id(self, tick_ms: int) -> str:
        return tick_id(self.spec.name, self.generation, tick_ms)

    def encode(self) -> bytes:
        return encode_state(self.spec, self.next_ms, self.paused, self.fired,
                            self.last_error, self.generation, self.last_ms, self.recent)

    def remember(self, sent: list[tuple[int, str]]) -> None:
        """Keep ``sent`` ticks as the latest (the last ``RECENT_TICKS`` of all)."""
        self.recent = [*self.recent, *sent][-RECENT_TICKS:]


# (the planned state, its ticks, the next tick after them): one schedule's part of a step
Planned = tuple[ScheduleState, list[int], int | None]
# (the planned state, its next tick, ticks stored, an error, (tick ms, id) of those stored)
Move = tuple[ScheduleState, int | None, int, str, list[tuple[int, str]]]


def _key(name: str) -> bytes:
    return KEY_PREFIX + name.encode()


def _tombstone_key(name: str) -> bytes:
    return TOMBSTONE_PREFIX + name.encode()


def decode_state(raw: bytes) -> ScheduleState:
    d = json.loads(raw)
    return ScheduleState(ScheduleSpec.from_json(d["spec"]), d["next_ms"], d["paused"],
                         d["fired"], d["last_error"], d.get("generation", 0),
                         d.get("last_ms", 0),
                         [(int(t), str(i)) for t, i in d.get("recent", [])])


def encode_tombstone(generation: int, deleted_ms: int) -> bytes:
    return json.dumps({"deleted_ms": deleted_ms, "generation": generation},
                      sort_keys=True).encode()


def decode_tombstone(raw: bytes) -> tuple[int, int]:
    """``(generation, deleted_ms)``."""
    d = json.loads(raw)
    return int(d["generation"]), int(d["deleted_ms"])


def next_generation(generation: int) -> int:
    """The generation after ``generation``: 1 to ``MAX_GENERATION``, round."""
    return generation % MAX_GENERATION + 1


class ScheduleBook:
    """See the module docstring."""

    def __init__(self, store: StateStore, max_schedules: int) -> None:
        self._store = store
        self.max_schedules = max_schedules
        self._lock = threading.Lock()
        self._states: dict[str, ScheduleState] = {}
        tombstones: list[tuple[int, str, int]] = []
        for key, raw in store.items():
            if key.startswith(KEY_PREFIX):
                state = decode_state(raw)
                self._states[state.spec.name] = state
            elif key.startswith(TOMBSTONE_PREFIX):
                generation, deleted_ms = decode_tombstone(raw)
                tombstones.append((deleted_ms, key[len(TOMBSTONE_PREFIX):].decode(),
                                   generation))
        # name -> (generation, deleted_ms), oldest delete first (swept from the front)
        self._tombstones: dict[str, tuple[int, int]] = {
            name: (generation, deleted_ms)
            for deleted_ms, name, generation in sorted(tombstones)}

    def adopt(self, items: dict[bytes, bytes], topics: set[str], origin: str = ""
              ) -> list[str]:
        """Take a departed broker's schedules of ``topics`` (its state keys, from its
        journal); returns the names taken.  One this book holds already, the same
        schedule (adopted by an earlier run of the takeover), is not taken again; one of
        a name this book uses for another schedule is taken as ``<name>.<origin>``
        (its ticks' ids follow the new name), never dropped."""
        with self._lock:
            taken = {}
            for key, raw in items.items():
                if not key.startswith(KEY_PREFIX):
                    continue
                state = decode_state(raw)
                if state.spec.topic not in topics:
                    continue
                name = state.spec.name
                if name in self._states:
                    if self._states[name].spec == state.spec or not origin:
                        continue
                    name = f"{name}.{origin}"
                    if name in self._states or len(name) > MAX_NAME_BYTES:
                        continue
                    state = replace(state, spec=replace(state.spec, name=name),
                                    _trigger=None)
                taken[name] = state
            if taken:
                self._store.write([(_key(n), st.encode()) for n, st in taken.items()], [])
                self._states.update(taken)
            return sorted(taken)

    def create(self, spec: ScheduleSpec, now_ms: int) -> tuple[ScheduleState, bool]:
        """Add a validated schedule; ``(state, created)``: an identical one already there
        is answered as it is (a retried create), another one of that name is refused."""
        with self._lock:
            old = self._states.get(spec.name)
            if old is not None:
                if old.spec != spec:
                    raise AlreadyExists(f"a schedule named {spec.name!r} exists with other "
                                        "settings: change it with UpdateSchedule (or create "
                                        "with upsert)")
                return old, False
            if len(self._states) >= self.max_schedules:
                raise TooManySchedules(f"this broker holds {len(self._states)} schedules, "
                                       f"its maximum (setting schedules.max_schedules)")
            # the first tick after now (at or after a later start)
            first = next_fire(spec.trigger(), max(now_ms, spec.start_ms - 1))
            if first is None:
                raise InvalidArgument(f"schedule {spec.name!r} never fires (no tick after "
                                      "now and before its end)")
            tombstone = self._tombstones.get(spec.name)
            state = ScheduleState(spec, first, generation=next_generation(tombstone[0])
                                  if tombstone is not None else 0)
            self._store.write([(_key(spec.name), state.encode())],
                              [_tombstone_key(spec.name)] if tombstone is not None else [])
            self._tombstones.pop(spec.name, None)
            self._states[spec.name] = state
            return state, True

    def update(self, spec: ScheduleSpec, now_ms: int) -> tuple[ScheduleState, bool]:
        """Give the schedule of ``spec.name`` these validated settings in place;
        ``(state, changed)``.  Its ticks sent stay sent and counted; its next tick is the
        new rule's first after now and after the last tick handed to a send (a tick it
        shares with the old rule is not sent twice); paused stays paused."""
        with self._lock:
            old = self._states.get(spec.name)
            if old is None:
                raise NotFound(f"no schedule named {spec.name!r}")
            if old.spec == spec:
                return old, False
            first = next_fire(spec.trigger(), max(now_ms, old.last_ms, spec.start_ms - 1))
            if first is None:
                raise InvalidArgument(f"schedule {spec.name!r} would never fire again (no "
                                      "tick after now and before its end)")
            state = ScheduleState(spec, first, old.paused, old.fired, "", old.generation,
                                  old.last_ms, list(old.recent))
            self._store.write([(_key(spec.name), state.encode())], [])
            self._states[spec.name] = state
            return state, True

    def get(self, name: str) -> ScheduleState:
        with self._lock:
            state = self._states.get(name)
        if state is None:
            raise NotFound(f"no schedule named {name!r}")
        return state

    def states(self, by_name: bool = True) -> list[ScheduleState]:
        with self._lock:
            if not by_name:
                return list(self._states.values())
            return sorted(self._states.values(), key=lambda s: s.spec.name)

    def page(self, prefix: str, after: str, limit: int
             ) -> tuple[list[ScheduleState], int, bool]:
        """Up to ``limit`` schedules whose names start with ``prefix``, by name, those
        after ``after`` (a name; "": from the first); with how many have the prefix and
        whether more follow."""
        with self._lock:
            names = sorted(n for n in self._states if n.startswith(prefix))
            start = bisect.bisect_right(names, after) if after else 0
            return ([self._states[n] for n in names[start : start + limit]], len(names),
                    start + limit < len(names))

    def set_paused(self, name: str, paused: bool, now_ms: int) -> ScheduleState:
        """Pause, or resume from the first tick after now (what came due while paused is
        not sent)."""
        with self._lock:
            state = self._states.get(name)
            if state is None:
                raise NotFound(f"no schedule named {name!r}")
            if state.paused != paused:
                nxt = next_fire(state.trigger(), max(now_ms, state.last_ms)) \
                    if not paused and state.next_ms is not None else state.next_ms
                changed = replace(state, next_ms=nxt, paused=paused,
                                  recent=list(state.recent))
                self._store.write([(_key(name), changed.encode())], [])
                self._states[name] = state = changed
            return state

    def delete(self, name: str, now_ms: int) -> None:
        """Remove the schedule, leaving its name's tombstone (module docstring); the
        tombstones older than ``TOMBSTONE_KEEP_MS`` go in the same write."""
        with self._lock:
            state = self._states.get(name)
            if state is None:
                raise NotFound(f"no schedule named {name!r}")
            generation = max(state.generation, self._tombstones.get(name, (0, 0))[0])
            swept = []
            for old, (_, deleted_ms) in self._tombstones.items():  # oldest first
                if deleted_ms >= now_ms - TOMBSTONE_KEEP_MS:
                    break
                swept.append(old)
            self._store.write([(_tombstone_key(name), encode_tombstone(generation, now_ms))],
                              [_key(name), *(_tombstone_key(n) for n in swept if n != name)])
            for old in [*swept, name]:
                self._tombstones.pop(old, None)
            self._tombstones[name] = (generation, now_ms)
            del self._states[name]

    def sending(self, plan: list[Planned]) -> list[Planned]:
        """Of a step's ``plan`` (made outside the lock), what no change overtook: a
        schedule updated, paused or deleted since waits for the next step.  Their ticks
        are marked handed to the send (``last_ms``), for an update meanwhile to start
        after them."""
        with self._lock:
            kept = [p for p in plan if self._states.get(p[0].spec.name) is p[0]]
            for state, ticks, _ in kept:
                state.last_ms = max([state.last_ms, *ticks])
            return kept

    def triggered(self, name: str, generation: int, tick_ms: int, message_id: str) -> None:
        """A tick sent by hand (TriggerSchedule) is stored: count and remember it (one
        write; a schedule deleted or created again meanwhile is left alone)."""
        with self._lock:
            state = self._states.get(name)
            if state is None or state.generation != generation:
                return
            state.fired += 1
            state.remember([(tick_ms, message_id)])
            self._store.write([(_key(name), state.encode())], [])

    def advance(self, moves: list[Move]) -> None:
        """``(planned state, next_ms, ticks sent, error, (tick, id) of those ticks)``
        after a send: one synced write.
        A schedule changed meanwhile (updated, paused, resumed) keeps the next tick that
        change gave it, already after these ticks; one deleted, or deleted and created
        again (another generation), is left as it is."""
        with self._lock:
            puts = []
            for planned, next_ms, count, error, sent in moves:
                name = planned.spec.name
                state = self._states.get(name)
                if state is None or state.generation != planned.generation:
                    continue
                if state is planned:
                    state.next_ms = next_ms
                state.fired += count
                state.remember(sent)
                state.last_error = error
                puts.append((_key(name), state.encode()))
            for i in range(0, len(puts), WRITE_CHUNK):  # journal records of bounded size
                self._store.write(puts[i : i + WRITE_CHUNK], [])
