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

Keys take turns (round-robin): the keys with held entries and room wait in a ring per
(group, topic); a Pop takes one entry of the key at the front and puts that key at the
back, so every key with messages gets its share whatever order they were sent in.  A
key's order is kept: a new message of a key with held ones is held behind them.  A Pop
first hands out up to an eighth of its messages from the ring (``first_share``), then
reads on (keys not yet seen, unkeyed messages), then fills the rest from the ring: a
backlog of held keys never starves the keys still unread, nor the other way round.
A handed-out entry's deadline becomes the Pop's, in the same durable write as the Pop's
other leases, as a ChangeInvisibleTime would.  An entry leaves the count of its key when
it is acked, released, revived or dead-lettered (``LeaseBook.on_done``); then, and when
a key's rate allows again, the topic's waiting Pops and Subscribe streams are woken
(``add_listener``; a ``flow-wake`` thread times the refills).

Bounds.  A key waits in one place at a time: the ring (room now), its lane's rate heap
(room at a known time), or nowhere (at ``max_in_flight_per_key``: an end of one of its
leases puts it back), so a Pop costs O(entries handed out), whatever the number of keys.
A group holds at most ``max_held`` entries of a topic: past it a Pop stops reading ahead
rather than holding more (``read_room``; per topic, so that a deleted topic's entries,
never handed out, bound nothing else).  A key with nothing held or leased is forgotten
at once, or, with a rate, once its last second has passed (a heap of idle keys, swept a
bounded batch at a time by each call).

After a restart or a takeover the held entries are read back from their checkpoints on
the group's first Pop of the topic (``LeaseBook.held``) and queued again, by key, in
queue order; leases handed out before are not counted again (they run out as leases
do), so just after a restart a key may briefly have more than its limit.  A held entry
is never lost: it is in a durable checkpoint until acked like any lease.

