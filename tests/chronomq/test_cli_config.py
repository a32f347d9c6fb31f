"""The CLI against a real server, and config loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronomq.cli import main
from chronomq.config import load_config
from store.errors import InvalidArgument
from tests.conftest import RunningServer


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    return out


def test_cli_topic_send_pop_query_stats(server: RunningServer,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    t = ("--target", server.target)
    _ok(capsys, "topic", "create", "orders", "--queues", "2", *t)
    out = _ok(capsys, "topic", "list", "--json", *t)
    assert json.loads(out) == [{"name": "orders", "queue_count": 2, "retention_ms": 0}]
    out = _ok(capsys, "send", "orders", "hello", "--key", "k1", "--tag", "a",
              "--property", "x=1", "--json", *t)
    mid = json.loads(out)["message_id"]
    (m,) = json.loads(_ok(capsys, "pop", "orders", "g", "--json", *t))
    assert (m["message_id"], m["body"], m["properties"]) == (mid, "hello", {"x": "1"})
    # acked by default: nothing left for the group
    assert json.loads(_ok(capsys, "pop", "orders", "g", "--json", *t)) == []
    out = _ok(capsys, "query", "orders", "--key", "k1", "--json", *t)
    assert [q["message_id"] for q in json.loads(out)] == [mid]
    assert json.loads(_ok(capsys, "stats", "--json", *t))["rpc.sent"] == 1
    assert "orders" in _ok(capsys, "topic", "list", *t)
    _ok(capsys, "topic", "delete", "orders", *t)
    assert "(none)" in _ok(capsys, "topic", "list", *t)


def test_cli_errors_are_readable(server: RunningServer,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "send", "missing", "x", "--target", server.target)
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, "pop", "missing", "g", "--target", server.target)
    assert code == 2 and "NOT_FOUND" in err


def test_cli_pop_no_ack_leaves_the_lease(server: RunningServer,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    t = ("--target", server.target)
    _ok(capsys, "topic", "create", "t", *t)
    _ok(capsys, "send", "t", "x", *t)
    assert len(json.loads(_ok(capsys, "pop", "t", "g", "--no-ack", "--json", *t))) == 1
    assert server.server.broker.pop.statistics().open_checkpoints == 1


def test_config_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 9000\n[store]\ndata_dir = "/tmp/x"\nflush = "async"\n')
    cfg = load_config(str(path), ["server.port=9100", "store.auto_create_topics=true",
                                  "pop.max_messages_cap=64"])
    assert cfg.server.port == 9100 and cfg.server.host == "127.0.0.1"
    assert cfg.store.data_dir == "/tmp/x" and cfg.store.flush == "async"
    assert cfg.store.auto_create_topics is True and cfg.pop.max_messages_cap == 64


@pytest.mark.parametrize("override, message", [
    ("server.nope=1", "unknown setting"),
    ("bogus.port=1", "unknown config section"),
    ("server.port=abc", "expected int"),
    ("store.flush=sometimes", "sync"),
    ("store.auto_create_topics=maybe", "true/false"),
    ("noequals", "section.key=value"),
    ("server.tls_cert_file=/x.pem", "both"),
])
def test_bad_config_is_explained(override: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_config(None, [override])
