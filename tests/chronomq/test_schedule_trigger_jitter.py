"""Jitter, fire-now and recent ticks (issue 53, item 5) from outside: ``jitter_ms`` spreads
the ticks of schedules on the same minute over the window, each tick at its own
deterministic offset (the same when it is sent again), never before it, its id still
the tick's; TriggerSchedule sends one tick now under its own id; every schedule shows
its last ticks sent, kept across a restart.  Over real gRPC on 127.0.0.1 with real
RocksDB, the broker's clock manual (``ManualBroker``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.client import RpcError
from chronomq.v1 import broker_pb2 as pb
from recurring.model import MAX_JITTER_MS, jitter_offset_ms
from tests.manual_broker import ManualBroker

SEC, MIN = 1_000, 60_000
JITTER_MS = 30_000


def _start_ms() -> int:
    return (int(time.time() * 1000) // MIN + 1) * MIN  # a whole minute


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    e = ManualBroker(tmp_path, {"t": 2}, start_ms=_start_ms())
    yield e
    e.close()


def _take(env: ManualBroker) -> list[pb.ReceivedMessage]:
    """Pop and ack everything visible in ``t``."""
    got: list[pb.ReceivedMessage] = []
    while batch := env.client.pop("t", "g", max_messages=32):
        got += batch
        env.client.ack("g", [m.receipt_handle for m in batch])
    return got


def test_jitter_spreads_a_minutes_ticks_each_at_its_offset_never_early(
        env: ManualBroker) -> None:
    # Given 200 schedules on the same minute, with a 30 s jitter
    start = env.clock.now_ms()
    tick = start + MIN
    names = [f"s{i}" for i in range(200)]
    for name in names:
        env.client.create_schedule(name, "t", b"x", every_s=60, jitter_ms=JITTER_MS)
    # When the minute comes and the clock walks through the window a second at a time
    arrived: dict[str, tuple[int, int]] = {}  # id -> (deliver_at_ms, popped at)
    assert env.tick(MIN) == 200
    for _ in range(JITTER_MS // SEC):
        for m in _take(env):
            assert m.message_id not in arrived, f"{m.message_id} came twice"
            arrived[m.message_id] = (m.deliver_at_ms, env.clock.now_ms())
        env.tick(SEC)
    for m in _take(env):
        arrived[m.message_id] = (m.deliver_at_ms, env.clock.now_ms())
    # Then each tick came once, under the tick's id, due at tick + its own offset,
    # never before it, and the 200 are spread over the window, not in one millisecond
    assert set(arrived) == {f"{n}@{tick}" for n in names}
    for name in names:
        due, seen = arrived[f"{name}@{tick}"]
        assert due == tick + jitter_offset_ms(name, 0, tick, JITTER_MS)
        assert tick <= due < tick + JITTER_MS and seen >= due
    dues = sorted(due for due, _ in arrived.values())
    assert len(set(dues)) > 150 and dues[-1] - dues[0] > JITTER_MS // 2
    # and each second of the window saw some, none at once (a few per second)
    per_second = [sum(1 for d in dues if s <= (d - tick) // SEC < s + 1) for s in range(30)]
    assert max(per_second) < 30, per_second


def test_a_tick_sent_again_keeps_its_time(env: ManualBroker,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a jittered schedule whose step dies after the send, before the book moves
    tick = env.clock.now_ms() + MIN
    env.client.create_schedule("r", "t", b"x", every_s=60, jitter_ms=JITTER_MS)
    book = env.broker.schedules.book
    real_advance = book.advance

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the broker died before the book moved")

    monkeypatch.setattr(book, "advance", crash)
    with pytest.raises(RuntimeError):
        env.tick(MIN)
    # When the next step sends the same tick again
    monkeypatch.setattr(book, "advance", real_advance)
    env.tick(SEC)
    env.tick(JITTER_MS)
    # Then it is stored once, due at the same instant
    (m,) = _take(env)
    assert (m.message_id, m.deliver_at_ms) == (
        f"r@{tick}", tick + jitter_offset_ms("r", 0, tick, JITTER_MS))
    assert jitter_offset_ms("r", 0, tick, JITTER_MS) != jitter_offset_ms("r", 1, tick,
                                                                         JITTER_MS)


def test_jitter_is_bounded(env: ManualBroker) -> None:
    for kwargs in ({"every_s": 60, "jitter_ms": 60_000},  # not less than the interval
                   {"cron": "0 9 * * *", "jitter_ms": MAX_JITTER_MS + 1}):
        with pytest.raises(RpcError) as err:
            env.client.create_schedule("j", "t", b"x", **kwargs)  # type: ignore[arg-type]
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, kwargs
    made, _ = env.client.create_schedule("j", "t", b"x", cron="0 9 * * *",
                                         jitter_ms=MAX_JITTER_MS)
    assert made.jitter_ms == MAX_JITTER_MS
    changed, updated = env.client.update_schedule("j", jitter_ms=0)
    assert updated and changed.jitter_ms == 0


def test_trigger_sends_one_tick_now_under_its_own_id(env: ManualBroker) -> None:
    # Given an hourly schedule, paused
    env.client.create_schedule("h", "t", b"hourly", every_s=3600, jitter_ms=JITTER_MS)
    env.client.pause_schedule("h")
    now = env.clock.now_ms()
    # When it is triggered
    fired = env.client.trigger_schedule("h")
    # Then one message went out now, with the trigger's id, not a tick's
    assert (fired.message_id, fired.tick_ms) == (f"h!{now}", now)
    env.tick(0)
    (m,) = _take(env)
    assert (m.message_id, m.body, m.deliver_at_ms) == (f"h!{now}", b"hourly", now)
    assert fired.schedule.fired == 1 and fired.schedule.paused
    assert [(r.tick_ms, r.message_id) for r in fired.schedule.recent_ticks] == \
        [(now, f"h!{now}")]
    # a name created again triggers under its generation; an unknown name is NOT_FOUND
    env.client.delete_schedule("h")
    env.client.create_schedule("h", "t", b"again", every_s=3600)
    env.clock.advance(5)
    assert env.client.trigger_schedule("h").message_id == f"h~1!{now + 5}"
    with pytest.raises(RpcError) as err:
        env.client.trigger_schedule("nope")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_recent_ticks_are_the_last_five_and_survive_a_restart(tmp_path: Path) -> None:
    start = _start_ms()
    env = ManualBroker(tmp_path, {"t": 1}, start_ms=start)
    try:
        # Given seven ticks sent and one by hand
        env.client.create_schedule("m", "t", b"x", every_s=60)
        for _ in range(7):
            env.tick(MIN)
        env.clock.advance(SEC)
        by_hand = env.client.trigger_schedule("m").message_id
        (listed,) = env.client.list_schedules("m")
    finally:
        env.close()
    # Then the list shows the last five, oldest first
    expected = [(start + i * MIN, f"m@{start + i * MIN}") for i in range(4, 8)] + \
        [(start + 7 * MIN + SEC, by_hand)]
    assert [(r.tick_ms, r.message_id) for r in listed.recent_ticks] == expected
    assert listed.fired == 8
    # When the broker starts again on the same data
    again = ManualBroker(tmp_path, {}, start_ms=start + 7 * MIN + 2 * SEC)
    try:
        (after,) = again.client.list_schedules("m")
        assert [(r.tick_ms, r.message_id) for r in after.recent_ticks] == expected
    finally:
        again.close()