Memory: per key with something held or leased about 200 bytes with its leased entry (a
few hundred more for a rate's log of the last second): a slot of its queue's dictionary
per leased entry, a small tuple per held one.
Thread-safe (one lock; callers hold the group's lease lock around a Pop's use).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from pop.checkpoint import HELD
from store.clock import Clock
from store.errors import InvalidArgument

__all__ = ["HELD", "MAX_HELD", "FlowControl", "FlowStats", "HeldEntry", "KeyLimits"]

# the window the rate is checked over: a second, and a margin for the way to a consumer
# (a message handed out late arrives sooner after the one before it)
RATE_WINDOW_MS = 1025
MAX_HELD = 100_000  # the default bound of a group's held entries
SWEEP_BATCH = 4096  # idle keys a call forgets at most (the rest on the next calls)
# where a key with held entries waits (``_Key.where``)
NOWHERE, RING, TIMED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A group's per-key limits (``[groups.<name>]``); 0 switches one off."""

    max_in_flight_per_key: int = 0
    rate_per_key: float = 0.0  # messages a second per key
    rate_burst_per_key: int = 0  # how many may go at once; 0: one (smooth)
    max_held: int = MAX_HELD  # entries held for their keys at once, per topic

    def __post_init__(self) -> None:
        if not 0 <= self.max_in_flight_per_key <= 1_000_000:
            raise InvalidArgument("max_in_flight_per_key must be between 0 (off) and "
                                  "1,000,000")
        if not 0 <= self.rate_per_key <= 1_000_000:
            raise InvalidArgument("rate_per_key must be between 0 (off) and 1,000,000 a "
                                  "second")
        if not 0 <= self.rate_burst_per_key <= 1_000_000:
            raise InvalidArgument("rate_burst_per_key must be between 0 and 1,000,000")
        if not 1 <= self.max_held <= 100_000_000:
            raise InvalidArgument("max_held must be between 1 and 100,000,000")

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


@dataclass(frozen=True, slots=True)
class FlowStats:
    """What flow control holds in memory, over every group and topic."""

    keys: int  # keys remembered (something held or leased, or a rate's second)
    held: int  # entries held for their keys
    leased: int  # keyed entries of limited groups handed out and not yet done


class _Key:
    __slots__ = ("held", "in_flight", "recent", "swept", "tat", "where")

    def __init__(self) -> None:
        self.held: deque[HeldEntry] | None = None  # created with its first held entry
        self.in_flight = 0
        # rate: when the next one is due (GCRA's arrival time; 0.0, one shared float:
        # none handed out yet)
        self.tat = 0.0
        self.recent: deque[int] | None = None  # rate: hand-outs of the last second
        self.where = NOWHERE  # RING, TIMED or NOWHERE, while it has held entries
        self.swept = False  # on the idle heap


@dataclass(slots=True)
class _Lane:
    """One (group, topic): its keys, the ring of keys with room, the keys waiting for
    their rate (``(ready_ms, seq, key)``), the count of held entries."""

    group: str
    topic: str
    keys: dict[str, _Key] = field(default_factory=dict)
    ring: deque[str] = field(default_factory=deque)
    timed: list[tuple[float, int, str]] = field(default_factory=list)
    held: int = 0


class FlowControl:
    """See the module docstring."""

    def __init__(self, limits: dict[str, KeyLimits], clock: Clock) -> None:
        self._limits = {g: lim for g, lim in limits.items() if lim.active}
        self._clock = clock
        self._lock = threading.Condition()
        self._lanes: dict[tuple[str, str], _Lane] = {}
        # (group, leased topic, queue id) -> (topic, {queue offset: key}): a leased entry
        # costs a slot of a queue's dictionary
        self._leased: dict[tuple[str, str, int], tuple[str, dict[int, str]]] = {}
        self._idle: list[tuple[float, int, _Lane, str, _Key]] = []  # forget_at, seq, ...
        self._seq = itertools.count()
        self._rebuilt: set[tuple[str, str]] = set()
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
        order; their keys take turns in the order first seen."""
        now = self._clock.now_ms()
        with self._lock:
            self._rebuilt.add((group, topic))
            for entry, key in entries:
                self._add_held(self._lane(group, topic), key, entry, now)

    def first_share(self, group: str, want: int) -> int:
        """How many of a Pop's ``want`` messages it takes from held keys before it reads
        on: an eighth (at least one) for a limited group."""
        return max(1, want // 8) if group in self._limits else want

    def read_room(self, group: str, topic: str, want: int) -> int:
        """How many messages a Pop may read ahead now: ``want``, or fewer once the group
        holds nearly ``max_held`` of ``topic`` (each one read may be held)."""
        limits = self._limits.get(group)
        if limits is None:
            return want
        with self._lock:
            lane = self._lanes.get((group, topic))
            return min(want, limits.max_held - (lane.held if lane is not None else 0))

    def admit(self, group: str, topic: str, key: str, now_ms: int) -> bool:
        """Whether a message of ``key`` just read may be leased now (then it is counted);
        False: hold it (``hold``)."""
        limits = self._limits.get(group)
        if limits is None or not key:
            return True
        with self._lock:
            self._sweep(now_ms)
            k = self._key(self._lane(group, topic), key)
            if k.held or not self._room(limits, k, now_ms):
                return False
            self._take(limits, k, now_ms)
            return True

    def hold(self, group: str, topic: str, key: str, entry: HeldEntry) -> None:
        with self._lock:
            self._add_held(self._lane(group, topic), key, entry, self._clock.now_ms())

    def leased(self, group: str, topic: str, key: str, ltopic: str, qid: int,
               queue_offset: int) -> None:
        """A keyed entry was handed out (admitted or taken from the held ones): it counts
        for its key until it is done."""
        if group in self._limits and key:
            with self._lock:
                queue = self._leased.get((group, ltopic, qid))
                if queue is None:
                    queue = self._leased[(group, ltopic, qid)] = (topic, {})
                queue[1][queue_offset] = key

    def take_ready(self, group: str, topic: str, want: int, now_ms: int
                   ) -> list[tuple[HeldEntry, str]]:
        """Up to ``want`` held entries whose keys have room now, one per key in turn
        (each key's oldest; a key served goes to the back); they are counted for their
        keys (the caller hands them out)."""
        limits = self._limits.get(group)
        out: list[tuple[HeldEntry, str]] = []
        with self._lock:
            self._sweep(now_ms)
            lane = self._lanes.get((group, topic))
            if lane is None:
                return out
            while lane.timed and lane.timed[0][0] <= now_ms:  # their rate allows again
                name = heapq.heappop(lane.timed)[2]
                lane.keys[name].where = NOWHERE
                self._park(lane, limits, name, now_ms)
            while len(out) < want and lane.ring:
                name = lane.ring.popleft()
                k = lane.keys[name]
                k.where = NOWHERE
                if not k.held:
                    continue
                if limits is not None:
                    if not self._room(limits, k, now_ms):
                        self._park(lane, limits, name, now_ms)
                        continue
                    self._take(limits, k, now_ms)
                out.append((k.held.popleft(), name))
                lane.held -= 1
                self._park(lane, limits, name, now_ms)  # to the back, if more are held
            if lane.timed:  # the next key whose rate allows it wakes the waiting Pops
                self._arm(topic, int(lane.timed[0][0]) + 1)
        return out

    def returned(self, group: str, topic: str, key: str, entry: HeldEntry) -> None:
        """A taken entry could not be handed out (its lease ended meanwhile): uncount."""
        with self._lock:
            lane = self._lanes.get((group, topic))
            k = lane.keys.get(key) if lane is not None else None
            if lane is not None and k is not None and k.in_flight:
                k.in_flight -= 1
                self._settle(lane, key, k, self._clock.now_ms())

    # ------------------------------------------------------------------ ends

    def done(self, group: str, entries: list[tuple[str, int, int]]) -> None:
        """``(leased topic, queue id, queue offset)`` entries of ``group`` are done."""
        if group not in self._limits:
            return
        woken: set[str] = set()
        with self._lock:
            now = self._clock.now_ms()
            self._sweep(now)
            for ltopic, qid, offset in entries:
                topic, queue = self._leased.get((group, ltopic, qid), ("", {}))
                name = queue.pop(offset, "")
                if not queue:
                    self._leased.pop((group, ltopic, qid), None)
                lane = self._lanes.get((group, topic))
                k = lane.keys.get(name) if lane is not None else None
                if lane is None or k is None:
                    continue
                k.in_flight = max(0, k.in_flight - 1)
                if k.held:
                    woken.add(topic)
                self._settle(lane, name, k, now)
        self._notify(woken)

    # ------------------------------------------------------------------ figures

    def held_count(self, group: str, topic: str) -> int:
        with self._lock:
            lane = self._lanes.get((group, topic))
            return lane.held if lane is not None else 0

    def statistics(self) -> FlowStats:
        with self._lock:
            self._sweep(self._clock.now_ms())
            return FlowStats(sum(len(lane.keys) for lane in self._lanes.values()),
                             sum(lane.held for lane in self._lanes.values()),
                             sum(len(q) for _, q in self._leased.values()))

    # ------------------------------------------------------------------ internals

    def _lane(self, group: str, topic: str) -> _Lane:
        lane = self._lanes.get((group, topic))
        if lane is None:
            lane = self._lanes[(group, topic)] = _Lane(group, topic)
        return lane

    @staticmethod
    def _key(lane: _Lane, key: str) -> _Key:
        k = lane.keys.get(key)
        if k is None:
            k = lane.keys[key] = _Key()
        return k

    def _add_held(self, lane: _Lane, key: str, entry: HeldEntry, now_ms: int) -> None:
        k = self._key(lane, key)
        if k.held is None:
            k.held = deque()
        k.held.append(entry)
        lane.held += 1
        if k.where == NOWHERE:
            self._park(lane, self._limits.get(lane.group), key, now_ms)

    def _park(self, lane: _Lane, limits: KeyLimits | None, name: str, now_ms: int) -> None:
        """Put a key that waits nowhere where it waits for its turn: the back of the
        ring (room now), the rate heap (room later), or nowhere (at its in-flight limit,
        or nothing held: ``_settle`` then)."""
        k = lane.keys[name]
        if not k.held:
            k.held = None
            self._settle(lane, name, k, now_ms)
            return
        if limits is not None and limits.max_in_flight_per_key and \
                k.in_flight >= limits.max_in_flight_per_key:
            return
        if limits is not None and limits.rate_per_key:
            ready = self._rate_ready_ms(limits, k, now_ms)
            if ready > now_ms:
                k.where = TIMED
                heapq.heappush(lane.timed, (ready, next(self._seq), name))
                self._arm(lane.topic, int(ready) + 1)
                return
        k.where = RING
        lane.ring.append(name)

    def _settle(self, lane: _Lane, name: str, k: _Key, now_ms: int) -> None:
        """After a key's count or held entries went down: back in turn if it holds more
        and waits nowhere; forgotten when idle; else on the idle heap."""
        if k.held:
            if k.where == NOWHERE:
                self._park(lane, self._limits.get(lane.group), name, now_ms)
        elif k.in_flight:
            return
        elif self._idle_key(k, now_ms):
            del lane.keys[name]  # nothing left to remember
        elif not k.swept:
            k.swept = True
            heapq.heappush(self._idle, (self._forget_at(k), next(self._seq), lane, name, k))

    def _sweep(self, now_ms: int) -> None:
        """Forget up to ``SWEEP_BATCH`` keys whose rate's second has passed.  Caller
        holds the lock."""
        for _ in range(SWEEP_BATCH):
            if not self._idle or self._idle[0][0] > now_ms:
                return
            _, _, lane, name, k = heapq.heappop(self._idle)
            if lane.keys.get(name) is not k:  # forgotten already, and maybe back anew
                continue
            k.swept = False
            if not k.held and not k.in_flight:
                self._settle(lane, name, k, now_ms)  # forgotten, or on the heap again

    @staticmethod
    def _forget_at(k: _Key) -> float:
        return max(k.tat, k.recent[-1] + RATE_WINDOW_MS if k.recent else 0)

    @staticmethod
    def _idle_key(k: _Key, now_ms: int) -> bool:
        """Nothing held, leased or (for its rate) handed out within the window: the key
        may be forgotten."""
        return not k.held and not k.in_flight and FlowControl._forget_at(k) <= now_ms

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
        recent = k.recent
        while recent and recent[0] <= now_ms - RATE_WINDOW_MS:
            recent.popleft()
        interval = 1000 / limits.rate_per_key
        ready = k.tat - (limits.burst - 1) * interval
        if recent and len(recent) >= max(1, int(limits.rate_per_key)) + \
                int(limits.burst) - 1:
            ready = max(ready, recent[0] + RATE_WINDOW_MS)
        return ready

    @staticmethod
    def _take(limits: KeyLimits, k: _Key, now_ms: int) -> None:
        k.in_flight += 1
        if limits.rate_per_key:
            interval = 1000 / limits.rate_per_key
            # on schedule: a hand-out a little late does not push the next ones back
            # (a key's first one: as if its bucket filled up just now)
            k.tat = max(k.tat or now_ms, now_ms - interval) + interval
            if k.recent is None:
                k.recent = deque()
            k.recent.append(now_ms)

    def _arm(self, topic: str, at_ms: int) -> None:
        """Time a wake-up of ``topic``'s waiting Pops for ``at_ms``, when a held key's rate
        allows its next message.  Caller holds the lock."""
        if topic not in self._wake_at or at_ms < self._wake_at[topic]:
            self._wake_at[topic] = at_ms
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
