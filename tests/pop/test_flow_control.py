"""Per-key flow control at Pop (``pop.flowcontrol``): a key at its limit never holds up
other keys, keeps its order, and loses nothing across restarts; real broker (store,
RocksDB, timer), manual clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, load_config
from pop.flowcontrol import RATE_WINDOW_MS, FlowControl, HeldEntry, KeyLimits
from pop.service import PoppedMessage
from store.clock import ManualClock
from store.errors import InvalidArgument
from store.message import Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from tests.chronomq.test_journal_snapshots import _broker

LIMITED = {"G": KeyLimits(max_in_flight_per_key=1)}  # group G: one lease per key


class Env:
    def __init__(self, root: Path, clock: ManualClock, limits: KeyLimits) -> None:
        self.root, self.clock, self.limits = root, clock, limits
        cfg = BrokerConfig(store=StoreConfig(str(root / "data")), key_limits={"G": limits})
        self.broker = Broker(cfg, clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.pop = self.broker.pop
        if self.broker.store.topics.get("t") is None:
            self.broker.create_topic(Topic("t", 2))

    def send(self, keyed: list[tuple[str, str]]) -> None:
        """``(key, body)`` in this order."""
        now = self.clock.now_ms()
        drafts = [draft_of(Message("", "t", body.encode(), key=key, born_at_ms=now))
                  for key, body in keyed]
        self.broker.sender.send(drafts).result(10)
        assert self.broker.store.wait_visible(10)

    def take(self, n: int = 32, group: str = "G") -> list[PoppedMessage]:
        return self.pop.pop("t", group, n, 30)

    def ack(self, got: list[PoppedMessage], group: str = "G") -> None:
        for p in got:
            self.pop.ack(group, p.receipt_handle)

    def close(self) -> None:
        self.broker.stop()


@pytest.fixture
def one_in_flight(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock, KeyLimits(max_in_flight_per_key=1))
    yield e
    e.close()


def _hot_and_cold(hot: int, cold_keys: int, per_cold: int) -> list[tuple[str, str]]:
    """The hot key's messages first, then the cold keys', then unkeyed ones."""
    out = [("hot", f"hot-{i}") for i in range(hot)]
    out += [(f"cold-{k}", f"cold-{k}-{i}") for i in range(per_cold) for k in range(cold_keys)]
    return out + [("", f"plain-{i}") for i in range(5)]


def test_a_key_at_its_limit_never_holds_up_the_others(one_in_flight: Env) -> None:
    env = one_in_flight
    # Given a hot key's 300 messages queued before 40 cold keys' 3 each and 5 unkeyed
    env.send(_hot_and_cold(300, 40, 3))
    # When a consumer takes without acking the hot key's one
    got: list[PoppedMessage] = []
    while batch := env.take():
        got += batch
        env.ack([p for p in batch if p.message.key != "hot"])
    # Then every cold and unkeyed message came, and the hot key's first only
    keys = Counter(p.message.key for p in got)
    assert keys["hot"] == 1 and keys[""] == 5
    assert all(keys[f"cold-{k}"] == 3 for k in range(40))
    assert env.pop.flow.held_count("G", "t") == 299
    # and each ack of the hot key lets exactly the next one out, in order
    hot = [p for p in got if p.message.key == "hot"]
    for i in range(1, 300):
        env.ack(hot)
        hot = env.take()
        assert [p.message.body for p in hot] == [f"hot-{i}".encode()]
    env.ack(hot)
    assert env.take() == [] and env.pop.flow.held_count("G", "t") == 0


def test_other_groups_and_unkeyed_messages_are_not_limited(one_in_flight: Env) -> None:
    env = one_in_flight
    env.send([("hot", f"h{i}") for i in range(10)])
    assert len(env.take(group="free")) == 10  # no limits for this group
    assert len(env.take()) == 1


def test_a_rate_per_key_hands_out_at_most_its_tokens(tmp_path: Path,
                                                     manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, KeyLimits(rate_per_key=5, rate_burst_per_key=5))
    try:
        env.send([("hot", f"h{i}") for i in range(40)] + [("cold", "c")])
        first = env.take()
        assert sorted(p.message.key for p in first) == ["cold"] + ["hot"] * 5  # the burst
        env.ack(first)
        assert env.take() == []  # no token left
        manual_clock.advance(199)
        assert env.take() == []  # 0.995 of a token
        manual_clock.advance(1)
        assert [p.message.body for p in env.take()] == [b"h5"]
        manual_clock.advance(1_000)
        assert [p.message.body for p in env.take()] == [b"h6", b"h7", b"h8", b"h9", b"h10"]
        # one every 200 ms on schedule, and never more than rate + burst - 1 (9) in any
        # window of 1,025 ms (a second and a margin for the way to a consumer): the
        # fourth of the next second's waits for the five handed out together to leave it
        counts = []
        for _ in range(10):
            manual_clock.advance(100)
            counts.append(len(env.take()))
        assert counts == [0, 1, 0, 1, 0, 1, 0, 1, 0, 0]
        manual_clock.advance(25)
        assert len(env.take()) == 1
    finally:
        env.close()


def test_held_messages_survive_a_restart_and_come_once(tmp_path: Path,
                                                       manual_clock: ManualClock) -> None:
    limits = KeyLimits(max_in_flight_per_key=2)
    env = Env(tmp_path, manual_clock, limits)
    env.send([("hot", f"h{i}") for i in range(20)] + [("cold", "c")])
    got = env.take()
    assert sorted(p.message.body for p in got) == [b"c", b"h0", b"h1"]
    env.ack(got)
    # When the broker stops with 18 held and starts again
    env.close()
    env = Env(tmp_path, manual_clock, limits)
    try:
        # Then they are read back and handed out, two at a time, in order, each once
        seen: list[bytes] = []
        while batch := env.take():
            assert len(batch) <= 2
            seen += [p.message.body for p in batch]
            env.ack(batch)
        assert seen == [f"h{i}".encode() for i in range(2, 20)]
    finally:
        env.close()


def test_without_limits_held_messages_are_handed_out(tmp_path: Path,
                                                     manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, KeyLimits(max_in_flight_per_key=1))
    env.send([("hot", f"h{i}") for i in range(5)])
    assert len(env.take()) == 1
    env.close()
    env = Env(tmp_path, manual_clock, KeyLimits())  # the limit taken off
    try:
        assert sorted(p.message.body for p in env.take()) == [b"h1", b"h2", b"h3", b"h4"]
    finally:
        env.close()


def test_a_handed_out_message_whose_lease_runs_out_comes_back_within_the_limit(
        one_in_flight: Env, manual_clock: ManualClock) -> None:
    env = one_in_flight
    env.send([("hot", "h0"), ("hot", "h1")])
    assert [p.message.body for p in env.take()] == [b"h0"]
    manual_clock.advance(30_000)  # its lease runs out: revived to the retry topic
    env.pop.revive_due(manual_clock.now_ms())
    assert env.broker.store.wait_visible(10)
    got = env.take()
    assert [p.message.body for p in got] == [b"h1"]  # the held one, not both
    env.ack(got)
    (again,) = env.take()
    assert again.message.body == b"h0" and again.delivery_attempt == 2


def test_bad_limits_are_refused_at_load(tmp_path: Path) -> None:
    for line in ("max_in_flight_per_key = -1", "rate_per_key = -5",
                 "rate_per_key = \"fast\"", "rate_burst_per_key = 99999999"):
        path = tmp_path / "c.toml"
        path.write_text(f"[groups.g]\n{line}\n")
        with pytest.raises(InvalidArgument):
            load_config(str(path))
    path.write_text("[groups.g]\nmax_in_flight_per_key = 3\nrate_per_key = 2.5\n")
    assert load_config(str(path)).key_limits["g"] == KeyLimits(3, 2.5, 0)


@settings(max_examples=150, deadline=None)
@given(max_in_flight=st.integers(0, 3), rate=st.sampled_from([0, 1, 5, 50]),
       burst=st.integers(0, 3),
       ops=st.lists(st.tuples(st.sampled_from(["read", "take", "done", "wait"]),
                              st.integers(0, 2), st.integers(0, 400)), max_size=80))
def test_flow_control_keeps_its_limits_and_each_keys_order(
        max_in_flight: int, rate: int, burst: int,
        ops: list[tuple[str, int, int]]) -> None:
    """The state machine alone, on a manual clock: never more leased per key than the
    limit, never more handed out per key in a window than rate + burst - 1, each key's
    messages in the order they were read, none lost or given twice."""
    clock = ManualClock(1_000_000)
    limits = KeyLimits(max_in_flight, float(rate), burst)
    flow = FlowControl({"G": limits}, clock)
    next_offset = 0
    read: dict[str, list[int]] = {}  # key -> offsets read, in order
    out: dict[str, list[int]] = {}  # key -> offsets handed out, in order
    leased: dict[str, list[int]] = {}  # key -> offsets leased now
    times: dict[str, list[int]] = {}
    try:
        for op, k, n in ops:
            key = f"k{k}"
            now = clock.now_ms()
            if op == "read":  # a Pop reads one message of this key
                offset, next_offset = next_offset, next_offset + 1
                read.setdefault(key, []).append(offset)
                if flow.admit("G", "t", key, now):
                    got = [(key, offset)]
                else:
                    flow.hold("G", "t", key, HeldEntry("t", 0, offset, 0))
                    got = []
            elif op == "take":
                got = [(kk, e.queue_offset) for e, kk in flow.take_ready("G", "t", 1 + n % 5,
                                                                          now)]
            elif op == "done" and leased.get(key):
                flow.done("G", [("t", 0, leased[key].pop(0))])
                got = []
            else:
                clock.advance(n)
                got = []
            for kk, offset in got:
                flow.leased("G", "t", kk, "t", 0, offset)
                out.setdefault(kk, []).append(offset)
                leased.setdefault(kk, []).append(offset)
                times.setdefault(kk, []).append(now)
                if max_in_flight:
                    assert len(leased[kk]) <= max_in_flight
        cap = (max(1, rate) + max(burst, 1) - 1) if rate else None
        for kk, offsets in out.items():
            assert offsets == read[kk][:len(offsets)]  # in order, none twice
            if cap is not None:
                ts = times[kk]
                assert all(ts[i + cap] - ts[i] >= RATE_WINDOW_MS
                           for i in range(len(ts) - cap))
        held = sum(len(read[kk]) - len(out.get(kk, [])) for kk in read)
        assert flow.held_count("G", "t") == held  # none lost
    finally:
        flow.stop()


def test_a_takeover_hands_out_what_the_departed_broker_held(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given A: a hot key's 20 messages and 5 cold ones; G leased the hot key's first (60 s,
    # never acked) and acked the cold ones; A held the other 19 hot ones, then went away
    a = _broker(tmp_path, "a", manual_clock, LIMITED)
    try:
        a.create_topic(Topic("t", 2))
        a.sender.send([draft_of(Message("", "t", f"h{i}".encode(), key="hot")) for i in range(20)]
                      + [draft_of(Message("", "t", f"c{i}".encode(), key=f"c{i}"))
                         for i in range(5)]).result(10)
        assert a.store.wait_visible(10)
        got = a.pop.pop("t", "G", 32, 60)
        assert sorted(p.message.body for p in got) == [b"c0", b"c1", b"c2", b"c3", b"c4",
                                                       b"h0"]
        a.pop.ack_many("G", [p.receipt_handle for p in got if p.message.key != "hot"])
        assert a.pop.flow.held_count("G", "t") == 19
    finally:
        a.stop()
    # When B takes A over
    b = _broker(tmp_path, "b", manual_clock, LIMITED)
    try:
        b.takeover("a", force=True)
        # Then B hands the held ones out one at a time, in order (A's lease of h0 is not
        # counted here: it runs out as leases do, and h0 comes back after it)
        seen: list[bytes] = []
        while batch := b.pop.pop("t", "G", 32, 60):
            assert len(batch) == 1
            seen += [p.message.body for p in batch]
            b.pop.ack_many("G", [p.receipt_handle for p in batch])
        assert seen == [f"h{i}".encode() for i in range(1, 20)]
        manual_clock.advance(60_000)
        b.pop.revive_due()
        assert b.store.wait_visible(10)
        assert [p.message.body for p in b.pop.pop("t", "G", 32, 60)] == [b"h0"]
    finally:
        b.stop()


def test_a_keys_rate_holds_after_its_last_lease_ended() -> None:
    # Given rate_per_key = 1 and a key whose one leased message was acked at once
    clock = ManualClock(1_000_000)
    flow = FlowControl({"G": KeyLimits(rate_per_key=1)}, clock)
    try:
        assert flow.admit("G", "t", "k", clock.now_ms())
        flow.leased("G", "t", "k", "t", 0, 0)
        flow.done("G", [("t", 0, 0)])
        # Then its next message still waits for its second
        assert not flow.admit("G", "t", "k", clock.now_ms() + 10)
        clock.advance(1_025)
        assert flow.admit("G", "t", "k", clock.now_ms())
    finally:
        flow.stop()
