"""The one name rule: topics and groups are ``[A-Za-z0-9_-]{1,127}`` (``fullmatch``),
checked wherever a name enters; reserved prefixes are the broker's alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.client import message
from store.errors import InvalidArgument
from store.names import check_name, check_readable, inside, split_broker_made
from tests.conftest import RunningServer, broker_config


@pytest.mark.parametrize("name", ["..", ".", "%/../../x", "t\n", "%RETRY%x", "a/b", "",
                                  "x" * 128])
def test_a_name_outside_the_rule_is_refused_everywhere(name: str, tmp_path: Path) -> None:
    server = RunningServer(broker_config(tmp_path / "data"))
    try:
        with server.client() as client:
            client.create_topic("t")
            for act in (lambda: client.create_topic(name),
                        lambda: client.delete_topic(name),
                        lambda: client.send([message(name, b"x")]),
                        lambda: client.pop(name, "g"),
                        lambda: client.pop("t", name)):
                with pytest.raises(Exception) as refused:
                    outcome = act()
                    if isinstance(outcome, list) and outcome and not outcome[0].ok:
                        raise AssertionError(outcome[0].error)  # per-message refusal
                assert "INVALID_ARGUMENT" in str(refused.value) or isinstance(
                    refused.value, AssertionError), refused.value
        assert (tmp_path / "data").is_dir()
    finally:
        server.stop()


def test_the_rule_and_the_broker_made_names(tmp_path: Path) -> None:
    for good in ("t", "Orders_2026-x", "x" * 127):
        check_name(good)
    for bad in ("", "x" * 128, "t\n", "a.b", "..", "a/b", "%RETRY%g%t", "é"):
        with pytest.raises(InvalidArgument):
            check_name(bad)
    assert split_broker_made("%RETRY%g%t") == ("%RETRY%", "g", "t")
    assert split_broker_made("%DLQ%g%t") == ("%DLQ%", "g", "t")
    for bad in ("%RETRY%g", "%RETRY%g%../x", "%DLQ%%t", "%OTHER%g%t"):
        assert split_broker_made(bad) is None
        with pytest.raises(InvalidArgument):
            check_readable(bad)
    check_readable("%DLQ%g%t")
    assert inside(str(tmp_path), "t", "0") == str(tmp_path.resolve() / "t" / "0")
    for escape in ("..", "../x", "/etc", "a/../../b", ""):
        with pytest.raises(InvalidArgument):
            inside(str(tmp_path), escape)
