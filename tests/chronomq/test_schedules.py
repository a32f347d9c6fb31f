"""Recurring schedules from outside: the RPCs, the client and the CLI over real gRPC on
127.0.0.1 with the broker's manual clock (its engine driven by hand), and kill -9 around
a tick with a real server process."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import grpc
import pytest

import cluster.takeover
from chronomq.broker import Broker
from chronomq.cli import main
from chronomq.client import ChronomqClient, RpcError
from recurring.book import ScheduleConfig
from recurring.model import ScheduleSpec
from store.clock import ManualClock
from store.crashpoint import CRASH_EXIT_CODE
from store.errors import Unavailable
from store.topics import Topic
from testkit.process import ServerProcess
from tests.chronomq.test_journal_snapshots import _broker
from tests.conftest import broker_config, run_timer
from tests.manual_broker import ManualBroker

MIN = 60_000


def _step(b: Broker, clock: ManualClock, ms: int) -> int:
    """Move the clock; do what the schedules and timer threads would do."""
    now = clock.advance(ms)
    sent = b.schedules.fire_due(now)
    run_timer(b, now)
    return sent


def _env(root: Path, max_schedules: int = 100_000, start_ms: int | None = None
         ) -> ManualBroker:
    config = dataclasses.replace(broker_config(root / "data"),
                                 schedules=ScheduleConfig(max_schedules=max_schedules))
    # a whole minute, so every-minute ticks fall on the clock's steps
    start_ms = start_ms or (int(time.time() * 1000) // MIN + 1) * MIN
    return ManualBroker(root, {"t": 2}, config, start_ms)


def _ids(env: ManualBroker) -> list[str]:
    """Pop and ack everything visible in ``t``; the ids by due time."""
    got: list[str] = []
    while batch := env.client.pop("t", "g", max_messages=32):
        got += [m.message_id for m in batch]
        env.client.ack("g", [m.receipt_handle for m in batch])
    return sorted(got, key=lambda i: int(i.rsplit("@", 1)[1]))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    e = _env(tmp_path)
    yield e
    e.close()


def test_every_minute_one_message_per_tick_with_its_id_and_due_time(env: ManualBroker) -> None:
    start = env.clock.now_ms()
    made, created = env.client.create_schedule("report", "t", b"run the report",
                                               cron="* * * * *", key="k", tag="daily",
                                               properties={"p": "1"})
    assert created and made.next_fire_ms == start + MIN and made.fired == 0
    assert env.client.create_schedule("report", "t", b"run the report", cron="* * * * *",
                                      key="k", tag="daily", properties={"p": "1"})[1] is False
    assert env.tick(MIN - 1001) == 0
    assert env.tick(1) == 1  # sent a second ahead, due at the tick
    assert env.tick(999) == 0 and env.client.pop("t", "g") == []  # never early
    env.tick(1)
    (m,) = env.client.pop("t", "g", max_messages=32)
    assert (m.message_id, m.body, m.key, m.tag, dict(m.properties), m.deliver_at_ms) == (
        f"report@{start + MIN}", b"run the report", "k", "daily", {"p": "1"}, start + MIN)
    env.client.ack("g", [m.receipt_handle])
    for _ in range(5):
        env.tick(MIN)
    assert _ids(env) == [f"report@{start + i * MIN}" for i in range(2, 7)]
    (listed,) = env.client.list_schedules()
    assert listed.fired == 6 and listed.next_fire_ms == start + 7 * MIN
    assert env.client.next_fires("report", 3) == [start + (7 + i) * MIN for i in range(3)]


def test_pause_resume_and_delete(env: ManualBroker) -> None:
    start = env.clock.now_ms()
    env.client.create_schedule("p", "t", b"x", every_s=60)
    env.tick(MIN)
    assert env.client.pause_schedule("p").paused
    env.tick(3 * MIN)  # paused: nothing, and nothing owed
    assert _ids(env) == [f"p@{start + MIN}"]
    resumed = env.client.resume_schedule("p")
    assert not resumed.paused and resumed.next_fire_ms == start + 5 * MIN
    env.tick(MIN)
    assert _ids(env) == [f"p@{start + 5 * MIN}"]
    env.client.delete_schedule("p")
    env.tick(5 * MIN)
    assert _ids(env) == [] and env.client.list_schedules() == []
    with pytest.raises(RpcError) as err:
        env.client.delete_schedule("p")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("misfire", "expected"), [
    ("skip", []), ("once", [9]), ("all", [7, 8, 9])])
def test_ticks_missed_while_no_broker_ran_follow_the_misfire_policy(
        env: ManualBroker, misfire: str, expected: list[int]) -> None:
    start = env.clock.now_ms()
    env.client.create_schedule("m", "t", b"x", every_s=60, misfire=misfire, misfire_bound=3)
    env.tick(MIN)
    _ids(env)
    # the engine did not run for ten minutes: ticks 2..11 came due meanwhile; 2..9 are
    # older than the grace (a minute), 10 and 11 are sent as they are, a little late
    env.clock.advance(10 * MIN - 1)
    env.tick(1)
    assert _ids(env) == [f"m@{start + i * MIN}" for i in [*expected, 10, 11]]


def test_bad_input_is_refused_and_the_limit_holds(tmp_path: Path) -> None:
    e = _env(tmp_path, max_schedules=3)
    try:
        for kwargs, code in (({"cron": "0 25 * * *"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"cron": "* * * * *", "time_zone": "Nowhere/Town"},
                              grpc.StatusCode.INVALID_ARGUMENT),
                             ({"every_s": 0}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"cron": "0 0 30 2 *"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"every_s": 5, "end_ms": 1000},
                              grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(RpcError) as err:
                e.client.create_schedule("bad", "t", b"x", **kwargs)  # type: ignore[arg-type]
            assert err.value.code == code
        with pytest.raises(RpcError) as err:
            e.client.create_schedule("s", "missing-topic", b"x", every_s=5)
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        for i in range(3):
            e.client.create_schedule(f"s{i}", "t", b"x", every_s=5)
        with pytest.raises(RpcError) as err:
            e.client.create_schedule("s3", "t", b"x", every_s=5)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(RpcError) as err:
            e.client.create_schedule("s0", "t", b"other", every_s=5)
        assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert len(e.client.list_schedules()) == 3
    finally:
        e.close()


def test_the_cli_creates_lists_and_shows_next_fires(
        env: ManualBroker, capsys: pytest.CaptureFixture[str]) -> None:
    target = ["--target", env.running.target, "--json"]
    assert main(["schedule", "create", "nine", "--topic", "t", "--cron", "0 9 * * *",
                 "--tz", "Europe/Berlin", "--body", "good morning", *target]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["created"] and made["time_zone"] == "Europe/Berlin"
    assert main(["schedule", "next", "nine", "--count", "3", *target]) == 0
    nexts = json.loads(capsys.readouterr().out)
    assert len(nexts) == 3 and all(n.endswith(("09:00:00.000+01:00", "09:00:00.000+02:00"))
                                   for n in nexts)  # in the schedule's zone
    assert main(["schedule", "list", *target]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["nine"]
    assert main(["schedule", "create", "x", "--topic", "t", "--cron", "bad", "--body", "x",
                 *target]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert main(["schedule", "pause", "nine", *target]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is True
    assert main(["schedule", "delete", "nine", *target]) == 0


@pytest.mark.slow
def test_a_crash_around_a_tick_sends_it_once(tmp_path: Path) -> None:
    """kill -9 between a tick's durable send and the schedule moving past it: the
    restart sends the same tick again, and the dedupe window stores it once."""
    data = tmp_path / "data"
    srv = ServerProcess(data, "server.crash_at=schedule.after_send:2")
    with ChronomqClient(srv.target) as c:
        c.create_topic("t", queue_count=1)
        c.create_schedule("sec", "t", b"tick", every_s=1)
    assert srv.wait_exit() == CRASH_EXIT_CODE  # at the second tick
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            ids: list[str] = []
            deadline = time.monotonic() + 10
            while len(ids) < 5 and time.monotonic() < deadline:
                batch = c.pop("t", "g", max_messages=32, wait_ms=500)
                ids += [m.message_id for m in batch]
                if batch:
                    c.ack("g", [m.receipt_handle for m in batch])
            c.delete_schedule("sec")
        ticks = [int(i.rsplit("@", 1)[1]) for i in ids]
        assert len(ticks) >= 5 and len(set(ticks)) == len(ticks)  # none twice
        assert sorted(ticks) == list(range(min(ticks), min(ticks) + 1000 * len(ticks), 1000))
    finally:
        assert srv.terminate() == 0


def _drain(b: Broker) -> list[str]:
    """The ids of every message of topic ``t`` group ``g`` takes (and acks), sorted."""
    got: list[str] = []
    while batch := b.pop.pop("t", "g", 32, 60):
        got += [p.message.message_id for p in batch]
        b.pop.ack_many("g", [p.receipt_handle for p in batch])
    return sorted(got)


def test_a_takeover_between_two_ticks_fires_the_next_one_there(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)  # a whole minute
    a = _broker(tmp_path, "a", clock)
    try:
        a.create_topic(Topic("t", 1))
        a.schedules.book.create(ScheduleSpec("minutely", "t", every_s=60, body=b"tick"),
                                clock.now_ms())
        # Given A sent two ticks, then went away between the second and the third
        assert _step(a, clock, MIN) == 1 and _step(a, clock, MIN) == 1
    finally:
        a.stop()
    b = _broker(tmp_path, "b", clock)
    try:
        b.takeover("a", force=True)
        # When B has the schedule, its next tick comes due, and B steps twice at it
        (state,) = b.schedules.book.states()
        assert state.spec.name == "minutely" and state.fired == 2
        assert _step(b, clock, MIN) == 1 and _step(b, clock, 0) == 0
        # Then every tick came once: A's two from its backlog, the third from B
        assert _drain(b) == [f"minutely@{1_800_000_000_000 + i * MIN}" for i in (1, 2, 3)]
    finally:
        b.stop()


def test_ticks_owed_for_an_outage_come_after_a_takeover_while_the_engine_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(1_800_000_000_000)
    a = _broker(tmp_path, "a", clock)
    try:
        a.create_topic(Topic("t", 1))
        a.schedules.book.create(ScheduleSpec("secondly", "t", every_s=1, body=b"tick",
                                             misfire="all"), clock.now_ms())
        assert _step(a, clock, 1000) >= 1
    finally:
        a.stop()
    # Given A gone for 10 s (its schedule owes ten ticks, within the misfire policy), and
    # B's schedule engine firing at every step of B's takeover of A (its thread runs
    # meanwhile: issue 51, finding 3)
    clock.advance(10_000)
    b = _broker(tmp_path, "b", clock)
    real = cluster.takeover.crashpoint
    refused: list[str] = []

    def engine_runs(label: str) -> None:
        real(label)
        try:
            b.schedules.fire_due(clock.now_ms())
        except Unavailable as exc:  # held: the tick waits, the step is retried
            refused.append(str(exc))
    monkeypatch.setattr(cluster.takeover, "crashpoint", engine_runs)
    try:
        b.takeover("a", force=True)
        monkeypatch.setattr(cluster.takeover, "crashpoint", real)
        # When B's engine steps once the takeover is done
        _step(b, clock, 0)
        # Then every owed tick came, once, none dropped while the topic was being taken
        # (each sent up to a second ahead of its time)
        assert _drain(b) == sorted(f"secondly@{1_800_000_000_000 + i * 1000}"
                                   for i in range(1, 12))
        assert refused  # (the engine did meet the held topic)
    finally:
        b.stop()


def test_a_departed_brokers_schedule_of_a_name_the_survivor_uses_is_kept(
        tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)
    a = _broker(tmp_path, "a", clock)
    try:
        a.create_topic(Topic("t", 1))
        a.schedules.book.create(ScheduleSpec("daily", "t", every_s=60, body=b"a's"),
                                clock.now_ms())
    finally:
        a.stop()
    b = _broker(tmp_path, "b", clock)
    try:
        b.create_topic(Topic("own", 1))
        b.schedules.book.create(ScheduleSpec("daily", "own", every_s=60, body=b"b's"),
                                clock.now_ms())
        # Given B has a schedule named as one of A's; When B takes A over (twice: the
        # second run finds it adopted)
        b.takeover("a", force=True)
        b.takeovers.run("a", force=True)
        # Then both are kept, A's under its name and A's, each once (issue 51, 3)
        states = {s.spec.name: s.spec for s in b.schedules.book.states()}
        assert set(states) == {"daily", "daily.a"}
        assert (states["daily"].topic, states["daily.a"].topic) == ("own", "t")
        assert states["daily.a"].body == b"a's"
    finally:
        b.stop()


def test_a_tick_sent_but_not_recorded_before_a_takeover_comes_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(1_800_000_000_000)
    a = _broker(tmp_path, "a", clock)
    try:
        a.create_topic(Topic("t", 1))
        a.schedules.book.create(ScheduleSpec("minutely", "t", every_s=60, body=b"tick"),
                                clock.now_ms())
        assert _step(a, clock, MIN) == 1
        # Given A's second tick is durable but A goes away before its schedule moves on
        monkeypatch.setattr(a.schedules.book, "advance", lambda moves: None)
        assert _step(a, clock, MIN) == 1
    finally:
        a.stop()
    b = _broker(tmp_path, "b", clock)
    try:
        b.takeover("a", force=True)
        # When B sends the second tick again (it is where the tier says the schedule is)
        assert b.schedules.book.states()[0].next_ms == 1_800_000_000_000 + 2 * MIN
        _step(b, clock, 0)
        _step(b, clock, MIN)
        # Then the dedupe window B took from A stores it once
        assert _drain(b) == [f"minutely@{1_800_000_000_000 + i * MIN}" for i in (1, 2, 3)]
    finally:
        b.stop()


HOUR = 3_600_000


def _days_of_ticks(tmp_path: Path, start_ms: int, cron: str, zone: str, hours: int
                   ) -> list[str]:
    """Run a broker on a manual clock from ``start_ms`` for ``hours``, hour by hour,
    with one schedule; the local times of the ticks its consumer received."""
    e = _env(tmp_path, start_ms=start_ms)
    try:
        e.client.create_schedule("s", "t", b"x", cron=cron, time_zone=zone)
        got: list[int] = []
        for _ in range(hours):
            e.tick(HOUR)
            got += [int(i.rsplit("@", 1)[1]) for i in _ids(e)]
        return [datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).strftime(
            "%m-%d %H:%M %Z") for ms in got]
    finally:
        e.close()


def test_the_engine_across_the_spring_gap_in_berlin(tmp_path: Path) -> None:
    start = int(datetime(2026, 3, 27, 12, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
                * 1000)
    assert _days_of_ticks(tmp_path, start, "30 2 * * *", "Europe/Berlin", 4 * 24) == [
        "03-28 02:30 CET", "03-29 03:30 CEST", "03-30 02:30 CEST", "03-31 02:30 CEST"]


def test_the_engine_across_the_autumn_repeat_in_new_york(tmp_path: Path) -> None:
    start = int(datetime(2026, 10, 31, 12, tzinfo=ZoneInfo("America/New_York")).timestamp()
                * 1000)
    assert _days_of_ticks(tmp_path, start, "30 1 * * *", "America/New_York", 3 * 24) == [
        "11-01 01:30 EDT", "11-01 01:30 EST", "11-02 01:30 EST", "11-03 01:30 EST"]


def test_nine_every_morning_for_thirty_simulated_days(tmp_path: Path) -> None:
    start = int(datetime(2026, 10, 10, tzinfo=ZoneInfo("Europe/Berlin")).timestamp() * 1000)
    got = _days_of_ticks(tmp_path, start, "0 9 * * *", "Europe/Berlin", 30 * 24)
    assert len(got) == 30 and {g[6:11] for g in got} == {"09:00"}
    assert len({g[:5] for g in got}) == 30  # one a day, every day
