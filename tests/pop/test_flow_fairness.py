"""Per-key flow control at scale (``pop.flowcontrol``): keys take turns whatever order
they were sent in, held messages are bounded, idle keys are forgotten; real broker
(store, RocksDB, timer), manual clock."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronomq.config import load_config
from pop.flowcontrol import FlowControl, FlowStats, HeldEntry, KeyLimits
from store.clock import ManualClock
from store.errors import InvalidArgument
from tests.pop.test_flow_control import Env


def test_keys_sent_one_after_another_all_get_their_turn(tmp_path: Path,
                                                        manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, KeyLimits(max_in_flight_per_key=1))
    try:
        # Given 100 keys of 10 messages each, sent key after key
        env.send([(f"k{k}", f"k{k}-{i}") for k in range(100) for i in range(10)])
        # When a consumer takes 32 at a time and acks them all
        served: set[str] = set()
        bodies: dict[str, list[bytes]] = defaultdict(list)
        for _ in range(4):
            got = env.take(32)
            served |= {p.message.key for p in got}
            for p in got:
                bodies[p.message.key].append(p.message.body)
            env.ack(got)
        # Then every key was served within the first four rounds
        assert served == {f"k{k}" for k in range(100)}
        # and the rest come too, each key's in order, each message once
        while got := env.take(32):
            assert len({p.message.key for p in got}) == len(got)  # one per key
            for p in got:
                bodies[p.message.key].append(p.message.body)
            env.ack(got)
        assert bodies == {f"k{k}": [f"k{k}-{i}".encode() for i in range(10)]
                          for k in range(100)}
        assert env.pop.flow.statistics() == FlowStats(keys=0, held=0, leased=0)
    finally:
        env.close()


def test_a_pop_stops_reading_ahead_at_the_held_bound(tmp_path: Path,
                                                     manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, KeyLimits(max_in_flight_per_key=1, max_held=50))
    try:
        # Given a hot key's 200 messages ahead of 5 cold keys' one each
        env.send([("hot", f"h{i}") for i in range(200)] +
                 [(f"cold-{k}", f"c{k}") for k in range(5)])
        # When a consumer takes and acks until nothing is left
        hot: list[bytes] = []
        cold = 0
        while got := env.take(32):
            # Then no more than the bound is ever held
            assert env.pop.flow.held_count("G", "t") <= 50
            hot += [p.message.body for p in got if p.message.key == "hot"]
            cold += sum(p.message.key != "hot" for p in got)
            env.ack(got)
        # and all came, the hot key's in order
        assert hot == [f"h{i}".encode() for i in range(200)] and cold == 5
    finally:
        env.close()


def test_keys_with_a_rate_are_forgotten_once_idle(tmp_path: Path,
                                                  manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, KeyLimits(rate_per_key=10))
    try:
        # Given 100 keys, one message each, taken and acked
        env.send([(f"k{k}", "x") for k in range(100)])
        got = env.take(32) + env.take(32) + env.take(32) + env.take(32)
        assert len(got) == 100
        env.ack(got)
        flow = env.pop.flow
        assert flow.statistics().keys == 100  # their rate still counts for a while
        # When their second has gone by, and the group pops again
        manual_clock.advance(1_100)
        assert env.take() == []
        # Then nothing is remembered of them
        stats = flow.statistics()
        assert (stats.keys, stats.held, stats.leased) == (0, 0, 0)
    finally:
        env.close()


def test_the_held_bound_is_a_group_setting(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[groups.g]\nmax_in_flight_per_key = 1\nmax_held = 500\n")
    assert load_config(str(path)).key_limits["g"].max_held == 500
    assert KeyLimits(max_in_flight_per_key=1).max_held == 100_000  # the default
    for bad in (0, -1, 100_000_001):
        with pytest.raises(InvalidArgument):
            KeyLimits(max_in_flight_per_key=1, max_held=bad)


@settings(max_examples=100, deadline=None)
@given(order=st.lists(st.integers(0, 9), min_size=1, max_size=120),
       wants=st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_keys_with_room_are_served_in_turn(order: list[int], wants: list[int]) -> None:
    """The state machine alone: messages of ten keys held in any order, taken in batches
    of any size with a limit that never binds: at every point, two keys that still hold
    messages have been served as often as each other, give or take one."""
    clock = ManualClock(1_000_000)
    flow = FlowControl({"G": KeyLimits(max_in_flight_per_key=1_000)}, clock)
    try:
        left: Counter[str] = Counter()
        for offset, k in enumerate(order):
            flow.hold("G", "t", f"k{k}", HeldEntry("t", 0, offset, 0))
            left[f"k{k}"] += 1
        served: Counter[str] = Counter()
        for want in wants * 5:
            for _, key in flow.take_ready("G", "t", want, clock.now_ms()):
                served[key] += 1
                left[key] -= 1
                holding = [served[k] for k in left if left[k] > 0]
                assert not holding or served[key] <= min(holding) + 1
        assert sum(served.values()) == min(len(order), sum(wants) * 5)
    finally:
        flow.stop()
