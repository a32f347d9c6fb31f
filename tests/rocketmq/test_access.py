"""Users and permissions on the RocketMQ 5 front (issue 54), on a real broker over
127.0.0.1: the official Python client signing with a user's access key (its name) and
secret key (from AddUser), and raw calls of every kind through the generated stub.

One row per RPC of ``apache.rocketmq.v2.MessagingService`` (a test fails when the
service has an RPC without one); refusals are answers with RocketMQ's codes (FORBIDDEN,
UNAUTHORIZED) naming user, action and topic, the same for a forbidden topic that exists
and one that does not, counted in Stats and audited like the API's; a revoke is in
force at the next call; signatures are required as soon as a user exists."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.v5.exception import ForbiddenException

from chronomq.client.users import NewUser
from chronomq.rocketmq.access import ROCKETMQ_RULES
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from store.topics import Topic
from tests.rocketmq.conftest import RocketMQEnv

C = rd.Code
ADMIN = "root-token"
SERVICE = rs.DESCRIPTOR.services_by_name["MessagingService"]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[RocketMQEnv]:
    """Topics orders, other (the env's), billing-eu with one message; user ``shop``:
    send on orders, consume on billing*."""
    e = RocketMQEnv(tmp_path, server={"auth_token": ADMIN})
    e.broker.create_topic(Topic("billing-eu", 2))
    with e.running.client(token=ADMIN) as admin:
        admin.users.add("shop")
        admin.users.grant("shop", "send", "orders")
        admin.users.grant("shop", "consume", "billing*")
        admin.send_one("billing-eu", b"bill")
    yield e
    e.close()


def shop(env: RocketMQEnv) -> tuple[str, str]:
    """shop's access key and secret key, as AddUser answered them (read again here)."""
    user = env.broker.access.directory.user("shop")
    assert user is not None
    return user.name, user.rocketmq_secret


def signed(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    """The headers an official client sends: HMAC-SHA1 of the date under the secret."""
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    signature = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
    return [("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                              f"SignedHeaders=x-mq-date-time, Signature={signature}"),
            ("x-mq-date-time", date)]


def _msg(topic: str, body: bytes = b"x", mid: str = "") -> Any:
    return rd.Message(topic=rd.Resource(name=topic), body=body,
                      system_properties=rd.SystemProperties(
                          message_id=mid or f"m-{time.monotonic_ns()}", message_type=rd.NORMAL,
                          body_encoding=rd.IDENTITY))


def _send(env: RocketMQEnv, md: Any, topic: str) -> Any:
    return env.stub.SendMessage(rs.SendMessageRequest(messages=[_msg(topic)]), metadata=md)


def _receive(env: RocketMQEnv, md: Any, topic: str) -> list[Any]:
    return list(env.stub.ReceiveMessage(rs.ReceiveMessageRequest(
        group=rd.Resource(name="g"), message_queue=rd.MessageQueue(topic=rd.Resource(name=topic)),
        filter_expression=rd.FilterExpression(type=rd.TAG, expression="*"), batch_size=16,
        invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=0)),
        metadata=md, timeout=5))


def _route(env: RocketMQEnv, md: Any, topic: str) -> Any:
    return env.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name=topic)), metadata=md)


def _denied(env: RocketMQEnv) -> float:
    with env.running.client(token=ADMIN) as admin:
        return admin.stats()["access.denied"]


def test_every_rpc_of_the_service_has_a_row() -> None:
    assert set(ROCKETMQ_RULES) == {m.name for m in SERVICE.methods}


# ---------------------------------------------------------------- the official client

