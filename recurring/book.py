"""ScheduleBook: the recurring schedules of this broker and where each one stands,
mirrored in memory over a durable key-value store the broker gives it.

Key ``b"Rs" + name`` -> JSON ``{"spec", "next_ms", "paused", "fired", "last_error"}``:
``next_ms`` is the next tick not yet sent (None: the schedule has ended).  Every change
is one durable write (``StateStore.write`` returns once it is), so a schedule answered
OK, and the tick a send moved past, survive a crash.  The broker keeps these keys in its
POP database, whose writes go through the state journal to the tier (``chronomq.
recurrence``): they are snapshotted with the groups' state and a broker taking this one
over adopts them (``adopt``).  Thread-safe.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from apscheduler.triggers.base import BaseTrigger

from recurring.model import MAX_NAME_BYTES, ScheduleSpec, encode_state, next_fire
from store.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted

KEY_PREFIX = b"Rs"
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
    _trigger: BaseTrigger | None = None

    def trigger(self) -> BaseTrigger:
        """The spec's trigger, built once (the spec never changes)."""
        if self._trigger is None:
            self._trigger = self.spec.trigger()
        return self._trigger

    def encode(self) -> bytes:
        return encode_state(self.spec, self.next_ms, self.paused, self.fired,
                            self.last_error)


def _key(name: str) -> bytes:
    return KEY_PREFIX + name.encode()


def decode_state(raw: bytes) -> ScheduleState:
    d = json.loads(raw)
    return ScheduleState(ScheduleSpec.from_json(d["spec"]), d["next_ms"], d["paused"],
                         d["fired"], d["last_error"])


class ScheduleBook:
    """See the module docstring."""

    def __init__(self, store: StateStore, max_schedules: int) -> None:
        self._store = store
        self.max_schedules = max_schedules
        self._lock = threading.Lock()
        self._states: dict[str, ScheduleState] = {}
        for key, raw in store.items():
            if key.startswith(KEY_PREFIX):
                state = decode_state(raw)
                self._states[state.spec.name] = state

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
                    state = ScheduleState(replace(state.spec, name=name), state.next_ms,
                                          state.paused, state.fired, state.last_error)
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
                                    "settings: delete it first")
                return old, False
            if len(self._states) >= self.max_schedules:
                raise TooManySchedules(f"this broker holds {len(self._states)} schedules, "
                                       f"its maximum (setting schedules.max_schedules)")
            # the first tick after now (at or after a later start)
            first = next_fire(spec.trigger(), max(now_ms, spec.start_ms - 1))
            if first is None:
                raise InvalidArgument(f"schedule {spec.name!r} never fires (no tick after "
                                      "now and before its end)")
            state = ScheduleState(spec, first)
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

    def set_paused(self, name: str, paused: bool, now_ms: int) -> ScheduleState:
        """Pause, or resume from the first tick after now (what came due while paused is
        not sent)."""
        with self._lock:
            state = self._states.get(name)
            if state is None:
                raise NotFound(f"no schedule named {name!r}")
            if state.paused != paused:
                nxt = next_fire(state.trigger(), now_ms) \
                    if not paused and state.next_ms is not None else state.next_ms
                changed = ScheduleState(state.spec, nxt, paused, state.fired,
                                        state.last_error)
                self._store.write([(_key(name), changed.encode())], [])
                self._states[name] = state = changed
            return state

    def delete(self, name: str) -> None:
        with self._lock:
            if name not in self._states:
                raise NotFound(f"no schedule named {name!r}")
            self._store.write([], [_key(name)])
            del self._states[name]

    def advance(self, moves: list[tuple[str, int | None, int, str]]) -> None:
        """``(name, next_ms, ticks sent, error)`` after a send: one synced write.  A
        schedule deleted or paused meanwhile is left as it is."""
        with self._lock:
            puts = []
            for name, next_ms, sent, error in moves:
                state = self._states.get(name)
                if state is None:
                    continue
                if not state.paused:
                    state.next_ms = next_ms
                state.fired += sent
                state.last_error = error
                puts.append((_key(name), state.encode()))
            for i in range(0, len(puts), WRITE_CHUNK):  # journal records of bounded size
                self._store.write(puts[i : i + WRITE_CHUNK], [])
