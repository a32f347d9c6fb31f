"""Hostile arguments to the CLI (hypothesis): whatever the names, bodies and numbers, a
command ends with exit code 0, 1 or 2 and a one-line error, never a traceback, and the
broker keeps its data dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronomq.cli import main
from tests.chronomq.fuzz import NASTY_NAMES
from tests.conftest import RunningServer, broker_config

names = st.one_of(st.sampled_from(NASTY_NAMES), st.text(min_size=1, max_size=20))
numbers = st.sampled_from(["0", "-1", "1", "99999999999999999999", "x", "1e3", ""])


def _commands(target: str) -> st.SearchStrategy[list[str]]:
    t = ["--target", target]
    return st.one_of(
        st.tuples(st.just("topic"), st.just("create"), names).map(lambda a: [*a, *t]),
        st.tuples(st.just("topic"), st.just("delete"), names, st.just("--yes")
                  ).map(lambda a: [*a, *t]),
        st.tuples(st.just("send"), names, names.filter(lambda b: b != "-")  # "-": stdin
                  ).map(lambda a: [*a, *t]),
        st.tuples(st.just("send"), st.just("t"), st.just("b"), st.just("--delay-ms"),
                  numbers).map(lambda a: [*a, *t]),
        st.tuples(st.just("pop"), names, names).map(lambda a: [*a, *t]),
        st.tuples(st.just("ack"), names, names).map(lambda a: [*a, *t]),
        st.tuples(st.just("cancel"), names).map(lambda a: [*a, *t]),
        st.tuples(st.just("query"), names, st.just("--key"), names).map(lambda a: [*a, *t]),
    )


def test_hostile_cli_arguments_never_end_in_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = RunningServer(broker_config(tmp_path / "data"))
    try:
        with server.client() as client:
            client.create_topic("t")

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(_commands(server.target))
        def run(argv: list[str]) -> None:
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: bad usage
                code = exc.code if isinstance(exc.code, int) else 2
            out = capsys.readouterr()
            assert code in (0, 1, 2), (argv, code)
            assert "Traceback" not in out.out + out.err, argv

        run()
        assert (tmp_path / "data").is_dir()
    finally:
        server.stop()
