"""Per-key flow control at Pop: ``max_in_flight_per_key`` and ``rate_per_key``, per group.

A consumer group may limit, for each message key, how many of its messages are leased at
once (``max_in_flight_per_key``) and how many are handed out a second (``rate_per_key``,
one every ``1 / rate`` s on a schedule that a late hand-out does not push back, up to
``rate_burst_per_key`` at once; with the default burst of one, no second ever sees more
than ``rate_per_key``: a log of the last second's hand-outs checks it).  Unkeyed messages are not
limited.  A key at its limit never holds up other keys (no head-of-line blocking): a Pop
that reads a message whose key may not have another one now leases it to the broker
itself instead, *held*: its PopCheckpoint entry gets the deadline ``HELD`` (0, a time no
lease has), which no revive fires, and the entry waits in this key's queue in memory
while the Pop goes on reading.  The queue offset moves on, the ack offset waits for it.

Each Pop first hands out held entries whose keys have room, oldest first per key (a
key's order is kept: a new message of a key with held ones is held behind them): the
entry's deadline becomes the Pop's, in the same durable write as the Pop's other leases,
as a ChangeInvisibleTime would.  An entry leaves the count of its key when it is acked,
released, revived or dead-lettered (``LeaseBook.on_done``); then, and when a key's
bucket refills, the topic's waiting Pops and Subscribe streams are woken
(``add_listener``; a ``flow-wake`` thread times the refills).

After a restart or a takeover the held entries are read back from their checkpoints on
the group's first Pop of the topic (``LeaseBook.held``) and queued again, by key, in
queue order; leases handed out before are not counted again (they run out as leases
do), so just after a restart a key may briefly have more than its limit.  A held entry
is never lost: it is in a durable checkpoint until acked like any lease.

Memory: one small tuple per held entry and per leased keyed entry of a limited group.
Thread-safe (one lock; callers hold the group's lease lock around a Pop's use).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from pop.checkpoint import HELD
from store.clock import Clock
from store.errors import InvalidArgument

__all__ = ["HELD", "FlowControl", "HeldEntry", "KeyLimits"]

# the window the rate is checked over: a second, and a margin for the way to a consumer
# (a message handed out late arrives sooner after the one before it)
RATE_WINDOW_MS = 1025
PRUNE_KEYS = 4096  # keys remembered before the idle ones are swept (then twice as many)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A group's per-key limits (``[groups.<name>]``); 0 switches one off."""

    max_in_flight_per_key: int = 0
    rate_per_key: float = 0.0  # messages a second per key
    rate_burst_per_key: int = 0  # how many may go at once; 0: one (smooth)

    def __post_init__(self) -> None:
        if not 0 <= self.max_in_flight_per_key <= 1_000_000:
            raise InvalidArgument("max_in_flight_per_key must be between 0 (off) and "
                                  "1,000,000")
        if not 0 <= self.rate_per_key <= 1_000_000:
            raise InvalidArgument("rate_per_key must be between 0 (off) and 1,000,000 a "
                                  "second")
        if not 0 <= self.rate_burst_per_key <= 1_000_000:
            raise InvalidArgument("rate_burst_per_key must be between 0 and 1,000,000")

    @property
    def active(self) -> bool:
        return bool(self.max_in_flight_per_key or self.rate_per_key)

    @property
    def burst(self) -> float:
        """One token by default: then no second ever sees more than ``rate_per_key``."""
        return float(self.rate_burst_per_key or 1)


class HeldEntry(NamedTuple):
    """A checkpoint entry held for its key."""

    ltopic: str  # the leased topic (the user's or the group's retry topic)
    queue_id: int
    ck_start: int
    slot: int  # the entry's index in its checkpoint

    @property
    def queue_offset(self) -> int:
        return self.ck_start + self.slot


class _Key:
    __slots__ = ("held", "in_flight", "recent", "tat")

    def __init__(self, now_ms: int) -> None:
        self.held: deque[HeldEntry] = deque()
        self.in_flight = 0
        self.tat = float(now_ms)  # rate: when the next one is due (GCRA's arrival time)
        self.recent: deque[int] = deque()  # rate: hand-outs of the last second


