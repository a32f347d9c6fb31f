"""Users and permissions through every RPC of ``chronomq.v1.Broker`` on a real broker over
127.0.0.1 gRPC (issue 54): a table of one row per method (a test fails when the service
has a method without a row, here or in ``chronomq.api.permissions.RULES``), each with a
request a user may make and one it may not; the denial's message, code, count and audit
line; the same answer for a forbidden topic that exists and one that does not; prefixes,
deny wins, the admin token, a revoke in force at once, answers cut to what a user may
see, and a broker that needs no credentials."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from access.model import resource_of
from chronomq.api.permissions import RULES
from chronomq.client import ChronomqClient, RpcError, message
from chronomq.metrics import family
from chronomq.v1 import broker_pb2 as pb
from tests.conftest import RunningServer, broker_config

SERVICE = pb.DESCRIPTOR.services_by_name["Broker"]
ADMIN_TOKEN = "root-token"
DENIED = grpc.StatusCode.PERMISSION_DENIED


@dataclass
class World:
    server: RunningServer
    tokens: dict[str, str]  # user -> token ("admin": the auth_token)
    handles: dict[str, str]  # topic -> a receipt handle of group "g" (leased by the admin)
    mid: str  # a pending delayed message of "orders"
    stored: str  # a stored message of "orders"

    def client(self, who: str) -> ChronomqClient:
        return self.server.client(token=self.tokens[who])

    def call(self, who: str, rpc: str, *requests: Message,
             timeout_s: float = 2.0) -> tuple[grpc.StatusCode, str]:
        return raw_call(self.server.target, rpc, list(requests), self.tokens[who], timeout_s)


def raw_call(target: str, rpc: str, requests: list[Message], token: str,
             timeout_s: float = 2.0) -> tuple[grpc.StatusCode, str]:
    """One call of ``rpc`` with ``requests`` (a stream: all of them): its final status and
    details (a stream still open at the deadline: OK)."""
    m = SERVICE.methods_by_name[rpc]
    path = f"/{SERVICE.full_name}/{rpc}"
    raw = {"request_serializer": None, "response_deserializer": None}
    frames = [r.SerializeToString() for r in requests]
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(target) as channel:
        try:
            if m.client_streaming:
                call = channel.stream_stream(path, **raw)(iter(frames), timeout=timeout_s,
                                                          metadata=metadata)
                for _ in call:
                    pass
            elif m.server_streaming:
                for _ in channel.unary_stream(path, **raw)(frames[0], timeout=timeout_s,
                                                           metadata=metadata):
                    pass
            else:
                channel.unary_unary(path, **raw)(frames[0], timeout=timeout_s,
                                                 metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return grpc.StatusCode.OK, ""
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root: Path = tmp_path_factory.mktemp("permissions")
    server = RunningServer(broker_config(root / "data", auth_token=ADMIN_TOKEN))
    tokens = {"admin": ADMIN_TOKEN}
    try:
        with server.client(token=ADMIN_TOKEN) as admin:
            for topic in ("orders", "orders-old", "billing-eu", "billing-audit",
                          "billing-us"):
                admin.create_topic(topic, queue_count=1)
            # billing: sends and consumes billing-*, but not billing-audit; administers
            # billing-* topics
            tokens["billing"] = admin.users.add("billing").token
            for grant in (("send", "billing-*"), ("consume", "billing-*"),
                          ("admin", "billing-*")):
                admin.users.grant("billing", *grant)
            admin.users.grant("billing", "consume", "billing-audit", deny=True)
            # ops: administers the broker (admin on *), nothing else
            tokens["ops"] = admin.users.add("ops").token
            admin.users.grant("ops", "admin", "*")
            tokens["nobody"] = admin.users.add("nobody").token
            for topic in ("orders", "billing-eu", "billing-audit"):
                admin.send_one(topic, b"first")
            handles = {t: admin.pop(t, "g", max_messages=1, invisible_time_s=3600)[0]
                       .receipt_handle for t in ("orders", "billing-eu", "billing-audit")}
            mid = admin.send_one("orders", b"later", delay_ms=3_600_000)
            stored = admin.send_one("orders", b"stored")
            admin.create_schedule("s-orders", "orders", b"tick", every_s=3600)
            for name in ("s-bill", "s-bill2", "s-bill3"):
                admin.create_schedule(name, "billing-eu", b"tick", every_s=3600)
        yield World(server, tokens, handles, mid, stored)
    finally:
        server.stop()


@dataclass(frozen=True)
class Row:
    """A request ``who`` may make, and (``deny``) one ``billing`` may not, refused with a
    message that ends so; ``None``: the RPC cannot be refused (its answer is narrowed).
    The admin token makes the ``deny`` request too: it changes nothing the other rows
    need."""

    who: str
    allowed: Callable[[World], list[Message]]
    deny: Callable[[World], list[Message]] | None = None
    says: str = ""


def _send(topic: str) -> pb.SendRequest:
    return pb.SendRequest(messages=[message(topic, b"x")])


def _subscribe(topic: str, group: str) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(topic=topic, group=group, invisible_time_s=30)


def _schedule(name: str, topic: str) -> pb.Schedule:
    return pb.Schedule(name=name, topic=topic, every_s=3600, body=b"x")


BROKER = "may not administer the broker (admin on *)"
S_ORDERS = "may not use schedule 's-orders': none of that name sends to a topic it may send to"
ROWS: dict[str, Row] = {
    "CreateTopic": Row("billing", lambda w: [pb.CreateTopicRequest(
        topic=pb.Topic(name="billing-new"))], lambda w: [pb.CreateTopicRequest(
            topic=pb.Topic(name="orders"))], "may not administer topic 'orders'"),
    "ListTopics": Row("billing", lambda w: [pb.ListTopicsRequest()]),
    "DeleteTopic": Row("billing", lambda w: [pb.DeleteTopicRequest(name="billing-gone")],
                       lambda w: [pb.DeleteTopicRequest(name="orders-old")],
                       "may not administer topic 'orders-old'"),
    "Send": Row("billing", lambda w: [_send("billing-eu")],
                lambda w: [pb.SendRequest(messages=[message("billing-eu", b"x"),
                                                    message("orders", b"y")])],
                "may not send to topic 'orders'"),
    "SendStream": Row("billing", lambda w: [_send("billing-eu"), _send("billing-us")],
                      lambda w: [_send("billing-eu"), _send("orders")],
                      "may not send to topic 'orders'"),
    "Pop": Row("billing", lambda w: [pb.PopRequest(topic="billing-eu", group="b")],
               lambda w: [pb.PopRequest(topic="billing-audit", group="b")],
               "may not consume from topic 'billing-audit'"),
    "Ack": Row("billing", lambda w: [pb.AckRequest(group="g", receipt_handles=["bogus"])],
               lambda w: [pb.AckRequest(group="g", receipt_handles=[w.handles["orders"]])],
               "may not consume from topic 'orders'"),
    "ChangeInvisibleTime": Row(
        "billing", lambda w: [pb.ChangeInvisibleTimeRequest(
            group="g", receipt_handle=w.handles["billing-eu"], invisible_time_s=3600)],
        lambda w: [pb.ChangeInvisibleTimeRequest(
            group="g", receipt_handle=w.handles["billing-audit"], invisible_time_s=60)],
        "may not consume from topic 'billing-audit'"),
    "Nack": Row("billing", lambda w: [pb.NackRequest(group="g", receipt_handles=["x"])],
                lambda w: [pb.NackRequest(group="g", receipt_handles=[w.handles["orders"]])],
                "may not consume from topic 'orders'"),
    "DeadLetter": Row("billing", lambda w: [pb.DeadLetterRequest(
        group="g", receipt_handles=["x"])], lambda w: [pb.DeadLetterRequest(
            group="g", receipt_handles=[w.handles["orders"]])],
        "may not consume from topic 'orders'"),
    "Subscribe": Row("billing", lambda w: [_subscribe("billing-us", "b")],
                     lambda w: [_subscribe("billing-us", "g"),
                                pb.SubscribeRequest(ack=[w.handles["orders"]])],
                     "may not consume from topic 'orders'"),
    "Cancel": Row("billing", lambda w: [pb.CancelRequest(message_id=w.mid, topic="billing-eu")],
                  lambda w: [pb.CancelRequest(message_id=w.mid)],
                  "may not send to every topic (give the topic)"),
    "Reschedule": Row("billing", lambda w: [pb.RescheduleRequest(
        message_id=w.mid, topic="billing-eu", delay_ms=1000)], lambda w: [
            pb.RescheduleRequest(message_id=w.mid, topic="orders", delay_ms=1000)],
        "may not send to topic 'orders'"),
    "QueryMessages": Row("billing", lambda w: [pb.QueryMessagesRequest(
        topic="billing-eu", key="k")], lambda w: [pb.QueryMessagesRequest(
            topic="%DLQ%g%orders", key="k")], "may not consume from topic '%DLQ%g%orders'"),
    "Stats": Row("billing", lambda w: [pb.StatsRequest()]),
    "Mount": Row("ops", lambda w: [pb.MountRequest(broker="nobody-here")],
                 lambda w: [pb.MountRequest(broker="nobody-here")], BROKER),
    "Unmount": Row("ops", lambda w: [pb.UnmountRequest(broker="x")],
                   lambda w: [pb.UnmountRequest(broker="x")], BROKER),
    "Takeover": Row("ops", lambda w: [pb.TakeoverRequest(broker="")],
                    lambda w: [pb.TakeoverRequest(broker="")], BROKER),
    "CreateSchedule": Row("billing", lambda w: [pb.CreateScheduleRequest(
        schedule=_schedule("s-new", "billing-eu"))], lambda w: [pb.CreateScheduleRequest(
            schedule=_schedule("s-orders", "billing-eu"))], S_ORDERS),
    "UpdateSchedule": Row("billing", lambda w: [pb.UpdateScheduleRequest(
        schedule=pb.Schedule(name="s-bill", every_s=7200))], lambda w: [
            pb.UpdateScheduleRequest(schedule=pb.Schedule(name="s-bill2", topic="orders"))],
        "may not send to topic 'orders'"),
    "ListSchedules": Row("billing", lambda w: [pb.ListSchedulesRequest()]),
    "PauseSchedule": Row("billing", lambda w: [pb.ScheduleNameRequest(name="s-bill")],
                         lambda w: [pb.ScheduleNameRequest(name="s-orders")], S_ORDERS),
    "ResumeSchedule": Row("billing", lambda w: [pb.ScheduleNameRequest(name="s-bill")],
                          lambda w: [pb.ScheduleNameRequest(name="s-orders")], S_ORDERS),
    "DeleteSchedule": Row("billing", lambda w: [pb.ScheduleNameRequest(name="s-bill3")],
                          lambda w: [pb.ScheduleNameRequest(name="s-orders")], S_ORDERS),
    "TriggerSchedule": Row("billing", lambda w: [pb.ScheduleNameRequest(name="s-bill")],
                           lambda w: [pb.ScheduleNameRequest(name="s-orders")], S_ORDERS),
    "NextFires": Row("billing", lambda w: [pb.NextFiresRequest(name="s-bill")],
                     lambda w: [pb.NextFiresRequest(name="s-orders")], S_ORDERS),
    "AddUser": Row("ops", lambda w: [pb.AddUserRequest(name="added-by-ops")],
                   lambda w: [pb.AddUserRequest(name="x")], BROKER),
    "GrantPermission": Row("ops", lambda w: [pb.GrantPermissionRequest(
        user="nobody", permission=pb.Permission(action="send", pattern="nobody-*"))],
        lambda w: [pb.GrantPermissionRequest(user="no-such-user", permission=pb.Permission(
            action="send", pattern="*"))], BROKER),
    "RevokePermission": Row("ops", lambda w: [pb.RevokePermissionRequest(
        user="nobody", action="send", pattern="never-granted")], lambda w: [
            pb.RevokePermissionRequest(user="billing", action="send", pattern="never")],
        BROKER),
    "ListUsers": Row("ops", lambda w: [pb.ListUsersRequest()],
                     lambda w: [pb.ListUsersRequest()], BROKER),
    "RemoveUser": Row("ops", lambda w: [pb.RemoveUserRequest(name="no-such-user")],
                      lambda w: [pb.RemoveUserRequest(name="no-such-user")], BROKER),
    "WhoAmI": Row("nobody", lambda w: [pb.WhoAmIRequest()]),
}
METHODS = [m.name for m in SERVICE.methods]


def test_every_rpc_has_a_row_here_and_in_the_enforcement_table() -> None:
    assert set(ROWS) == set(METHODS), sorted(set(METHODS) ^ set(ROWS))
    assert set(RULES) == set(METHODS), sorted(set(METHODS) ^ set(RULES))


@pytest.mark.parametrize("rpc", METHODS)
def test_each_rpc_refuses_what_a_user_may_not_and_lets_through_what_it_may(
        world: World, rpc: str, caplog: pytest.LogCaptureFixture) -> None:
    row = ROWS[rpc]
    # Given a user with the rights the row needs: not refused (whatever else it answers)
    code, details = world.call(row.who, rpc, *row.allowed(world))
    assert code not in (DENIED, grpc.StatusCode.UNAUTHENTICATED), (code, details)
    if row.deny is None:
        return
    # When billing makes the request it may not
    with world.client("admin") as admin:
        before = admin.stats()["access.denied"]
    with caplog.at_level(logging.INFO, "chronomq.audit"):
        code, details = world.call("billing", rpc, *row.deny(world))
    # Then PERMISSION_DENIED naming the user, the action and the resource ...
    assert (code, details) == (DENIED, f"user 'billing' {row.says}")
    # ... counted, and logged as one audit line
    with world.client("admin") as admin:
        assert admin.stats()["access.denied"] == before + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "chronomq.audit"]
    assert len(lines) == 1 and "user='billing'" in lines[0] and f"rpc={rpc}" in lines[0]
    assert "peer=ipv" in lines[0]
    # And the admin token may make it (whatever else the broker answers)
    code, details = world.call("admin", rpc, *row.deny(world))
    assert code != DENIED, details


@pytest.mark.parametrize("rpc,request_for", [
    ("Send", lambda t: _send(t)),
    ("Pop", lambda t: pb.PopRequest(topic=t, group="b")),
    ("CreateTopic", lambda t: pb.CreateTopicRequest(topic=pb.Topic(name=t))),
    ("DeleteTopic", lambda t: pb.DeleteTopicRequest(name=t)),
    ("QueryMessages", lambda t: pb.QueryMessagesRequest(topic=t, key="k")),
    ("Cancel", lambda t: pb.CancelRequest(message_id="m", topic=t)),
    ("Subscribe", lambda t: _subscribe(t, "b")),
    ("CreateSchedule", lambda t: pb.CreateScheduleRequest(schedule=_schedule("s-x", t))),
])
def test_a_forbidden_topic_is_refused_the_same_whether_it_exists_or_not(
        world: World, rpc: str, request_for: Callable[[str], Message]) -> None:
    existing = world.call("billing", rpc, request_for("orders"))
    missing = world.call("billing", rpc, request_for("ordersX"))
    assert existing[0] == missing[0] == DENIED
    assert existing[1].replace("'orders'", "T") == missing[1].replace("'ordersX'", "T")


def test_a_hidden_schedule_and_a_missing_one_answer_alike(world: World) -> None:
    hidden = world.call("billing", "NextFires", pb.NextFiresRequest(name="s-orders"))
    missing = world.call("billing", "NextFires", pb.NextFiresRequest(name="s-ordersX"))
    assert hidden[0] == missing[0] == DENIED
    assert hidden[1].replace("s-orders'", "S") == missing[1].replace("s-ordersX'", "S")


def test_answers_are_cut_to_what_the_user_may_see(world: World) -> None:
    with world.client("billing") as c:
        topics = {t.name for t in c.list_topics()}
        assert {"billing-audit", "billing-eu", "billing-us"} <= topics
        # (a group's retry topics are listed with their topic's rights)
        assert all(resource_of(t).startswith("billing-") for t in topics), topics
        figures = c.stats()
        assert figures and all(f.startswith("group.") for f in figures)
        assert not any(".orders." in f or ".billing-audit." in f for f in figures)
        listed = c.list_schedules()
        assert "s-bill" in {s.name for s in listed}
        assert all(s.topic.startswith("billing-") for s in listed)
        page, token = c.list_schedules_page(limit=1)
        assert page == listed[:1] and token == (listed[0].name if len(listed) > 1 else "")
        total = c.call("ListSchedules", pb.ListSchedulesRequest()).total
        assert total == len(listed)
        assert c.query(message_id=world.stored) == []  # orders': as if there were none
        who, everything = c.users.whoami()
        assert who.name == "billing" and not everything
        assert ("deny", "consume", "billing-audit") in who.permissions
    with world.client("nobody") as c:
        assert c.list_topics() == [] and c.stats() == {} and c.list_schedules() == []
    with world.client("admin") as c:
        assert "orders" in {t.name for t in c.list_topics()}
        assert c.stats()["access.users"] >= 3
        assert len(c.query(message_id=world.stored)) == 1
        assert c.users.whoami()[1]  # the admin token: every topic


def test_prefixes_deny_wins_and_a_revoke_is_in_force_at_once(world: World) -> None:
    with world.client("admin") as admin, world.client("billing") as billing:
        admin.create_topic("billing-tmp", queue_count=1)
        assert billing.send_one("billing-tmp", b"x")  # billing-* allows it
        admin.users.grant("billing", "send", "billing-tmp", deny=True)
        with pytest.raises(RpcError) as denied:  # the deny wins, at once
            billing.send_one("billing-tmp", b"x")
        assert denied.value.code == DENIED
        admin.users.revoke("billing", "send", "billing-tmp")
        assert billing.send_one("billing-tmp", b"x")
        admin.users.revoke("billing", "send", "billing-*")  # the next call: refused
        with pytest.raises(RpcError) as denied:
            billing.send_one("billing-eu", b"x")
        assert denied.value.code == DENIED
        admin.users.grant("billing", "send", "billing-*")
        assert billing.send_one("billing-eu", b"x")


def test_a_removed_users_token_is_unauthenticated_at_once(world: World) -> None:
    with world.client("admin") as admin:
        token = admin.users.add("short-lived").token
        admin.users.grant("short-lived", "send", "*")
        with world.server.client(token=token) as c:
            assert c.send_one("billing-eu", b"x")
            admin.users.remove("short-lived")
            with pytest.raises(RpcError) as refused:
                c.send_one("billing-eu", b"x")
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_user_management_answers(world: World) -> None:
    with world.client("ops") as ops:
        added = ops.users.add("temp-user")
        assert added.user.permissions == () and added.rocketmq_access_key == "temp-user"
        assert len(added.rocketmq_secret_key) == 40 and added.token
        with pytest.raises(RpcError) as exists:
            ops.users.add("temp-user")
        assert exists.value.code == grpc.StatusCode.ALREADY_EXISTS
        for bad in (lambda: ops.users.add("bad name"),
                    lambda: ops.users.grant("temp-user", "write", "*"),
                    lambda: ops.users.grant("temp-user", "send", "a*b")):
            with pytest.raises(RpcError) as invalid:
                bad()
            assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(RpcError) as missing:
            ops.users.revoke("temp-user", "send", "*")
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert "temp-user" in {u.name for u in ops.users.all()}
        ops.users.remove("temp-user")
        assert "temp-user" not in {u.name for u in ops.users.all()}


def test_denials_are_a_prometheus_counter() -> None:
    assert family("access.denied")[:2] == ("chronomq_access_denied", "counter")


def test_a_broker_without_credentials_stays_open_and_refuses_a_first_user(
        tmp_path: Path) -> None:
    server = RunningServer(broker_config(tmp_path / "data"))
    try:
        with server.client() as c:
            c.create_topic("t")
            assert c.send_one("t", b"x")
            assert c.users.whoami()[1]  # everything
            with pytest.raises(RpcError) as refused:
                c.users.add("first")
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "server.auth_token" in refused.value.details
            assert c.users.all() == []
    finally:
        server.stop()


def test_users_outlive_a_restart(tmp_path: Path) -> None:
    config = broker_config(tmp_path / "data", auth_token=ADMIN_TOKEN)
    server = RunningServer(config)
    try:
        with server.client(token=ADMIN_TOKEN) as admin:
            token = admin.users.add("keeper").token
            admin.users.grant("keeper", "send", "t")
    finally:
        server.stop()
    server = RunningServer(config)
    try:
        with server.client(token=token) as c:
            assert c.users.whoami()[0].permissions == (("allow", "send", "t"),)
    finally:
        server.stop()
