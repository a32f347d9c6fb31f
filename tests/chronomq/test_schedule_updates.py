"""Changing a schedule from outside (issue 53, findings 4 and 6): UpdateSchedule, the
upsert form of CreateSchedule and ``chronomq schedule update`` change it in place (ticks
sent stay sent, the next follows the new rule, none twice); a name deleted and created
again is a new schedule whose ticks have their own ids; ListSchedules pages with a
token.  Over real gRPC on 127.0.0.1, the broker's clock manual (``ManualBroker``)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.cli import main
from chronomq.client import RpcError
from chronomq.v1 import broker_pb2 as pb
from recurring.book import ScheduleConfig
from tests.conftest import broker_config
from tests.manual_broker import ManualBroker

SEC, MIN = 1_000, 60_000


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    start_ms = (int(time.time() * 1000) // MIN + 1) * MIN  # a whole minute
    e = ManualBroker(tmp_path, {"t": 1, "u": 1}, start_ms=start_ms)
    yield e
    e.close()


def _got(env: ManualBroker, topic: str = "t") -> dict[str, bytes]:
    """Pop and ack everything visible: id -> body."""
    out: dict[str, bytes] = {}
    while batch := env.client.pop(topic, "g", max_messages=32):
        for m in batch:
            assert m.message_id not in out, f"{m.message_id} came twice"
            out[m.message_id] = m.body
        env.client.ack("g", [m.receipt_handle for m in batch])
    return out


def test_update_changes_rule_body_and_topic_in_place(env: ManualBroker) -> None:
    start = env.clock.now_ms()
    env.client.create_schedule("s", "t", b"old", every_s=60, key="k")
    env.tick(MIN)
    env.tick(MIN)
    # When its rule, body and topic change 10 s after its second tick
    env.clock.advance(10 * SEC)
    changed, updated = env.client.update_schedule("s", every_s=30, body=b"new", topic="u")
    # Then what was not named stays, the ticks sent count, the next follows the new rule
    assert updated and (changed.cron, changed.every_s, changed.key) == ("", 30, "k")
    assert changed.fired == 2 and changed.next_fire_ms == start + 2 * MIN + 30 * SEC
    env.tick(20 * SEC)
    env.tick(30 * SEC)
    assert _got(env, "t") == {f"s@{start + MIN}": b"old", f"s@{start + 2 * MIN}": b"old"}
    assert _got(env, "u") == {f"s@{start + 2 * MIN + 30 * SEC}": b"new",
                              f"s@{start + 3 * MIN}": b"new"}
    # the same again: not changed; a cron instead of the interval clears the interval
    assert env.client.update_schedule("s", every_s=30)[1] is False
    cron, _ = env.client.update_schedule("s", cron="0 9 * * *", time_zone="Europe/Berlin")
    assert (cron.cron, cron.every_s, cron.time_zone) == ("0 9 * * *", 0, "Europe/Berlin")


def test_update_refuses_what_create_refuses(env: ManualBroker) -> None:
    env.client.create_schedule("s", "t", b"x", every_s=60)
    for kwargs, code in (({"cron": "0 25 * * *"}, grpc.StatusCode.INVALID_ARGUMENT),
                         ({"time_zone": "Nowhere/Town"}, grpc.StatusCode.INVALID_ARGUMENT),
                         ({"body": b""}, grpc.StatusCode.INVALID_ARGUMENT),
                         ({"end_ms": 1000}, grpc.StatusCode.INVALID_ARGUMENT),
                         ({"topic": "missing"}, grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(RpcError) as err:
            env.client.update_schedule("s", **kwargs)  # type: ignore[arg-type]
        assert err.value.code == code, kwargs
    with pytest.raises(RpcError) as err:
        env.client.update_schedule("nope", every_s=5)
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(RpcError) as err:  # a field that is not a schedule's setting
        env.client.call("UpdateSchedule", pb.UpdateScheduleRequest(
            schedule=pb.Schedule(name="s", fired=3), update_mask=["fired"]))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    (kept,) = env.client.list_schedules()
    assert (kept.every_s, kept.body, kept.topic) == (60, b"x", "t")


def test_create_with_upsert_updates_in_place(env: ManualBroker) -> None:
    start = env.clock.now_ms()
    env.client.create_schedule("s", "t", b"old", every_s=60)
    env.tick(MIN)
    with pytest.raises(RpcError) as err:
        env.client.create_schedule("s", "t", b"new", every_s=120)
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    made, created = env.client.create_schedule("s", "t", b"new", every_s=120, upsert=True)
    # (an interval counts from the epoch: the next even minute after the tick sent, 1 or 2
    # minutes on, as the clock's start falls)
    after = (start + MIN) // (2 * MIN) * (2 * MIN) + 2 * MIN
    assert not created and made.fired == 1 and made.next_fire_ms == after
    made, created = env.client.create_schedule("n", "t", b"x", every_s=60, upsert=True)
    assert created and made.generation == 0


def test_deleted_and_created_again_within_the_send_ahead_both_ticks_come(
        env: ManualBroker) -> None:
    start = env.clock.now_ms()
    env.client.create_schedule("s", "t", b"old", every_s=60)
    assert env.tick(MIN - SEC) == 1  # the tick of start + 1 min, sent a second ahead
    # When it is deleted and created again with another body within that second
    env.client.delete_schedule("s")
    made, created = env.client.create_schedule("s", "t", b"new", every_s=60)
    assert created and made.generation == 1 and made.fired == 0
    env.tick(SEC)
    # Then its first tick is its own message (before: the old tick's id, a duplicate)
    assert _got(env) == {f"s@{start + MIN}": b"old", f"s~1@{start + MIN}": b"new"}


def test_update_through_the_cli(env: ManualBroker, capsys: pytest.CaptureFixture[str]
                                ) -> None:
    target = ["--target", env.running.target, "--json"]
    assert main(["schedule", "create", "c", "--topic", "t", "--every-s", "60",
                 "--body", "a", *target]) == 0
    capsys.readouterr()
    assert main(["schedule", "update", "c", "--cron", "0 9 * * *", "--tz",
                 "Europe/Berlin", "--body", "b", *target]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["cron"], row["every_s"], row["time_zone"], row["updated"]) == (
        "0 9 * * *", 0, "Europe/Berlin", True)
    (s,) = env.client.list_schedules()
    assert s.body == b"b" and s.topic == "t"
    assert main(["schedule", "create", "c", "--topic", "t", "--every-s", "5",
                 "--body", "d", "--upsert", *target]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["every_s"], row["cron"], row["created"], row["updated"]) == (
        5, "", False, True)
    assert main(["schedule", "update", "missing", "--every-s", "5", *target]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert main(["schedule", "update", "c", *target]) == 2  # nothing to change: not sent
    assert "give the settings to change" in capsys.readouterr().err
    assert main(["schedule", "update", "c", "--clear-properties", *target]) == 0


def test_list_schedules_pages_through_2500(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = dataclasses.replace(broker_config(tmp_path / "data"),
                                 schedules=ScheduleConfig(max_schedules=3_000))
    env = ManualBroker(tmp_path, {"t": 1}, config)
    try:
        book, now = env.broker.schedules.book, env.clock.now_ms()
        names = [f"s{i:05d}" for i in range(2_500)]
        for n in reversed(names):
            env.client.create_schedule(n, "t", b"x", cron="0 9 * * *")
        # pages of 1,000 by name, the token the last name
        pages: list[list[str]] = []
        token = ""
        while True:
            r = env.client.call("ListSchedules", pb.ListSchedulesRequest(page_token=token))
            pages.append([s.name for s in r.schedules])
            assert r.total == 2_500
            token = r.next_page_token
            if not token:
                break
            assert token == pages[-1][-1]
        assert [len(p) for p in pages] == [1_000, 1_000, 500]
        assert [n for p in pages for n in p] == names
        # the client iterates them all, in pages of its size too
        assert [s.name for s in env.client.iter_schedules()] == names
        assert [s.name for s in env.client.iter_schedules(page_size=700)] == names
        assert [s.name for s in env.client.list_schedules()] == names
        assert len(env.client.list_schedules(limit=10)) == 10
        assert [s.name for s in env.client.list_schedules("s0249")] == names[2490:]
        # the CLI follows the pages, or starts after a token
        assert main(["schedule", "list", "--target", env.running.target, "--json"]) == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == names
        assert main(["schedule", "list", "--page-token", names[2_399], "--limit", "50",
                     "--target", env.running.target, "--json"]) == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == names[2400:2450]
        for bad in ("../x", "a" * 101, "é"):
            with pytest.raises(RpcError) as err:
                env.client.call("ListSchedules", pb.ListSchedulesRequest(page_token=bad))
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert len(book.states()) == 2_500 and now == env.clock.now_ms()
    finally:
        env.close()
