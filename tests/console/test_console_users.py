"""The console and users (issue 54), over plain HTTP against a real broker: a user logs in
with its own token and sees only the topics, groups, schedules and messages it may; a
page or action it may not is refused 403 naming user, action and resource (the same for
a topic that does not exist), counted and audited with the API's refusals; a removed
user's session ends at its next request; a broker with users but no ``auth_token`` asks
for a login."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from chronomq.config import ConsoleConfig
from tests.conftest import RunningServer, broker_config
from tests.console.conftest import TOKEN, Browser, console_server, free_port


@dataclass
class World:
    server: RunningServer
    shop: str  # shop's token: send on orders, consume on billing*
    orders_mid: str  # pending in orders
    secret_mid: str  # pending in secret

    def denied(self) -> float:
        with self.server.client(token=TOKEN) as admin:
            return admin.stats()["access.denied"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    server = console_server(tmp_path / "data")
    try:
        with server.client(token=TOKEN) as admin:
            for topic in ("orders", "billing-eu", "billing-us", "secret"):
                admin.create_topic(topic, 1)
            shop = admin.users.add("shop").token
            admin.users.grant("shop", "send", "orders")
            admin.users.grant("shop", "consume", "billing*")
            orders_mid = admin.send_one("orders", b"later", key="k1", delay_ms=3_600_000)
            secret_mid = admin.send_one("secret", b"top-secret-body", key="k1", delay_ms=3_600_000)
            for topic, group in (("billing-eu", "payers"), ("secret", "spies")):
                admin.send_one(topic, b"now")
                admin.pop(topic, group)
            admin.create_schedule("s-orders", "orders", b"tick", every_s=3600)
            admin.create_schedule("s-secret", "secret", b"tick", every_s=3600)
        yield World(server, shop, orders_mid, secret_mid)
    finally:
        server.stop()


def _login(world: World, token: str) -> Browser:
    b = Browser(world.server.server.console_port)
    assert b.login(token) == 303
    return b


def _api(b: Browser, path: str) -> tuple[int, dict[str, object]]:
    status, _, text = b.get(path)
    return status, json.loads(text)


def test_a_user_sees_only_what_it_may(world: World) -> None:
    b = _login(world, world.shop)
    status, _, page = b.get("/topics")
    assert status == 200 and '<span id="who">shop</span>' in page
    assert "billing-eu" in page and "secret" not in page
    _, topics = _api(b, "/api/topics")
    assert [r["name"] for r in topics["rows"]] == ["billing-eu", "billing-us", "orders"]
    assert topics["total"] == 3
    _, groups = _api(b, "/api/groups")
    assert [(r["group"], r["topic"]) for r in groups["rows"]] == [("payers", "billing-eu")]
    _, recurring = _api(b, "/api/recurring")
    assert [r["name"] for r in recurring["rows"]] == ["s-orders"]
    _, overview = _api(b, "/api/overview")
    assert (overview["scope"], overview["topics"], overview["groups"]) == ("user", 3, 1)
    assert "rates" not in overview and "timer" not in overview
    status, _, page = b.get("/")
    assert status == 200 and "need admin on *" in page and 'href="/schedule"' not in page
    # a message of a topic it may not consume is not found; one of orders is (send only:
    # it may act on it, and the forms name its topic)
    _, found = _api(b, f"/api/messages?id={world.secret_mid}")
    assert found == {"messages": [], "pending_due_ms": None}
    status, _, page = b.get(f"/messages?id={world.secret_mid}")
    assert status == 200 and 'id="none"' in page and "top-secret-body" not in page
    # the admin token sees everything, the broker-wide pages too
    admin = _login(world, TOKEN)
    _, everything = _api(admin, "/api/topics")
    assert everything["total"] == 4
    assert admin.get("/schedule")[0] == 200 and 'href="/schedule"' in admin.get("/")[2]


def test_a_page_it_may_not_see_is_refused_the_same_whether_it_exists_or_not(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    b = _login(world, world.shop)
    before = world.denied()
    caplog.set_level(logging.WARNING, logger="chronomq.audit")
    status, schedule = _api(b, "/api/schedule")
    assert status == 403 and schedule == {
        "error": "PERMISSION_DENIED",
        "message": "user 'shop' may not administer the broker (admin on *)"}
    answers = []
    for topic in ("secret", "nowhere"):
        by_key = _api(b, f"/api/messages?topic={topic}&key=k1")
        dead = _api(b, f"/api/dead-letters?group=spies&topic={topic}")
        answers.append([(s, json.dumps(d).replace(topic, "T")) for s, d in (by_key, dead)])
    assert answers[0] == answers[1] == [
        (403, json.dumps({"error": "PERMISSION_DENIED",
                          "message": "user 'shop' may not consume from topic 'T'"}))] * 2
    status, _, page = b.get("/messages?topic=secret&key=k1")
    assert status == 403 and "PERMISSION_DENIED: user &#x27;shop&#x27; may not consume" in page
    assert world.denied() == before + 6
    lines = [r.getMessage() for r in caplog.records if r.name == "chronomq.audit"]
    assert len(lines) == 6
    assert lines[0].startswith("denied user='shop' action=admin resource='*' "
                               "rpc=console.schedule peer=console:127.0.0.1:")


def test_an_action_it_may_not_take_is_refused_and_counted(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    b = _login(world, world.shop)
    before = world.denied()
    caplog.set_level(logging.WARNING, logger="chronomq.audit")
    for form, message in (
            ({"message_id": world.secret_mid, "topic": "secret"},
             "may not send to topic &#x27;secret&#x27;"),
            ({"message_id": world.secret_mid}, "may not send to every topic (give the topic)")):
        status, _, page = b.post("/messages/cancel", {**form, "csrf": b.csrf})
        assert status == 403 and f"PERMISSION_DENIED: user &#x27;shop&#x27; {message}" in page
    status, _, page = b.post("/messages/reschedule", {
        "message_id": world.secret_mid, "topic": "secret", "delay_s": "5", "csrf": b.csrf})
    assert status == 403
    status, _, page = b.post("/messages/replace", {
        "message_id": world.secret_mid, "topic": "secret", "body": "mine", "csrf": b.csrf})
    assert status == 403
    status, _, page = b.post("/dead-letters/redrive", {
        "group": "spies", "topic": "secret", "offset": "0", "csrf": b.csrf})
    assert status == 403
    assert world.server.server.broker.timer.pending_due(world.secret_mid) is not None
    assert world.denied() == before + 5
    rpcs = [r.getMessage().split(" rpc=")[1].split()[0] for r in caplog.records
            if r.name == "chronomq.audit"]
    assert rpcs == ["Cancel", "Cancel", "Reschedule", "Send", "QueryMessages"]
    # a message it may read but not change shows no action
    with world.server.client(token=TOKEN) as admin:
        bill_mid = admin.send_one("billing-eu", b"bill later", delay_ms=3_600_000)
    status, _, page = b.get(f"/messages?id={bill_mid}")
    assert status == 200 and "bill later" in page and 'id="cancel"' not in page
    # what it may do is done: its orders message, the form naming the topic
    _, found = _api(b, f"/api/messages?id={world.orders_mid}")
    assert found["messages"] == []  # send only: it may not read it
    with world.server.client(token=TOKEN) as admin:
        admin.users.grant("shop", "consume", "orders")
    status, _, page = b.get(f"/messages?id={world.orders_mid}")
    assert status == 200 and 'id="cancel"' in page and 'name="topic" value="orders"' in page
    status, _, page = b.post("/messages/cancel", {"message_id": world.orders_mid,
                                                   "topic": "orders", "csrf": b.csrf})
    assert status == 200 and f"Cancel {world.orders_mid}: CANCELLED" in page


def test_a_removed_users_session_ends_at_its_next_request(world: World) -> None:
    b = _login(world, world.shop)
    assert b.get("/topics")[0] == 200
    csrf = b.csrf
    with world.server.client(token=TOKEN) as admin:
        admin.users.revoke("shop", "consume", "billing*")  # in force at the next request
    _, topics = _api(b, "/api/topics")
    assert [r["name"] for r in topics["rows"]] == ["orders"]
    with world.server.client(token=TOKEN) as admin:
        admin.users.remove("shop")
    assert b.get("/api/topics")[0] == 401
    status, headers, _ = b.get("/topics")
    assert status == 303 and headers["location"] == "/login"
    assert b.post("/messages/cancel", {"message_id": world.orders_mid, "topic": "orders",
                                       "csrf": csrf})[0] == 401
    assert b.login(world.shop) == 403  # its token names nobody now


def test_users_without_an_auth_token_need_a_login(tmp_path: Path) -> None:
    """A broker without ``server.auth_token`` is open until a user exists (here added
    through its directory, as a peer broker on the same bucket would), then asks for a
    login; a user's token logs in."""
    config = replace(broker_config(tmp_path / "data"),
                     console=ConsoleConfig(port=free_port(), actions=True))
    server = RunningServer(config)
    try:
        b = Browser(server.server.console_port)
        assert b.get("/")[0] == 200  # open: a session at once
        _, token = server.server.broker.access.directory.add("shop")
        status, headers, _ = b.get("/")
        assert status == 303 and headers["location"] == "/login"
        assert Browser(server.server.console_port).get("/api/topics")[0] == 401
        assert b.login("not-a-token") == 403
        assert b.login(token) == 303 and b.get("/topics")[0] == 200
    finally:
        server.stop()
