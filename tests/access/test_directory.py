"""Where users live and how they change: a file of the data directory, or one object of a
shared tier (local directory, moto's S3, SeaweedFS), read again by every broker and
changed only by conditional writes."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from pathlib import Path

import pytest

from access.backends import USERS_OBJECT, FileBackend, TierBackend
from access.codec import encode
from access.directory import UserDirectory
from access.errors import DamagedUsers, UsersUnavailable
from access.model import Action, Effect, Permission, decide, permission
from access.principals import ADMIN, ANONYMOUS, Authenticator
from store.errors import AlreadyExists, NotFound
from testkit.proxy import FaultProxy
from tests.conftest import CREDS, create_bucket
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.s3 import S3Provider, S3Settings


def now_ms() -> int:
    return int(time.time() * 1000)


def directory(backend: FileBackend | TierBackend) -> UserDirectory:
    d = UserDirectory(backend, now_ms)
    d.load()
    return d


def test_users_in_the_data_directory_survive_a_restart(tmp_path: Path) -> None:
    # Given a broker's data directory with no users: nothing is required
    users = directory(FileBackend(str(tmp_path)))
    auth = Authenticator(users)
    assert not auth.required and auth.principal(None) is ANONYMOUS
    # When a user is added and granted
    _, token = users.add("billing")
    users.grant("billing", permission("allow", "consume", "billing-*"))
    # Then the token names it at once, credentials are required, and the file holds it
    p = auth.principal(token)
    assert p is not None and p.name == "billing" and p.may(Action.CONSUME, "billing-eu")
    assert auth.required and auth.principal(None) is None and auth.principal("x") is None
    path = tmp_path / "users.json"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert token not in path.read_text() and not list(tmp_path.glob("*.tmp"))
    # ... and a restart reads the same users
    again = Authenticator(directory(FileBackend(str(tmp_path))))
    assert again.principal(token) == p
    # When it is removed, its token names nobody, and no user opens the broker again
    users.remove("billing")
    assert users.by_token(token) is None
    assert not auth.required and auth.principal(token) is ANONYMOUS


def test_the_admin_token_is_an_admin_beside_the_users(tmp_path: Path) -> None:
    auth = Authenticator(directory(FileBackend(str(tmp_path))), "root")
    assert auth.required and auth.principal("root") is ADMIN
    assert auth.principal("root ") is None and auth.principal("") is None
    assert ADMIN.unrestricted(Action.ADMIN) and ADMIN.may(Action.SEND, "anything")


def test_changes_say_what_is_wrong(tmp_path: Path) -> None:
    users = directory(FileBackend(str(tmp_path)))
    users.add("a")
    with pytest.raises(AlreadyExists):
        users.add("a")
    for change in (lambda: users.grant("b", permission("allow", "send", "*")),
                   lambda: users.revoke("a", Action.SEND, "*"),
                   lambda: users.remove("b")):
        with pytest.raises(NotFound):
            change()
    users.grant("a", permission("deny", "send", "x*"))
    assert users.revoke("a", Action.SEND, "x*").permissions == ()


def _providers(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Provider:
    if kind == "local":
        return LocalProvider(str(tmp_path / "tier"))
    if kind == "seaweed":
        return S3Provider(S3Settings(bucket=request.getfixturevalue("seaweed_bucket"),
                                     endpoint_url=request.getfixturevalue("seaweed_endpoint"),
                                     **CREDS))
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"users-{zlib.crc32(request.node.nodeid.encode())}"
    create_bucket(endpoint, bucket)
    return S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint, **CREDS))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_change_at_one_broker_is_known_at_another_after_a_refresh(
        request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    tier = _providers(request, tmp_path, kind)
    # Given two brokers' directories on one shared tier
    a, b = directory(TierBackend(tier)), directory(TierBackend(tier))
    # When one adds a user and grants it
    _, token = a.add("billing")
    a.grant("billing", permission("allow", "send", "billing"))
    assert tier.exists(USERS_OBJECT)  # beside the brokers' prefixes, not under one
    # Then the other knows it at its next refresh, and so does a broker started later
    assert b.by_token(token) is None
    b.refresh()
    found = b.by_token(token)
    assert found is not None and decide(found, Action.SEND, "billing")
    assert directory(TierBackend(tier)).by_token(token) == found
    # And a revoke at the other is known here at the next refresh
    b.revoke("billing", Action.SEND, "billing")
    a.refresh()
    user = a.user("billing")
    assert user is not None and user.permissions == ()


@pytest.mark.parametrize("kind", ["local", "seaweed"])
def test_racing_changes_are_all_kept(request: pytest.FixtureRequest, tmp_path: Path,
                                     kind: str) -> None:
    """Conditional writes: each writer that loses a race reads again and re-applies its
    change, so none is lost.  (SeaweedFS: its conditional puts are atomic; moto's are
    not, ``tests/tiered/test_providers.py``.)"""
    tier = _providers(request, tmp_path, kind)
    first = directory(TierBackend(tier))
    first.add("u")
    brokers = [first, *(directory(TierBackend(tier)) for _ in range(3))]
    errors: list[BaseException] = []

    def grant(d: UserDirectory, i: int) -> None:
        try:
            for j in range(4):
                d.grant("u", permission("allow", "send", f"t{i}-{j}"))
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=grant, args=(d, i)) for i, d in enumerate(brokers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    first.refresh()
    user = first.user("u")
    assert user is not None
    assert {p.pattern for p in user.permissions} == {f"t{i}-{j}" for i in range(4)
                                                     for j in range(4)}


def test_a_bucket_that_cannot_be_read_keeps_the_users_known(
        s3_endpoint: str, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    bucket = f"users-{zlib.crc32(request.node.nodeid.encode())}"
    create_bucket(s3_endpoint, bucket)
    with FaultProxy(s3_endpoint) as proxy:
        tier = S3Provider(S3Settings(bucket=bucket, endpoint_url=proxy.endpoint,
                                     connect_timeout_s=1, read_timeout_s=1, max_attempts=1,
                                     **CREDS))
        users = directory(TierBackend(tier))
        _, token = users.add("billing")
        auth = Authenticator(users)
        # When the bucket stops answering
        proxy.set_mode("http")
        with caplog.at_level(logging.WARNING, "access.directory"):
            users.refresh()
            users.refresh()
        # Then the users known stay in force (access is not opened), logged once
        assert auth.required and auth.principal(None) is None
        assert auth.principal(token) is not None
        assert sum("could not be read again" in r.getMessage() for r in caplog.records) == 1
        assert users.statistics().refresh_failures == 2
        with pytest.raises(UsersUnavailable):
            users.add("other")  # a change cannot be made blind
        # And when it answers again, refreshes work again
        proxy.set_mode("pass")
        users.refresh()
        assert users.user("billing") is not None


def test_a_damaged_object_keeps_the_users_known(tmp_path: Path) -> None:
    tier = LocalProvider(str(tmp_path / "tier"))
    users = directory(TierBackend(tier))
    _, token = users.add("billing")
    tier.write(USERS_OBJECT, b'{"format": "chronomq.users", "version": 1, "users": [{')
    users.refresh()
    assert users.by_token(token) is not None
    with pytest.raises(DamagedUsers):  # a start does not serve with users it cannot read
        directory(TierBackend(tier))
    with pytest.raises(DamagedUsers):
        users.add("other")


def test_the_document_is_what_the_codec_writes(tmp_path: Path) -> None:
    users = directory(FileBackend(str(tmp_path)))
    u, _ = users.add("a")
    u = users.grant("a", Permission(Effect.DENY, Action.ADMIN, "*"))
    assert (tmp_path / "users.json").read_bytes() == encode([u])
    assert json.loads((tmp_path / "users.json").read_text())["users"][0]["permissions"] == \
        [["deny", "admin", "*"]]

