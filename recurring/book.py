"""ScheduleBook: the recurring schedules of this broker and where each one stands, in a
small RocksDB (``<data>/schedules``), mirrored in memory.

Key ``b"s" + name`` -> JSON ``{"spec", "next_ms", "paused", "fired", "last_error"}``:
``next_ms`` is the next tick not yet sent (None: the schedule has ended).  Every change
is one synced write, so a schedule answered OK, and the tick a send moved past, survive
a crash.  Thread-safe.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from recurring.model import ScheduleSpec, encode_state, next_fire
from store.errors import AlreadyExists, NotFound, ResourceExhausted
from store.kv import KV

WRITE_BUFFER_BYTES = 1 << 20


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

    def encode(self) -> bytes:
        return encode_state(self.spec, self.next_ms, self.paused, self.fired,
                            self.last_error)


def _key(name: str) -> bytes:
    return b"s" + name.encode()


class ScheduleBook:
    """See the module docstring."""

    def __init__(self, path: str, max_schedules: int) -> None:
        self.kv = KV(path, write_buffer_bytes=WRITE_BUFFER_BYTES)
        self.max_schedules = max_schedules
        self._lock = threading.Lock()
        self._states: dict[str, ScheduleState] = {}
        for _, raw in self.kv.scan(b"s"):
            d = json.loads(raw)
            spec = ScheduleSpec.from_json(d["spec"])
            self._states[spec.name] = ScheduleState(spec, d["next_ms"], d["paused"],
                                                    d["fired"], d["last_error"])

    def close(self) -> None:
        self.kv.close()

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
            state = ScheduleState(spec, first)
            self.kv.write([(_key(spec.name), state.encode())], sync=True)
            self._states[spec.name] = state
            return state, True

    def get(self, name: str) -> ScheduleState:
        with self._lock:
            state = self._states.get(name)
        if state is None:
            raise NotFound(f"no schedule named {name!r}")
        return state

    def states(self) -> list[ScheduleState]:
        with self._lock:
            return sorted(self._states.values(), key=lambda s: s.spec.name)

    def set_paused(self, name: str, paused: bool, now_ms: int) -> ScheduleState:
        """Pause, or resume from the first tick after now (what came due while paused is
        not sent)."""
        with self._lock:
            state = self._states.get(name)
            if state is None:
                raise NotFound(f"no schedule named {name!r}")
            if state.paused != paused:
                state.paused = paused
                if not paused and state.next_ms is not None:
                    state.next_ms = next_fire(state.spec.trigger(), now_ms)
                self.kv.write([(_key(name), state.encode())], sync=True)
            return state

    def delete(self, name: str) -> None:
        with self._lock:
            if self._states.pop(name, None) is None:
                raise NotFound(f"no schedule named {name!r}")
            self.kv.write(deletes=[_key(name)], sync=True)

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
            if puts:
                self.kv.write(puts, sync=True)