def _config(env: RocketMQEnv, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(env.endpoint, Credentials(ak, sk), request_timeout=5)


def _message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def test_the_official_client_sends_and_receives_only_where_the_user_may(
        env: RocketMQEnv) -> None:
    with env.running.client(token=ADMIN) as admin:  # the keys AddUser answers
        late: NewUser = admin.users.add("late")
    assert late.rocketmq_access_key == "late" and len(late.rocketmq_secret_key) == 40
    ak, sk = shop(env)
    producer = Producer(_config(env, ak, sk), ("orders",))
    producer.startup()
    try:
        # Given shop may send to orders: its send is stored
        assert producer.send(_message("orders", b"paid")).message_id
        # When it sends to billing-eu, which it may only consume: refused, naming both
        with pytest.raises(ForbiddenException,
                           match="user 'shop' may not send to topic 'billing-eu'"):
            producer.send(_message("billing-eu", b"forged"))
        # and a topic that does not exist is refused the same as one that does ("other"):
        # the route of neither is given
        for topic in ("other", "nowhere"):
            with pytest.raises(Exception, match=f"topic:{topic} route"):
                producer.send(_message(topic, b"x"))
    finally:
        producer.shutdown()
    with env.running.client(token=ADMIN) as admin:
        assert [m.body for m in admin.pop("orders", "audit")] == [b"paid"]
        assert [m.body for m in admin.pop("billing-eu", "audit")] == [b"bill"]
    # shop receives from billing-eu (consume on billing*) and acks
    consumer = SimpleConsumer(_config(env, ak, sk), "workers",
                              {"billing-eu": FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        (m,) = consumer.receive(16, 30)
        assert m.body == b"bill"
        consumer.ack(m)
    finally:
        consumer.shutdown()
    # but not from orders, which it may only send to
    refused = SimpleConsumer(_config(env, ak, sk), "workers",
                             {"orders": FilterExpression("*")}, await_duration=1)
    refused.startup()
    try:
        with pytest.raises(ForbiddenException,
                           match="user 'shop' may not consume from topic 'orders'"):
            refused.receive(16, 30)
    finally:
        refused.shutdown()


def test_a_wrong_secret_gets_no_route_from_the_official_client(env: RocketMQEnv) -> None:
    ak, _ = shop(env)
    producer = Producer(_config(env, ak, "0" * 40), ("orders",))
    producer.startup()
    try:
        with pytest.raises(Exception, match="route"):  # QueryRoute answered UNAUTHORIZED
            producer.send(_message("orders", b"forged"))
    finally:
        producer.shutdown()


# ---------------------------------------------------------------- raw calls

def test_refusals_are_forbidden_the_same_for_a_missing_topic_counted_and_audited(
        env: RocketMQEnv, caplog: pytest.LogCaptureFixture) -> None:
    md = signed(*shop(env))
    before = _denied(env)
    caplog.set_level(logging.WARNING, logger="chronomq.audit")
    answers = {}
    for topic in ("other", "nowhere"):  # exists / does not: no difference but the name
        sent = _send(env, md, topic)
        (received,) = _receive(env, md, topic)
        route = _route(env, md, topic)
        answers[topic] = [(a.status.code, a.status.message.replace(topic, "T"))
                          for a in (sent, received, route)]
    assert answers["other"] == answers["nowhere"] == [
        (C.FORBIDDEN, "user 'shop' may not send to topic 'T'"),
        (C.FORBIDDEN, "user 'shop' may not consume from topic 'T'"),
        (C.FORBIDDEN, "user 'shop' may not use topic 'T' (it has no send, consume or admin "
                      "on it)")]
    assert _denied(env) == before + 6
    lines = [r.getMessage() for r in caplog.records if r.name == "chronomq.audit"]
    assert "denied user='shop' action=send resource='topic:other' rpc=SendMessage peer=ipv4:" \
        "127.0.0.1:" in lines[0]
    assert [line.split(" rpc=")[1].split()[0] for line in lines] == [
        "SendMessage", "ReceiveMessage", "QueryRoute"] * 2
    # what it may do passes: a route of a topic it may send to, a billing-* receive
    assert _route(env, md, "orders").status.code == C.OK
    (status, message, _stamp) = _receive(env, md, "billing-eu")
    assert status.status.code == C.OK and message.message.body == b"bill"
    assert _send(env, md, "orders").status.code == C.OK
    # a billing-* topic that does not exist is its to be told of
    assert _route(env, md, "billing-nowhere").status.code == C.TOPIC_NOT_FOUND


def test_settling_needs_consume_on_the_topic_the_handle_was_signed_for(
        env: RocketMQEnv) -> None:
    md = signed(*shop(env))
    with env.running.client(token=ADMIN) as admin:
        admin.send_one("other", b"not shop's")
        (theirs,) = admin.pop("other", "g", invisible_time_s=600)
    (_, mine, _) = _receive(env, md, "billing-eu")
    group = rd.Resource(name="g")
    # the request's topic is not believed: the handle says "other"
    ack = env.stub.AckMessage(rs.AckMessageRequest(
        group=group, topic=rd.Resource(name="billing-eu"), entries=[rs.AckMessageEntry(
            message_id="x", receipt_handle=theirs.receipt_handle)]), metadata=md)
    change = env.stub.ChangeInvisibleDuration(rs.ChangeInvisibleDurationRequest(
        group=group, topic=rd.Resource(name="billing-eu"),
        receipt_handle=theirs.receipt_handle, invisible_duration=Duration(seconds=1)),
        metadata=md)
    forward = env.stub.ForwardMessageToDeadLetterQueue(
        rs.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=rd.Resource(name="billing-eu"),
            receipt_handle=theirs.receipt_handle), metadata=md)
    for answer in (ack, change, forward):
        assert (answer.status.code, answer.status.message) == (
            C.FORBIDDEN, "user 'shop' may not consume from topic 'other'")
    with env.running.client(token=ADMIN) as admin:  # the lease is untouched
        admin.ack("g", [theirs.receipt_handle])
    ok = env.stub.AckMessage(rs.AckMessageRequest(group=group, entries=[rs.AckMessageEntry(
        message_id=mine.message.system_properties.message_id,
        receipt_handle=mine.message.system_properties.receipt_handle)]), metadata=md)
    assert ok.status.code == C.OK
    # a handle that does not verify names no topic: the RPC refuses it as before
    bad = env.stub.AckMessage(rs.AckMessageRequest(group=group, entries=[rs.AckMessageEntry(
        message_id="x", receipt_handle="garbage")]), metadata=md)
    assert bad.status.code == C.INVALID_RECEIPT_HANDLE


def test_recall_needs_send_on_its_topic(env: RocketMQEnv) -> None:
    md = signed(*shop(env))
    with env.running.client(token=ADMIN) as admin:
        mine = admin.send_one("orders", b"later", delay_ms=3_600_000)
        theirs = admin.send_one("other", b"later", delay_ms=3_600_000)

    def recall(topic: str, mid: str) -> Any:
        return env.stub.RecallMessage(rs.RecallMessageRequest(
            topic=rd.Resource(name=topic), recall_handle=mid), metadata=md).status
    assert (recall("other", theirs).code, recall("", theirs).code) == (C.FORBIDDEN,
                                                                      C.FORBIDDEN)
    assert "may not send to every topic" in recall("", theirs).message
    assert recall("orders", mine).code == C.OK


def test_session_rpcs_need_only_a_signature_and_a_wrong_one_is_unauthorized(
        env: RocketMQEnv) -> None:
    ak, sk = shop(env)
    good = signed(ak, sk)
    for md in (signed(ak, "0" * 40), signed("nobody", sk), [], good[1:]):
        for answer in (_route(env, md, "orders"), _send(env, md, "orders"),
                       env.stub.Heartbeat(rs.HeartbeatRequest(), metadata=md),
                       *_receive(env, md, "billing-eu"),
                       *env.stub.Telemetry(iter([rs.TelemetryCommand()]), metadata=md,
                                           timeout=5)):
            assert answer.status.code == C.UNAUTHORIZED
            assert "missing or wrong RocketMQ credentials" in answer.status.message
    assert env.stub.Heartbeat(rs.HeartbeatRequest(), metadata=good).status.code == C.OK
    assert env.stub.NotifyClientTermination(rs.NotifyClientTerminationRequest(),
                                            metadata=good).status.code == C.OK


def test_a_revoke_is_in_force_at_the_next_call_and_a_removal_unauthorizes(
        env: RocketMQEnv) -> None:
    md = signed(*shop(env))
    assert _send(env, md, "orders").status.code == C.OK
    with env.running.client(token=ADMIN) as admin:
        admin.users.revoke("shop", "send", "orders")
    assert _send(env, md, "orders").status.code == C.FORBIDDEN
    with env.running.client(token=ADMIN) as admin:
        admin.users.grant("shop", "send", "orders")
    assert _send(env, md, "orders").status.code == C.OK
    with env.running.client(token=ADMIN) as admin:
        admin.users.remove("shop")
    assert _send(env, md, "orders").status.code == C.UNAUTHORIZED


def test_the_fronts_own_keys_are_its_admin(tmp_path: Path) -> None:
    env = RocketMQEnv(tmp_path, server={"auth_token": ADMIN}, access_key="app",
                      secret_key="s3cret")
    try:
        md = signed("app", "s3cret")
        assert _send(env, md, "other").status.code == C.OK
        assert _route(env, md, "nowhere").status.code == C.TOPIC_NOT_FOUND
        assert _send(env, signed("app", "wrong"), "other").status.code == C.UNAUTHORIZED
        # the API's token is no RocketMQ key
        assert _send(env, signed(ADMIN, ADMIN), "other").status.code == C.UNAUTHORIZED
    finally:
        env.close()


def test_signatures_are_required_as_soon_as_a_user_exists(tmp_path: Path) -> None:
    """No auth_token and no rocketmq keys: open until a user appears (here through the
    broker's directory, as a peer broker on the same bucket would add one), then only
    signed calls pass; open again once the last user is gone."""
    env = RocketMQEnv(tmp_path)
    try:
        assert _send(env, [], "orders").status.code == C.OK
        directory = env.broker.access.directory
        user, _ = directory.add("late")
        unsigned = _send(env, [], "orders").status
        assert unsigned.code == C.UNAUTHORIZED
        assert _send(env, signed("late", user.rocketmq_secret), "orders").status.code == \
            C.FORBIDDEN  # known, and allowed nothing yet
        directory.remove("late")
        assert _send(env, [], "orders").status.code == C.OK
    finally:
        env.close()


# ---------------------------------------------------------------- the signature's date

def signed_at(access_key: str, secret_key: str, date: str) -> list[tuple[str, str]]:
    """A correct signature of ``date`` (whatever it says)."""
    signature = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
    return [("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                              f"SignedHeaders=x-mq-date-time, Signature={signature}"),
            ("x-mq-date-time", date)]


def _date(at_ms: int, offset_min: int = 0) -> str:
    """``at_ms`` as a client writes it: the wall clock of UTC + ``offset_min``, then Z."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at_ms / 1000 + offset_min * 60))


def test_a_signature_more_than_15_minutes_from_the_brokers_clock_is_unauthorized(
        env: RocketMQEnv) -> None:
    ak, sk = shop(env)
    now_ms = env.clock.now_ms()

    def status(date: str) -> Any:
        return _send(env, signed_at(ak, sk, date), "orders").status

    # Given a correctly signed date a minute old, or a minute ahead: in force
    assert status(_date(now_ms - 60_000)).code == C.OK
    assert status(_date(now_ms + 60_000)).code == C.OK
    # When it is 16 minutes old or ahead: refused as a wrong signature is, saying why
    for date in (_date(now_ms - 16 * 60_000), _date(now_ms + 16 * 60_000)):
        refused = status(date)
        assert refused.code == C.UNAUTHORIZED
        assert f"x-mq-date-time '{date}' is not" in refused.message
        assert "15 minutes" in refused.message
    # and a date that is not yyyyMMdd'T'HHmmss'Z' is refused too
    for date in ("", "yesterday", _date(now_ms)[:-1], _date(now_ms) + "0",
                 _date(now_ms).replace("T", " "), "20261399T250000Z", "+2026112T001013Z"):
        refused = status(date)
        assert refused.code == C.UNAUTHORIZED, date
        assert "x-mq-date-time" in refused.message


def test_a_captured_signature_stops_working_15_minutes_on(env: RocketMQEnv) -> None:
    """The broker's clock, not the client's, decides (a manual clock here)."""
    md = signed_at(*shop(env), _date(env.clock.now_ms()))
    before = _denied(env)
    assert _send(env, md, "orders").status.code == C.OK
    env.clock.advance(14 * 60_000)
    assert _send(env, md, "orders").status.code == C.OK
    env.clock.advance(2 * 60_000)
    replayed = env.stub.Heartbeat(rs.HeartbeatRequest(), metadata=md).status
    assert replayed.code == C.UNAUTHORIZED
    # counted and audited as any other signature that names nobody
    wrong = _send(env, signed_at("shop", "0" * 40, _date(env.clock.now_ms())), "orders")
    assert wrong.status.code == C.UNAUTHORIZED
    assert _denied(env) == before


def test_a_date_in_a_clients_own_time_zone_is_read_as_that_zones_clock(
        env: RocketMQEnv) -> None:
    """The official Java and Python clients write their machine's local time followed
    by a literal Z; only the Node.js client writes UTC.  A date within 15 minutes of the
    broker's clock read in a zone in use passes, one that is not is refused."""
    ak, sk = shop(env)
    now_ms = env.clock.now_ms()

    def code(at_ms: int, offset_min: int) -> int:
        md = signed_at(ak, sk, _date(at_ms, offset_min))
        return int(_send(env, md, "orders").status.code)
    # Shanghai, New York, Kathmandu, Newfoundland's summer, Kiritimati, Baker Island
    for offset_min in (480, -300, 345, -150, 840, -720):
        assert code(now_ms, offset_min) == C.OK, offset_min
    # 16 minutes old in a zone with no zone in use 1 to 31 minutes behind it
    for offset_min in (480, -300, 60, -720):
        assert code(now_ms - 16 * 60_000, offset_min) == C.UNAUTHORIZED, offset_min
    for hours in (15, -13, 48, -48):  # no zone is that far from UTC
        assert _send(env, signed_at(ak, sk, _date(now_ms, hours * 60)),
                     "orders").status.code == C.UNAUTHORIZED, hours


def test_the_official_python_client_signs_in_a_zone_far_from_utc(
        env: RocketMQEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """rocketmq-python-client dates its signatures with ``datetime.now()``: local time."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30
    time.tzset()
    try:
        ak, sk = shop(env)
        producer = Producer(_config(env, ak, sk), ("orders",))
        producer.startup()
        try:
            assert producer.send(_message("orders", b"from +05:30")).message_id
        finally:
            producer.shutdown()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    with env.running.client(token=ADMIN) as admin:
        assert [m.body for m in admin.pop("orders", "audit")] == [b"from +05:30"]


def test_the_zones_in_use_are_known() -> None:
    """Every zone's offset this year (the machine's tz database) is in the table."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo, available_timezones

    from chronomq.rocketmq.auth import UTC_OFFSETS_MIN
    year = datetime.now(UTC).year
    zones = available_timezones()
    assert len(zones) > 300
    seen = {int(datetime(year, month, 15, tzinfo=ZoneInfo(z)).utcoffset()  # type: ignore[union-attr]
                .total_seconds()) // 60 for z in zones for month in (1, 4, 7, 10)}
    assert seen <= set(UTC_OFFSETS_MIN)
