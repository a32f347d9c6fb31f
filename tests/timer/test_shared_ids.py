"""Several pending delayed messages with one id (a client-chosen id sent to two topics, one
message nacked by two groups): Cancel and Reschedule reach every one of them, or those of
one topic, and say how many they changed.  Manual clock, real RocksDB, CommitLog and a
local-directory tier for far-future messages."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from pop.model import retry_topic
from store.clock import ManualClock
from store.kv import KV
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig, TimerOutcome
from timer.store import (
    TimerStore,
    id_key,
    id_prefix,
    parse_id_key,
    parse_timer_key,
    timer_key,
)

SEC = 1000
MID = "order-1"  # client-chosen, used in two topics
# small horizons: wheel 5 s, RocksDB 10 s, TimerFlatFile buckets of 5 s
TIMER = TimerConfig(wheel_window_ms=5 * SEC, rocks_horizon_ms=10 * SEC, bucket_ms=5 * SEC,
                    preload_ahead_ms=5 * SEC, flat_batch_ms=0)


class Env:
    """A broker with topics ``a`` and ``b``; its timer is driven by hand."""

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root, self.clock = root, clock
        self.broker = Broker(BrokerConfig(store=StoreConfig(str(root / "data")), timer=TIMER),
                             clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.timer = self.broker.timer
        for name in ("a", "b"):
            if self.broker.store.topics.get(name) is None:
                self.broker.create_topic(Topic(name, 1))

    def send(self, topic: str, body: bytes, delay_ms: int, message_id: str = MID) -> None:
        now = self.clock.now_ms()
        due, flags = self.broker.sender.resolve_deliver_at(0, delay_ms, now)
        self.broker.sender.send([Draft(message_id, topic, "", "", body, b"", now, due, flags,
                                       0)]).result(10)
        self.settle()

    def settle(self) -> None:
        """Let the dispatcher catch up and write parked records (flat_batch_ms = 0)."""
        assert self.broker.store.wait_visible(10)
        self.timer.write_parked()

    def tick(self) -> None:
        now = self.clock.now_ms()
        self.timer.preload_due(now)
        while not self.timer.load_due(now):
            self.timer.deliver_due(now)
        self.timer.deliver_due(now)
        self.settle()

    def bodies(self, topic: str, group: str = "g") -> list[bytes]:
        got = self.broker.pop.pop(topic, group, 32, 60)
        for p in got:
            self.broker.pop.ack(group, p.receipt_handle)
        return sorted(p.message.body for p in got)

    def delivered(self) -> dict[str, list[bytes]]:
        return {t: self.bodies(t) for t in ("a", "b")}

    def close(self) -> None:
        self.broker.stop()


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    yield e
    e.close()


# ---------------------------------------------------------------------- the id key codec

ids = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=128)
u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(ids, u64, u64)
def test_id_and_timer_keys_round_trip(message_id: str, offset: int, due: int) -> None:
    key = id_key(message_id, offset)
    assert parse_id_key(key) == (message_id, offset)
    assert key.startswith(id_prefix(message_id))  # the prefix that finds every copy
    assert parse_timer_key(timer_key(due, offset)) == (due, offset)


@given(ids, ids, u64, u64)
def test_an_id_prefix_never_reaches_another_id(one: str, other: str, a: int, b: int) -> None:
    if one != other:
        assert not id_key(other, b).startswith(id_prefix(one))
        assert id_key(one, a) != id_key(other, b)


# ---------------------------------------------------------------------- cancel

@pytest.mark.parametrize("delay_a, delay_b", [
    (3 * SEC, 4 * SEC),  # both in the wheel's reach
    (8 * SEC, 9 * SEC),  # both in RocksDB
    (30 * SEC, 40 * SEC),  # both parked in TimerFlatFiles
    (3 * SEC, 40 * SEC),  # one of each
])
def test_cancel_reaches_every_message_with_the_id(env: Env, delay_a: int,
                                                  delay_b: int) -> None:
    # Given one client-chosen id pending in two topics
    env.send("a", b"in a", delay_a)
    env.send("b", b"in b", delay_b)
    env.tick()
    # When it is cancelled without a topic
    result = env.timer.cancel(MID)
    # Then neither is ever delivered, and the answer says two were cancelled
    env.clock.advance(60 * SEC)
    env.tick()
    assert env.delivered() == {"a": [], "b": []}
    assert (result.outcome, result.changed) == (TimerOutcome.CANCELLED, 2)
    assert env.timer.cancel(MID).outcome is TimerOutcome.NOT_FOUND


@pytest.mark.parametrize("delay_ms", [3 * SEC, 30 * SEC])
def test_cancel_with_a_topic_narrows_to_it(env: Env, delay_ms: int) -> None:
    env.send("a", b"in a", delay_ms)
    env.send("b", b"in b", delay_ms + SEC)
    result = env.timer.cancel(MID, topic="a")
    assert env.timer.cancel(MID, topic="nope").outcome is TimerOutcome.NOT_FOUND
    env.clock.advance(60 * SEC)
    env.tick()
    assert env.delivered() == {"a": [], "b": [b"in b"]}
    assert (result.outcome, result.changed) == (TimerOutcome.CANCELLED, 1)


def test_delivering_one_leaves_the_other_cancellable(env: Env) -> None:
    # Given the id in "a" due in 2 s (sent last: the newer one) and in "b" due in 4 s
    env.send("b", b"in b", 4 * SEC)
    env.send("a", b"in a", 2 * SEC)
    # When the first comes due and is delivered
    env.clock.advance(2 * SEC)
    env.tick()
    assert env.delivered() == {"a": [b"in a"], "b": []}
    # Then the second is still pending under that id, and Cancel reaches it
    assert env.timer.pending_due(MID) == env.clock.now_ms() + 2 * SEC
    result = env.timer.cancel(MID)
    env.clock.advance(60 * SEC)
    env.tick()
    assert env.delivered() == {"a": [], "b": []}
    assert (result.outcome, result.changed) == (TimerOutcome.CANCELLED, 1)
    assert env.timer.cancel(MID).outcome is TimerOutcome.ALREADY_DELIVERED


# ---------------------------------------------------------------------- reschedule

@pytest.mark.parametrize("delay_a, delay_b", [(3 * SEC, 4 * SEC), (8 * SEC, 40 * SEC)])
def test_reschedule_moves_every_message_with_the_id(env: Env, delay_a: int,
                                                    delay_b: int) -> None:
    env.send("a", b"in a", delay_a)
    env.send("b", b"in b", delay_b)
    env.tick()
    new_due = env.clock.now_ms() + 20 * SEC
    result = env.timer.reschedule(MID, new_due)
    env.clock.advance(20 * SEC - 1)
    env.tick()
    assert env.delivered() == {"a": [], "b": []}  # neither kept its old time
    env.clock.advance(1)
    env.tick()
    assert env.delivered() == {"a": [b"in a"], "b": [b"in b"]}
    assert (result.outcome, result.changed) == (TimerOutcome.RESCHEDULED, 2)


def test_reschedule_with_a_topic_narrows_to_it(env: Env) -> None:
    env.send("a", b"in a", 3 * SEC)
    env.send("b", b"in b", 4 * SEC)
    result = env.timer.reschedule(MID, env.clock.now_ms() + 30 * SEC, topic="b")
    env.clock.advance(5 * SEC)
    env.tick()
    assert env.delivered() == {"a": [b"in a"], "b": []}
    env.clock.advance(25 * SEC)
    env.tick()
    assert env.delivered() == {"a": [], "b": [b"in b"]}
    assert (result.outcome, result.changed) == (TimerOutcome.RESCHEDULED, 1)


# ---------------------------------------------------------------------- retry copies

def test_retry_copies_of_two_groups_are_both_reached(env: Env) -> None:
    # Given one message leased by two groups and nacked by both with a back-off
    env.send("a", b"m", 0)
    for group in ("g1", "g2"):
        (leased,) = env.broker.pop.pop("a", group, 1, 60)
        assert env.broker.pop.release_many(group, [(leased.receipt_handle, 5 * SEC)]) == [None]
    env.settle()
    copies = [retry_topic(g, "a") for g in ("g1", "g2")]
    # When the first group's copy is cancelled by topic, then the rest without one
    one = env.timer.cancel(MID, topic=copies[0])
    rest = env.timer.cancel(MID)
    # Then neither group gets the message again
    env.clock.advance(60 * SEC)
    env.tick()
    for group in ("g1", "g2"):
        assert env.broker.pop.pop("a", group, 32, 60) == []
    assert (one.changed, rest.changed) == (1, 1)


# ---------------------------------------------------------------------- upgrade

def test_a_timer_store_of_the_previous_version_is_read(tmp_path: Path,
                                                       manual_clock: ManualClock) -> None:
    # Given a broker with a pending message, whose timer store is put back into the
    # previous version's form: the id key without the offset, no format version
    env = Env(tmp_path, manual_clock)
    env.send("a", b"old", 8 * SEC)
    env.close()
    kv = KV(str(tmp_path / "data" / "timer"))
    ((key, value),) = list(kv.scan(b"i"))
    message_id, _ = parse_id_key(key)
    kv.write([(b"i" + message_id.encode(), value)], deletes=[key, b"!version"], sync=True)
    kv.close()
    # When a broker of this version opens it
    env = Env(tmp_path, manual_clock)
    try:
        # Then the id key is in the new form, and Cancel reaches the message
        assert [parse_id_key(k) for k, _ in env.broker.timer_store.kv.scan(b"i")] == \
            [(MID, struct.unpack(">QQ", value)[1])]
        result = env.timer.cancel(MID)
        env.clock.advance(60 * SEC)
        env.tick()
        assert env.delivered() == {"a": [], "b": []}
        assert (result.outcome, result.changed) == (TimerOutcome.CANCELLED, 1)
    finally:
        env.close()


def test_the_migration_is_idempotent(tmp_path: Path) -> None:
    path = str(tmp_path / "timer")
    timers = TimerStore(path)
    timers.add([("x", 5, 7, b"rec")], 10)
    timers.kv.write([(b"iy", struct.pack(">QQ", 6, 8))], deletes=[b"!version"])
    timers.close()
    for _ in range(2):
        timers = TimerStore(path)
        assert sorted(parse_id_key(k) for k, _ in timers.kv.scan(b"i")) == [("x", 7), ("y", 8)]
        timers.close()
