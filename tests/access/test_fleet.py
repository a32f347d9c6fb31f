"""Brokers sharing a bucket share their users (``access/users.json`` in the tier): a user
added at one broker is known at the others within about a second (their refresh), a
broker started later (a successor after a takeover, say) knows it from its start, and a
revoke at one is in force there at once and at the others a refresh later.  Real
brokers over 127.0.0.1 gRPC on moto's S3 server, uploading to it (``tier.upload``)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import grpc
import pytest

from access.backends import USERS_OBJECT
from chronomq.client import ChronomqClient, RpcError
from testkit.wait import wait_until
from tests.conftest import RunningServer, broker_config, tier_config

ROOT = "root-token"


def _broker(tmp_path: Path, request: pytest.FixtureRequest, name: str,
            node: int) -> RunningServer:
    tier = tier_config("s3", tmp_path, request, "fleet", upload=True, broker_name=name)
    config = broker_config(tmp_path / name, auth_token=ROOT)
    return RunningServer(dataclasses.replace(
        config, tier=tier, store=dataclasses.replace(config.store, node_id=node)))


def _sends(client: ChronomqClient) -> grpc.StatusCode:
    try:
        client.send_one("t", b"x")
        return grpc.StatusCode.OK
    except RpcError as exc:
        return exc.code


def test_users_are_the_fleets(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    a = _broker(tmp_path, request, "broker-a", 1)
    b = _broker(tmp_path, request, "broker-b", 2)
    started = [a, b]
    try:
        with a.client(token=ROOT) as ca, b.client(token=ROOT) as cb:
            ca.create_topic("t")
            cb.create_topic("t")
            # When a user is added and granted at broker a
            token = ca.users.add("billing").token
            ca.users.grant("billing", "send", "t")
            added_s = time.monotonic()
            assert a.server.broker.tier.exists(USERS_OBJECT)  # beside the brokers' prefixes
            # Then broker b knows it within about a second, with no restart
            with b.client(token=token) as at_b:
                wait_until(lambda: _sends(at_b) == grpc.StatusCode.OK, 5,
                           "broker b knows the user")
                assert time.monotonic() - added_s < 3
            # And a broker started later knows it from its start
            c = _broker(tmp_path, request, "broker-c", 3)
            started.append(c)
            with c.client(token=token) as at_c, c.client(token=ROOT) as admin_c:
                assert [u.name for u in admin_c.users.all()] == ["billing"]
                assert at_c.users.whoami()[0].permissions == (("allow", "send", "t"),)
            # When broker b revokes it, Then it is in force at b at once, at a soon after
            cb.users.revoke("billing", "send", "t")
            with b.client(token=token) as at_b, a.client(token=token) as at_a:
                assert _sends(at_b) == grpc.StatusCode.PERMISSION_DENIED
                wait_until(lambda: _sends(at_a) == grpc.StatusCode.PERMISSION_DENIED, 5,
                           "broker a knows the revoke")
    finally:
        for s in started:
            s.stop()
