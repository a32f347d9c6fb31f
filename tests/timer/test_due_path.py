"""The due path's shortcuts keep its guarantees: a delivered copy removes its own timer
entry by key (no lookup by id) and a delivery batch reads its records as one span of the
timer store; real store, RocksDB and CommitLog, manual clock."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.errors import StoreError
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig, TimerOutcome
from timer.store import TimerStore, timer_key


class Env:
    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root, self.clock = root, clock
        self.broker = Broker(BrokerConfig(store=StoreConfig(str(root / "data")),
                                          timer=TimerConfig(wheel_window_ms=60_000)), clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.timer = self.broker.timer
        for name in ("a", "b"):
            if self.broker.store.topics.get(name) is None:
                self.broker.create_topic(Topic(name, 2))

    def send(self, topic: str, body: bytes, delay_ms: int, message_id: str = "") -> None:
        now = self.clock.now_ms()
        due, flags = self.broker.resolve_deliver_at(0, delay_ms, now)
        self.broker.send([Draft(message_id, topic, "", "", body, b"", now, due, flags,
                                0)]).result(10)
        assert self.broker.store.wait_visible(10)

    def tick(self) -> int:
        now = self.clock.now_ms()
        delivered = 0
        while True:
            complete = self.timer.load_due(now)
            delivered += self.timer.deliver_due(now)
            if complete:
                break
        assert self.broker.store.wait_visible(10)
        return delivered

    def bodies(self, topic: str) -> list[bytes]:
        got = self.broker.pop.pop(topic, "g", 32, 60)
        for p in got:
            self.broker.pop.ack("g", p.receipt_handle)
        return sorted(p.message.body for p in got)

    def timer_keys(self) -> list[bytes]:
        return [k for k, _ in self.broker.timer_store.kv.scan(b"t")] + \
            [k for k, _ in self.broker.timer_store.kv.scan(b"i")]


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    yield e
    e.broker.stop()


def test_a_copy_removes_its_entry_by_key_when_the_timer_could_not(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: one client id pending in two topics at the same instant, and others
    env.send("a", b"dup-a", 1_000, message_id="dup")
    env.send("b", b"dup-b", 1_000, message_id="dup")
    for i in range(10):
        env.send("a", f"m{i}".encode(), 1_000)
    lookups: list[str] = []
    locate = env.broker.timer_store.locate
    monkeypatch.setattr(env.broker.timer_store, "locate",
                        lambda mid: lookups.append(mid) or locate(mid))

    def refuse(*_: object, **__: object) -> None:
        raise StoreError("injected: the timer's own removal failed")
    monkeypatch.setattr(env.broker.timer_store, "remove", refuse)
    # When: the copies are appended and the timer's own removal of their entries fails
    env.clock.advance(1_000)
    with pytest.raises(StoreError):
        env.tick()
    assert env.broker.store.wait_visible(10)
    monkeypatch.undo()
    # Then: the dispatcher removed every entry by the key its copy named, with no lookup
    assert lookups == []
    assert env.timer_keys() == []
    assert env.timer.cancel("dup").outcome is TimerOutcome.ALREADY_DELIVERED
    assert env.bodies("a") == sorted([b"dup-a"] + [f"m{i}".encode() for i in range(10)])
    assert env.bodies("b") == [b"dup-b"]
    # and a restart delivers none of them again
    env.broker.stop()
    again = Env(env.root, env.clock)
    try:
        env.clock.advance(60_000)
        assert again.tick() == 0
        assert again.bodies("a") == [] and again.bodies("b") == []
    finally:
        env.broker = again.broker


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=120),
       gone=st.sets(st.integers(min_value=0, max_value=119)),
       wanted=st.sets(st.integers(min_value=0, max_value=119), min_size=1),
       ghosts=st.sets(st.integers(min_value=120, max_value=200), max_size=5))
def test_a_span_read_returns_what_a_multi_get_does(n: int, gone: set[int], wanted: set[int],
                                                    ghosts: set[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = TimerStore(os.path.join(tmp, "timers"))
        try:
            entries = [(f"id{i}", 1_000 + i // 7, i, f"record {i}".encode())
                       for i in range(n)]
            store.add(entries, 0)
            store.remove([(timer_key(1_000 + i // 7, i), f"id{i}") for i in gone if i < n])
            keys = sorted(timer_key(1_000 + i // 7, i) for i in wanted | ghosts)
            assert store.records_run(keys) == store.records(keys)
        finally:
            store.close()
