"""Every ``chronomq schedule`` subcommand as a user runs it (the console script, in a
subprocess) against one real broker on 127.0.0.1, in both output modes: exit 0, nothing
on stderr (so no traceback), plain output a person can read and ``--json`` output of the
expected shape, each saying what happened."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from chronomq.cli import _parser
from chronomq.client import ChronomqClient, RpcError
from tests.chronomq.test_cli_exit_codes import chronomq
from tests.conftest import RunningServer, broker_config

START_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z: no tick fires while these tests run
# "0 9 * * *" in Europe/Berlin from START_MS, printed in the schedule's zone
NEXT_FIRES = ["2100-01-01T09:00:00.000+01:00", "2100-01-02T09:00:00.000+01:00",
              "2100-01-03T09:00:00.000+01:00"]
COVERED = {"create", "update", "list", "next", "pause", "resume", "delete", "trigger"}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker for every test here, with the topic the schedules send to."""
    server = RunningServer(broker_config(tmp_path_factory.mktemp("cli-schedules") / "data"))
    try:
        with server.client() as c:
            c.create_topic("t")
        yield server.target
    finally:
        server.stop()


@pytest.fixture(params=["plain", "json"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def name(target: str, mode: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A schedule name of this test's own; the schedule is deleted after, if it is left."""
    made = f"{request.function.__name__.removeprefix('test_')}-{mode}"
    yield made
    with ChronomqClient(target) as c:
        try:
            c.delete_schedule(made)
        except RpcError as exc:
            assert exc.code == grpc.StatusCode.NOT_FOUND, exc


@pytest.fixture
def made(target: str, name: str) -> str:
    """The schedule, created through the client (not the CLI under test)."""
    with ChronomqClient(target) as c:
        c.create_schedule(name, "t", b"good morning", cron="0 9 * * *",
                          time_zone="Europe/Berlin", start_ms=START_MS)
    return name


def schedule(target: str, mode: str, *argv: str) -> str:
    """``chronomq schedule ARGV`` in ``mode``: its stdout, after checking it succeeded."""
    run = chronomq("schedule", *argv, "--target", target,
                   *(["--json"] if mode == "json" else []))
    assert "Traceback" not in run.err, run.err
    assert run.code == 0 and run.err == "", run
    return run.out


def fields(out: str) -> dict[str, str]:
    """Plain output of one record: ``key: value`` lines."""
    lines = out.splitlines()
    assert lines and all(": " in line for line in lines), out
    return dict(line.split(": ", 1) for line in lines)


def test_every_schedule_subcommand_is_run_here() -> None:
    """A subcommand added to the CLI needs its cases here too."""
    (top,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (verbs,) = [a for a in top.choices["schedule"]._actions
                if isinstance(a, argparse._SubParsersAction)]
    assert set(verbs.choices) == COVERED


def test_create(target: str, mode: str, name: str) -> None:
    out = schedule(target, mode, "create", name, "--topic", "t", "--cron", "0 9 * * *",
                   "--tz", "Europe/Berlin", "--body", "good morning",
                   "--start-ms", str(START_MS))
    row = json.loads(out) if mode == "json" else fields(out)
    expected: dict[str, Any] = {"name": name, "topic": "t", "cron": "0 9 * * *",
                                "time_zone": "Europe/Berlin", "next_fire": NEXT_FIRES[0],
                                "paused": False, "fired": 0, "created": True}
    if mode == "plain":
        expected = {k: str(v) for k, v in expected.items()}
    assert row.items() >= expected.items(), out


def test_list(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "list", "--prefix", made)
    if mode == "json":
        (row,) = json.loads(out)
        assert row["name"] == made and row["next_fire"] == NEXT_FIRES[0], out
        assert row["cron"] == "0 9 * * *" and row["paused"] is False, out
    else:
        (line,) = out.splitlines()  # one line a schedule: name=... topic=... ...
        words = line.split("  ")
        assert f"name={made}" in words and f"next_fire={NEXT_FIRES[0]}" in words, out
        assert "cron=0 9 * * *" in words and "paused=False" in words, out


def test_list_of_nothing(target: str, mode: str, name: str) -> None:
    out = schedule(target, mode, "list", "--prefix", name)  # never created
    assert (json.loads(out) == []) if mode == "json" else (out == "(none)\n"), out


def test_next(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "next", made, "--count", "3")
    if mode == "json":
        assert json.loads(out) == NEXT_FIRES, out
    else:
        assert out.splitlines() == NEXT_FIRES, out  # one fire time a line


def test_pause_next_and_resume(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "pause", made)
    row = json.loads(out) if mode == "json" else fields(out)
    assert row["name"] == made and row["paused"] in (True, "True"), out
    # a paused schedule's next fires: those it would send if resumed now
    out = schedule(target, mode, "next", made, "--count", "2")
    assert (json.loads(out) if mode == "json" else out.splitlines()) == NEXT_FIRES[:2], out
    out = schedule(target, mode, "resume", made)
    row = json.loads(out) if mode == "json" else fields(out)
    assert row["name"] == made and row["paused"] in (False, "False"), out
    assert row["next_fire"] == NEXT_FIRES[0], out


def test_delete(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "delete", made)
    row = json.loads(out) if mode == "json" else fields(out)
    assert row == ({"name": made, "deleted": True} if mode == "json"
                   else {"name": made, "deleted": "True"}), out
    with ChronomqClient(target) as c:
        assert c.list_schedules(made) == []


def test_update(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "update", made, "--cron", "30 9 * * *", "--body", "later")
    row = json.loads(out) if mode == "json" else fields(out)
    expected: dict[str, Any] = {"name": made, "cron": "30 9 * * *", "every_s": 0,
                                "time_zone": "Europe/Berlin", "paused": False,
                                "next_fire": NEXT_FIRES[0].replace("09:00", "09:30"),
                                "updated": True}
    if mode == "plain":
        expected = {k: str(v) for k, v in expected.items()}
    assert row.items() >= expected.items(), out
    with ChronomqClient(target) as c:
        (s,) = c.list_schedules(made)
        assert (s.body, s.topic, s.start_ms) == (b"later", "t", START_MS)
    # the same again: nothing changed, said so
    out = schedule(target, mode, "update", made, "--cron", "30 9 * * *")
    row = json.loads(out) if mode == "json" else fields(out)
    assert row["updated"] in (False, "False"), out


def test_create_with_upsert(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "create", made, "--topic", "t", "--every-s", "3600",
                   "--body", "hourly", "--start-ms", str(START_MS), "--upsert")
    row = json.loads(out) if mode == "json" else fields(out)
    assert row["every_s"] in (3600, "3600") and row["cron"] in ("", None), out
    assert row["created"] in (False, "False") and row["updated"] in (True, "True"), out


def test_trigger(target: str, mode: str, made: str) -> None:
    out = schedule(target, mode, "trigger", made)
    row = json.loads(out) if mode == "json" else fields(out)
    assert row["name"] == made and row["message_id"].startswith(f"{made}!"), out
    sent_ms = int(row["message_id"].rsplit("!", 1)[1])
    # the tick sent by hand is counted and listed among the recent ticks
    out = schedule(target, mode, "list", "--prefix", made)
    if mode == "json":
        (listed,) = json.loads(out)
        assert listed["fired"] == 1 and listed["recent"] == [
            f"{row['sent_at']} {row['message_id']}"], out
    else:
        assert "fired=1" in out.split("  ") and row["message_id"] in out, out
    with ChronomqClient(target) as c:
        (s,) = c.list_schedules(made)
        assert [(r.tick_ms, r.message_id) for r in s.recent_ticks] == [
            (sent_ms, row["message_id"])]
        got = c.pop("t", f"g-{mode}", max_messages=32)
        assert row["message_id"] in [m.message_id for m in got]


def test_create_without_a_body_is_bad_usage(target: str, name: str) -> None:
    """``--body`` looked optional (default ""), and the broker refused the schedule: a
    usage error now, before anything is sent."""
    run = chronomq("schedule", "create", name, "--topic", "t", "--cron", "0 9 * * *",
                   "--target", target)
    assert run.code == 2 and "--body" in run.err, run
    with ChronomqClient(target) as c:
        assert c.list_schedules(name) == []


def test_a_body_of_dash_is_read_from_stdin(target: str, name: str) -> None:
    """``--body -`` was taken literally (a body of one dash), as ``send``'s is not."""
    run = chronomq("schedule", "create", name, "--topic", "t", "--every-s", "3600",
                   "--body", "-", "--start-ms", str(START_MS), "--target", target,
                   stdin="from stdin\n")
    assert run.code == 0, run
    run = chronomq("schedule", "update", name, "--body", "-", "--target", target,
                   stdin="again")
    assert run.code == 0, run
    with ChronomqClient(target) as c:
        (s,) = c.list_schedules(name)
        assert s.body == b"again"


def test_next_count_zero_is_bad_usage(target: str, made: str) -> None:
    """``next --count 0`` printed 10 fire times (0: the broker's default)."""
    run = chronomq("schedule", "next", made, "--count", "0", "--target", target)
    assert run.code == 2 and "--count" in run.err, run


def test_times_print_in_the_schedules_zone(target: str, made: str) -> None:
    """Fire times printed in UTC for a schedule kept in Europe/Berlin: now in its zone,
    with the offset (the same instants)."""
    run = chronomq("schedule", "next", made, "--count", "1", "--target", target, "--json")
    assert json.loads(run.out) == ["2100-01-01T09:00:00.000+01:00"], run
    run = chronomq("schedule", "list", "--prefix", made, "--target", target, "--json")
    (row,) = json.loads(run.out)
    assert row["next_fire"] == "2100-01-01T09:00:00.000+01:00", run
