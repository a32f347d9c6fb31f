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
    assert json.loads(out) == [{"name": "orders", "queue_count": 2, "retention_ms": 0,
                                "tier_retention_ms": 0}]
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
    _ok(capsys, "topic", "delete", "orders", "--yes", *t)
    assert "(none)" in _ok(capsys, "topic", "list", *t)


def test_cli_errors_are_readable(server: RunningServer,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "send", "missing", "x", "--target", server.target)
    assert code == 1 and "does not exist" in err  # refused by the broker
    code, _, err = _run(capsys, "pop", "missing", "g", "--target", server.target)
    assert code == 1 and "NOT_FOUND" in err


def test_cli_pop_no_ack_leaves_the_lease(server: RunningServer,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    t = ("--target", server.target)
    _ok(capsys, "topic", "create", "t", *t)
    _ok(capsys, "send", "t", "x", *t)
    assert len(json.loads(_ok(capsys, "pop", "t", "g", "--no-ack", "--json", *t))) == 1
    assert server.server.broker.pop.statistics().open_checkpoints == 1


def test_cli_settle_commands_and_groups(server: RunningServer,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    t = ("--target", server.target)
    _ok(capsys, "topic", "create", "t", *t)
    for body in ("a", "b", "c"):
        _ok(capsys, "send", "t", body, *t)
    got = json.loads(_ok(capsys, "pop", "t", "g", "--no-ack", "--json", *t))
    handles = {m["body"]: m["receipt_handle"] for m in got}
    new = json.loads(_ok(capsys, "change-invisible", "g", handles["a"], "600", "--json", *t))
    assert new["receipt_handle"] != handles["a"]
    (r,) = json.loads(_ok(capsys, "nack", "g", handles["b"], "--delay-ms", "0", "--json", *t))
    assert r["ok"] is True
    (r,) = json.loads(_ok(capsys, "dead-letter", "g", handles["c"], "--reason", "bad",
                          "--json", *t))
    assert r["ok"] is True
    code, out, err = _run(capsys, "ack", "g", handles["a"], "--json", *t)
    (r,) = json.loads(out)
    assert r["ok"] is False and "ChangeInvisibleTime" in r["error"]
    assert code == 1 and "FAILED_PRECONDITION" in err
    (row,) = json.loads(_ok(capsys, "groups", "--json", *t))
    assert (row["group"], row["topic"], row["dead_lettered"]) == ("g", "t", 1)
    assert row["in_flight"] == 1  # "a", under its new handle


def test_group_retry_policies_from_toml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[pop]\nmax_attempts = 7\n[groups.orders-worker]\nretry_backoff = '
                    '"10s, 1m"\n')
    cfg = load_config(str(path), ["groups.billing.max_attempts=3", "pop.retry_jitter=0"])
    assert cfg.retry_policy().max_attempts == 7 and cfg.retry_policy().jitter == 0
    orders, billing = cfg.groups["orders-worker"], cfg.groups["billing"]
    assert orders.backoff_ms == (10_000, 60_000) and orders.max_attempts == 7
    assert billing.max_attempts == 3 and billing.backoff_ms == cfg.retry_policy().backoff_ms
    for bad, message in (("groups.x.max_attempts=0", "max_attempts"),
                         ("groups.x.nope=1", "unknown setting"),
                         ("groups.x=1", "groups.<group>.<key>"),
                         ("pop.retry_backoff=5 parsecs", "duration")):
        with pytest.raises(InvalidArgument, match=message):
            load_config(None, [bad])


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
    ("tier.read=sometimes", "not_in_mem"),
    ("tier.retention_ms=1000", "shorter than local retention"),
    ("tier.retention_ms=-1", "negative"),
])
def test_bad_config_is_explained(override: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_config(None, [override])


@pytest.mark.parametrize("overrides, message", [
    (["rocketmq.access_key=app"], "both rocketmq.access_key"),
    (["rocketmq.advertise_address=broker.example"], "host:port"),
    (["rocketmq.advertise_address=broker.example:99999"], "host:port"),
])
def test_bad_rocketmq_config_is_explained(overrides: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_config(None, overrides)


def test_rocketmq_config() -> None:
    cfg = load_config(None, ["rocketmq.enabled=true", "rocketmq.port=9876",
                             "rocketmq.advertise_address=mq.example:9876"])
    assert (cfg.rocketmq.enabled, cfg.rocketmq.port) == (True, 9876)
    assert not load_config(None, []).rocketmq.enabled  # off unless enabled
    # an auth_token without the front's own keys: the front takes users' signatures only
    assert load_config(None, ["rocketmq.enabled=true", "server.auth_token=t"]).rocketmq.enabled