class FlowControl:
    """See the module docstring."""

    def __init__(self, limits: dict[str, KeyLimits], clock: Clock) -> None:
        self._limits = {g: lim for g, lim in limits.items() if lim.active}
        self._clock = clock
        self._lock = threading.Condition()
        self._keys: dict[tuple[str, str, str], _Key] = {}  # (group, topic, key)
        self._leased: dict[tuple[str, str, int, int], tuple[str, str]] = {}  # -> topic, key
        self._rebuilt: set[tuple[str, str]] = set()
        self._prune_at = PRUNE_KEYS
        self._listeners: list[Callable[[set[str]], None]] = []
        self._wake_at: dict[str, int] = {}  # topic -> when a held key's bucket refills
        self._thread: threading.Thread | None = None
        self._stopped = False

    def limits(self, group: str) -> KeyLimits | None:
        """The group's limits, or None when it has none."""
        return self._limits.get(group)

    def add_listener(self, fn: Callable[[set[str]], None]) -> None:
        """``fn(topics)``: held messages of these topics may be handed out now."""
        self._listeners.append(fn)

    # ------------------------------------------------------------------ a Pop's side

    def needs_rebuild(self, group: str, topic: str) -> bool:
        """Whether this group's held entries of ``topic`` were not yet read back since the
        start (then ``rebuilt`` with them)."""
        with self._lock:
            return (group, topic) not in self._rebuilt

    def rebuilt(self, group: str, topic: str, entries: list[tuple[HeldEntry, str]]) -> None:
        """Queue held entries read back from their checkpoints, ``(entry, key)`` in queue
        order."""
        now = self._clock.now_ms()
        with self._lock:
            self._rebuilt.add((group, topic))
            for entry, key in entries:
                self._key(group, topic, key, now).held.append(entry)

    def admit(self, group: str, topic: str, key: str, now_ms: int) -> bool:
        """Whether a message of ``key`` just read may be leased now (then it is counted);
        False: hold it (``hold``)."""
        limits = self._limits.get(group)
        if limits is None or not key:
            return True
        with self._lock:
            k = self._key(group, topic, key, now_ms)
            if k.held or not self._room(limits, k, now_ms):
                return False
            self._take(limits, k, now_ms)
            return True

    def hold(self, group: str, topic: str, key: str, entry: HeldEntry) -> None:
        with self._lock:
            self._key(group, topic, key, self._clock.now_ms()).held.append(entry)
            self._arm(group, topic)

    def leased(self, group: str, topic: str, key: str, ltopic: str, qid: int,
               queue_offset: int) -> None:
        """A keyed entry was handed out (admitted or taken from the held ones): it counts
        for its key until it is done."""
        if group in self._limits and key:
            with self._lock:
                self._leased[(group, ltopic, qid, queue_offset)] = (topic, key)

    def take_ready(self, group: str, topic: str, want: int, now_ms: int
                   ) -> list[tuple[HeldEntry, str]]:
        """Up to ``want`` held entries whose keys have room now, each key's oldest first;
        they are counted for their keys (the caller hands them out)."""
        limits = self._limits.get(group)
        out: list[tuple[HeldEntry, str]] = []
        with self._lock:
            for (g, t, key), k in list(self._keys.items()):
                if len(out) >= want:
                    break
                if g != group or t != topic or not k.held:
                    continue
                while k.held and len(out) < want and (
                        limits is None or self._room(limits, k, now_ms)):
                    if limits is not None:
                        self._take(limits, k, now_ms)
                    out.append((k.held.popleft(), key))
            self._arm(group, topic)
        return out

    def returned(self, group: str, topic: str, key: str, entry: HeldEntry) -> None:
        """A taken entry could not be handed out (its lease ended meanwhile): uncount."""
        with self._lock:
            k = self._keys.get((group, topic, key))
            if k is not None and k.in_flight:
                k.in_flight -= 1

    # ------------------------------------------------------------------ ends

    def done(self, group: str, entries: list[tuple[str, int, int]]) -> None:
        """``(leased topic, queue id, queue offset)`` entries of ``group`` are done."""
        if group not in self._limits:
            return
        woken: set[str] = set()
        with self._lock:
            for ltopic, qid, offset in entries:
                found = self._leased.pop((group, ltopic, qid, offset), None)
                if found is None:
                    continue
                k = self._keys.get((group, *found))
                if k is None:
                    continue
                k.in_flight = max(0, k.in_flight - 1)
                if k.held:
                    woken.add(found[0])
                elif self._idle(k, self._clock.now_ms()):
                    del self._keys[(group, *found)]  # nothing left to remember
        self._notify(woken)

    # ------------------------------------------------------------------ figures

    def held_count(self, group: str, topic: str) -> int:
        with self._lock:
            return sum(len(k.held) for (g, t, _), k in self._keys.items()
                       if g == group and t == topic)

    # ------------------------------------------------------------------ internals

    def _key(self, group: str, topic: str, key: str, now_ms: int) -> _Key:
        k = self._keys.get((group, topic, key))
        if k is None:
            if len(self._keys) >= self._prune_at:  # keys a rate still remembered
                self._keys = {name: v for name, v in self._keys.items()
                              if not self._idle(v, now_ms)}
                self._prune_at = max(PRUNE_KEYS, 2 * len(self._keys))
            k = self._keys[(group, topic, key)] = _Key(now_ms)
        return k

    @staticmethod
    def _idle(k: _Key, now_ms: int) -> bool:
        """Nothing held, leased or (for its rate) handed out within the window: the key
        may be forgotten."""
        return not k.held and not k.in_flight and k.tat <= now_ms and \
            (not k.recent or k.recent[-1] <= now_ms - RATE_WINDOW_MS)

    @staticmethod
    def _room(limits: KeyLimits, k: _Key, now_ms: int) -> bool:
        if limits.max_in_flight_per_key and k.in_flight >= limits.max_in_flight_per_key:
            return False
        if limits.rate_per_key:
            return now_ms >= FlowControl._rate_ready_ms(limits, k, now_ms)
        return True

    @staticmethod
    def _rate_ready_ms(limits: KeyLimits, k: _Key, now_ms: int) -> float:
        """When the key may have its next message by its rate: on its schedule (one every
        ``1 / rate`` s, up to ``burst - 1`` early) and with fewer than ``rate + burst - 1``
        handed out in the last second (then exactly: never more than the rate in any
        second with the default burst of one)."""
        while k.recent and k.recent[0] <= now_ms - RATE_WINDOW_MS:
            k.recent.popleft()
        interval = 1000 / limits.rate_per_key
        ready = k.tat - (limits.burst - 1) * interval
        if len(k.recent) >= max(1, int(limits.rate_per_key)) + int(limits.burst) - 1:
            ready = max(ready, k.recent[0] + RATE_WINDOW_MS)
        return ready

    @staticmethod
    def _take(limits: KeyLimits, k: _Key, now_ms: int) -> None:
        k.in_flight += 1
        if limits.rate_per_key:
            interval = 1000 / limits.rate_per_key
            # on schedule: a hand-out a little late does not push the next ones back
            k.tat = max(k.tat, now_ms - interval) + interval
            k.recent.append(now_ms)

    def _arm(self, group: str, topic: str) -> None:
        """Time a wake-up for when the first held key of a rate-limited group may have
        its next message.  Caller holds the lock."""
        limits = self._limits.get(group)
        if limits is None or not limits.rate_per_key:
            return
        now = self._clock.now_ms()
        need = [k for (g, t, _), k in self._keys.items() if g == group and t == topic
                and k.held and not (limits.max_in_flight_per_key
                                    and k.in_flight >= limits.max_in_flight_per_key)]
        if not need:
            return
        at = int(min(self._rate_ready_ms(limits, k, now) for k in need)) + 1
        if topic not in self._wake_at or at < self._wake_at[topic]:
            self._wake_at[topic] = at
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flow-wake",
                                                daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                now = self._clock.now_ms()
                due = {t for t, at in self._wake_at.items() if at <= now}
                for t in due:
                    del self._wake_at[t]
                if not due:
                    nxt = min(self._wake_at.values(), default=now + 1000)
                    self._lock.wait(max(0.001, (nxt - now) / 1000))
                    continue
            self._notify(due)

    def _notify(self, topics: set[str]) -> None:
        if topics:
            for fn in self._listeners:
                fn(topics)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
