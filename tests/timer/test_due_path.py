"""The due path's shortcuts keep its guarantees: a delivered copy removes its own timer
entry by key (no lookup by id, the only removal of it), a message between its copy and
that removal is delivered for every reader, and a delivery batch reads its records as
one span of the timer store; real store, RocksDB and CommitLog, manual clock."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.message import FLAG_TIMER_DELIVERY, DispatchInfo, Draft
from store.store import StoreConfig
from store.topics import Topic
from timer.model import TimerConfig, TimerOutcome
from timer.store import TimerStore, id_key, id_key_of, parse_timer_key, timer_key


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
        due, flags = self.broker.sender.resolve_deliver_at(0, delay_ms, now)
        self.broker.sender.send([Draft(message_id, topic, "", "", body, b"", now, due, flags,
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


def test_a_copy_removes_its_entry_by_key_and_the_timer_thread_writes_nothing(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: one client id pending in two topics at the same instant, and others
    env.send("a", b"dup-a", 1_000, message_id="dup")
    env.send("b", b"dup-b", 1_000, message_id="dup")
    for i in range(10):
        env.send("a", f"m{i}".encode(), 1_000)
    lookups: list[str] = []
    removals: list[object] = []
    locate = env.broker.timer_store.locate
    monkeypatch.setattr(env.broker.timer_store, "locate",
                        lambda mid: lookups.append(mid) or locate(mid))
    monkeypatch.setattr(env.broker.timer_store, "remove",
                        lambda *a, **k: removals.append(a))
    # When: the copies are appended
    env.clock.advance(1_000)
    assert env.tick() == 12
    monkeypatch.undo()
    # Then: the dispatcher removed every entry by the key its copy named, with no lookup,
    # in its own write: the timer thread removed nothing itself
    assert lookups == [] and removals == []
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


def test_between_its_copy_and_the_dispatcher_a_message_is_delivered_not_pending(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: messages due, and the dispatcher held before it reaches their copies
    env.send("a", b"x", 1_000, message_id="x")
    env.send("a", b"y", 1_000, message_id="y")
    gate, reached = threading.Event(), threading.Event()
    dispatch = env.timer.dispatch

    def held(records: list[DispatchInfo], end: int) -> None:
        if any(r.flags & FLAG_TIMER_DELIVERY for r in records):
            reached.set()
            gate.wait(10)
        dispatch(records, end)
    monkeypatch.setattr(env.timer, "dispatch", held)
    try:
        # When: the timer appends their copies (durable), the dispatcher not there yet
        env.clock.advance(1_000)
        now = env.clock.now_ms()
        env.timer.load_due(now)
        assert env.timer.deliver_due(now) == 2
        assert reached.wait(10)
        assert len(env.timer_keys()) == 4  # still in RocksDB: the dispatcher deletes them
        # Then: they are delivered for every reader meanwhile, and never fired again
        assert env.timer.cancel("x").outcome is TimerOutcome.ALREADY_DELIVERED
        assert env.timer.reschedule("y", now + 5_000).outcome is \
            TimerOutcome.ALREADY_DELIVERED
        assert env.timer.pending_due("x") is None
        env.timer.load_due(now)
        assert env.timer.deliver_due(now) == 0
        # and an entry admitted again meanwhile (a record dispatched twice, an adoption
        # repeated) is not fired a second time, nor one listed twice in one slice
        keys = sorted(k for k, _ in env.broker.timer_store.kv.scan(b"t"))
        env.timer._loader.admit([(k, now) for k in keys] * 2)
        assert env.timer.deliver_due(now) == 0
    finally:
        gate.set()
    assert env.broker.store.wait_visible(10)
    assert env.timer_keys() == []
    assert env.bodies("a") == [b"x", b"y"]
    env.clock.advance(10_000)
    assert env.tick() == 0


def test_a_copy_of_a_broker_assigned_id_writes_no_dedupe_entry(env: Env) -> None:
    # Given: a delayed message with a client-chosen id and one with a broker-assigned id
    env.send("a", b"chosen", 1_000, message_id="order-1")
    env.send("a", b"assigned", 1_000)
    env.clock.advance(1_000)
    assert env.tick() == 2
    got = {p.message.body: p.message for p in env.broker.pop.pop("a", "g", 32, 60)}
    assigned = got[b"assigned"].message_id
    # Then: both copies are found by their id; only the client's id has a dedupe entry
    # (as an immediate message with a broker-assigned id has none), and it still counts
    index = env.broker.store.index
    assert index.kv.get(b"m" + assigned.encode()) is not None
    assert index.kv.get(b"m" + b"order-1") is not None
    entries = index.dedupe_entries([("a", "order-1"), ("a", assigned)])
    assert entries[0] is not None and entries[1] is None
    found = env.broker.store.query_by_message_id(assigned)
    assert [m.body for m in found] == [b"assigned"]
    now = env.clock.now_ms()
    again = env.broker.sender.submit([Draft("order-1", "a", "", "", b"again", b"", now, now, 0, 0)],
                                     now)
    assert again.duplicate == [True]


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


@given(message_id=st.text(min_size=1, max_size=40).filter(lambda s: "\0" not in s),
       due=st.integers(min_value=0, max_value=2**64 - 1),
       offset=st.integers(min_value=0, max_value=2**64 - 1))
def test_the_id_key_of_a_timer_key_is_the_id_key_of_its_offset(message_id: str, due: int,
                                                                offset: int) -> None:
    key = timer_key(due, offset)
    assert parse_timer_key(key) == (due, offset)
    assert id_key_of(message_id, key) == id_key(message_id, offset)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["register", "take", "fail"]),
                          st.lists(st.integers(0, 5), min_size=1, max_size=6)),
                min_size=1, max_size=30))
def test_the_copy_registry_gives_each_copy_its_entries_in_append_order(
        ops: list[tuple[str, list[int]]]) -> None:
    # Given copies whose names repeat (one id pending twice in one topic at one time),
    # registered in batches, reached by the dispatcher, or failed and unregistered
    from timer.delivery import CopyRegistry
    with tempfile.TemporaryDirectory() as tmp:
        reg = CopyRegistry(TimerStore(os.path.join(tmp, "timers")))
        model: dict[tuple[str, str, int], list[bytes]] = {}
        n = 0
        for op, picks in ops:
            names = [(f"id{p}", "t", 1_000) for p in picks]
            if op == "register":
                keys = [timer_key(1_000, n + i) for i in range(len(names))]
                n += len(names)
                reg.register(names, keys)
                for name, key in zip(names, keys, strict=True):
                    model.setdefault(name, []).append(key)
            elif op == "fail":  # the append of the newest copy of each name failed
                for name in set(names) & model.keys():
                    key = model[name].pop()
                    reg.unregister(name, key)
                    if not model[name]:
                        del model[name]
            else:
                infos = [DispatchInfo(0, 0, FLAG_TIMER_DELIVERY, 0, 0, 0, due, mid, topic,
                                      "", "") for mid, topic, due in names]
                deletes, reaped, replayed = reg.take(infos)
                # Then each copy reached takes its name's oldest entry, its key and id key
                want_reaped, want_replayed, want_deletes = [], [], []
                for info, name in zip(infos, names, strict=True):
                    if model.get(name):
                        want_reaped.append(model[name].pop(0))
                        want_deletes += (want_reaped[-1], id_key_of(name[0], want_reaped[-1]))
                        if not model[name]:
                            del model[name]
                    else:
                        want_replayed.append(info)
                assert (reaped, replayed, deletes) == (want_reaped, want_replayed,
                                                       want_deletes)
            assert reg.registered() == {k for keys in model.values() for k in keys}


def test_the_due_path_benchmark_runs_in_its_short_mode() -> None:
    # bench/bench_due_path.py (its figures are in bench/RESULTS.md) in a short run: every
    # message of the instant delivered and dispatched, and its figures printed
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "bench" / "bench_due_path.py"),
                          "--messages", "3000", "--rounds", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "round 1: 3000 due at one instant, all dispatched in" in out
    assert "us CPU a message" in out
