"""``chronomq user ...`` (``chronomq.usercli``) as a person types it, against a real broker:
the token printed once, grants, revokes, the list, removal with ``--yes``, and the exit
statuses: 0 done, 1 refused by the broker (one line), 2 bad input (nothing sent)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chronomq.test_cli_exit_codes import chronomq
from tests.conftest import RunningServer, broker_config

ROOT = "root-token"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RunningServer]:
    s = RunningServer(broker_config(tmp_path / "data", auth_token=ROOT))
    yield s
    s.stop()


def test_a_user_is_added_granted_listed_revoked_and_removed(secured: RunningServer) -> None:
    admin = ("--target", secured.target, "--token", ROOT)
    # When the admin adds a user, Then its token is printed once, on stdout
    run = chronomq("user", "add", "billing", *admin, "--json")
    assert run.code == 0, run
    added = json.loads(run.out)
    token = added["token"]
    assert added["user"] == "billing" and added["rocketmq_access_key"] == "billing"
    assert "shown this once" in run.err
    run = chronomq("user", "grant", "billing", "send", "billing-*", *admin)
    assert run.code == 0 and "allow send billing-*" in run.out, run
    run = chronomq("user", "grant", "billing", "send", "billing-audit", "--deny", *admin)
    assert run.code == 0 and "deny send billing-audit" in run.out, run
    run = chronomq("user", "list", *admin)
    assert run.code == 0 and run.out.startswith("billing  allow send billing-*, deny send"), run
    # And the user's own token works as the grants say
    user = ("--target", secured.target, "--token", token)
    assert chronomq("topic", "create", "billing-eu", *admin).code == 0
    assert chronomq("send", "billing-eu", "x", *user).code == 0
    run = chronomq("send", "orders", "x", *user)
    assert run.code == 1 and run.err.strip() == \
        "error: PERMISSION_DENIED: user 'billing' may not send to topic 'orders'", run
    run = chronomq("user", "whoami", *user, "--json")
    assert json.loads(run.out)[0]["name"] == "billing", run
    # A user without admin on * may not manage users
    run = chronomq("user", "list", *user)
    assert run.code == 1 and "may not administer the broker" in run.err, run
    run = chronomq("user", "revoke", "billing", "send", "billing-audit", *admin)
    assert run.code == 0 and "billing-audit" not in run.out, run
    run = chronomq("user", "revoke", "billing", "send", "billing-audit", *admin)
    assert run.code == 1 and "NOT_FOUND" in run.err, run
    # Removing needs --yes; then the token stops working
    run = chronomq("user", "remove", "billing", *admin)
    assert run.code == 2 and "--yes" in run.err, run
    assert chronomq("user", "remove", "billing", "--yes", *admin).code == 0
    run = chronomq("send", "billing-eu", "x", *user)
    assert run.code == 1 and "UNAUTHENTICATED" in run.err, run
    assert chronomq("user", "list", *admin).out.strip() == "(no user)"


@pytest.mark.parametrize("argv", [
    ("user", "add", "bad name"),
    ("user", "grant", "u", "write", "*"),
    ("user", "grant", "u", "send", "a*b"),
    ("user", "revoke", "u", "send", ""),
    ("user", "remove", "x" * 65, "--yes"),
])
def test_bad_input_exits_2_before_anything_is_sent(argv: tuple[str, ...]) -> None:
    # (no broker listens there: nothing is sent)
    run = chronomq(*argv, "--target", "127.0.0.1:9", "--timeout-s", "1")
    assert run.code == 2, run
    last = run.err.strip().splitlines()[-1]  # argparse's usage first, or nothing
    assert "error:" in last and "UNAVAILABLE" not in run.err, run


def test_a_broker_without_credentials_refuses_the_first_user(server: RunningServer) -> None:
    run = chronomq("user", "add", "first", "--target", server.target)
    assert run.code == 1 and "FAILED_PRECONDITION" in run.err and "auth_token" in run.err
