"""The ``chronomq`` console script against a real server: exit 0 on success, 1 when the
broker refused or failed (with the status code name), 2 for bad usage or input; never a
traceback; destructive commands refuse without ``--overwrite`` / ``--yes``."""

from __future__ import annotations

import argparse
import json
import logging
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from chronomq.cli import _parser
from chronomq.config import load_config
from tests.conftest import RunningServer

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Run:
    code: int
    out: str
    err: str


def chronomq(*argv: str, stdin: str = "") -> Run:
    """Run the installed console script (``python -m chronomq.cli`` if it is not on the
    venv's path)."""
    script = Path(sys.executable).parent / "chronomq"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "chronomq.cli"]
    done = subprocess.run([*cmd, *argv], input=stdin, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return Run(done.returncode, done.stdout, done.stderr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_refusals_exit_1_with_the_status_code(server: RunningServer) -> None:
    t = ("--target", server.target)
    # a send to a topic that does not exist: refused by the broker
    run = chronomq("send", "missing", "x", *t)
    assert run.code == 1 and "NOT_FOUND" in run.err and "missing" in run.err, run
    # a garbage receipt handle: refused, not acknowledged
    assert chronomq("topic", "create", "t", *t).code == 0
    run = chronomq("ack", "g", "not-a-handle", *t)
    assert run.code == 1 and "INVALID_ARGUMENT" in run.err, run
    # cancel of an id that is not pending: nothing was cancelled
    run = chronomq("cancel", "0000000000000000000000000000000A", *t)
    assert run.code == 1 and "NOT_FOUND" in (run.out + run.err), run


def test_unavailable_names_the_address_and_how_to_start(tmp_path: Path) -> None:
    target = f"127.0.0.1:{_free_port()}"
    run = chronomq("stats", "--target", target, "--timeout-s", "2")
    assert run.code == 1, run
    assert "UNAVAILABLE" in run.err and target in run.err and "chronomq serve" in run.err


def test_bad_input_exits_2_without_a_traceback(server: RunningServer,
                                                tmp_path: Path) -> None:
    t = ("--target", server.target)
    assert chronomq("topic", "create", "t", *t).code == 0
    run = chronomq("send", "t", "x", "--property", "source", *t)
    assert run.code == 2 and "NAME=VALUE" in run.err, run
    run = chronomq("serve", "--config", str(tmp_path / "missing.toml"))
    assert run.code == 2 and "missing.toml" in run.err and "not found" in run.err, run
    run = chronomq("send", "t", "x", "--delay-ms", "-5", *t)
    assert run.code == 2, run


def test_topic_delete_needs_yes(server: RunningServer) -> None:
    t = ("--target", server.target)
    assert chronomq("topic", "create", "keep", *t).code == 0
    run = chronomq("topic", "delete", "keep", *t)
    assert run.code == 2 and "--yes" in run.err, run
    with server.client() as c:
        assert [x.name for x in c.list_topics()] == ["keep"]
    assert chronomq("topic", "delete", "keep", "--yes", *t).code == 0
    with server.client() as c:
        assert c.list_topics() == []


def test_export_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    run = chronomq("export", "--topic", "t", "--tier-dir", str(tmp_path / "tier"),
                   "--output", str(out))
    assert run.code == 2 and "--overwrite" in run.err, run
    assert (out / "precious.txt").read_text() == "keep me"


def test_replay_into_a_missing_topic_says_why(server: RunningServer,
                                              tmp_path: Path) -> None:
    run = chronomq("replay", "--topic", "orders", "--tier-dir", str(tmp_path / "tier"),
                   "--into-topic", "nowhere", "--target", server.target)
    assert run.code == 1 and "NOT_FOUND" in run.err and "nowhere" in run.err, run


def test_every_flag_has_help_text() -> None:
    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.option_strings and not action.help:
                missing.append(f"{path} {action.option_strings[0]}")
            elif not action.option_strings and not action.help:
                missing.append(f"{path} {action.dest}")

    walk(_parser(), "chronomq")
    assert missing == []


def test_the_example_config_loads_and_serves_its_defaults() -> None:
    example = REPO / "chronomq.example.toml"
    assert load_config(str(example)) == load_config(None)
    # the README shows the same file
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Configuration", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert block in example.read_text()


def test_quiet_defaults_keep_scheduler_runs_out_of_info() -> None:
    from chronomq.cli import configure_logging

    configure_logging("INFO")
    assert logging.getLogger("apscheduler.executors.default").getEffectiveLevel() \
        == logging.WARNING
    configure_logging("DEBUG")
    assert logging.getLogger("apscheduler.executors.default").getEffectiveLevel() \
        == logging.DEBUG
    configure_logging("INFO")


def test_serve_at_info_prints_no_line_per_tick(tmp_path: Path) -> None:
    """Scheduled jobs every second for four seconds: the start-up lines only."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chronomq.cli", "serve", "--set",
         f"store.data_dir={tmp_path / 'data'}", "--set", "server.port=0", "--set",
         "server.metrics_port=0", "--set", "console.port=0", "--set",
         "timer.preload_interval_ms=1000", "--set",
         "server.retention_interval_s=1"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=4)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    lines = [line for line in out.splitlines() if line.strip()]
    assert any("listening on" in line for line in lines), out
    assert proc.returncode == 0, out  # SIGTERM: a clean stop
    assert len(lines) <= 5 and not any("apscheduler" in line for line in lines), out


def test_send_if_delivered_refuse_and_new_id(server: RunningServer) -> None:
    """A debounced send's ``if_delivered`` had no flag in the CLI (the API and the client
    have it): ``--if-delivered REFUSE`` refuses a replace of an id already delivered,
    ``NEW_ID`` (the default) stores it under the id's next generation."""
    t = ("--target", server.target)
    assert chronomq("topic", "create", "deb", *t).code == 0
    run = chronomq("send", "deb", "first", "--id", "order-9", *t)
    assert run.code == 0, run
    assert chronomq("pop", "deb", "g", *t).code == 0  # delivered (and acked)
    run = chronomq("send", "deb", "second", "--id", "order-9", "--replace",
                   "--if-delivered", "REFUSE", *t)
    assert run.code == 1 and "FAILED_PRECONDITION" in run.err, run
    run = chronomq("send", "deb", "third", "--id", "order-9", "--replace",
                   "--if-delivered", "NEW_ID", "--json", *t)
    assert run.code == 0 and json.loads(run.out)["message_id"] == "order-9~1", run
    run = chronomq("send", "deb", "x", "--if-delivered", "REFUSE", *t)
    assert run.code == 2 and "--replace" in run.err, run
