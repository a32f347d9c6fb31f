"""The RocketMQ front's protocol, RPC by RPC, with the generated apache.rocketmq.v2 stub over
real gRPC: what clients rely on, and a clear status for everything it refuses."""

from __future__ import annotations

import gzip
import hashlib
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from chronomq.rocketmq.front import CLIENT_GONE_MS, MAX_RENEW_MS, duration_s, timestamp_ms
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from chronomq.rocketmq.pb import service_grpc
from pop.flowcontrol import KeyLimits
from store.topics import Topic
from tests.rocketmq.conftest import RocketMQEnv

C = rd.Code


def _msg(body: bytes, mid: str, topic: str = "orders", **system: Any) -> Any:
    return rd.Message(topic=rd.Resource(name=topic), body=body,
                      system_properties=rd.SystemProperties(
                          message_id=mid, message_type=system.pop("message_type", rd.NORMAL),
                          body_encoding=system.pop("body_encoding", rd.IDENTITY), **system))


def _send(env: RocketMQEnv, *messages: Any) -> Any:
    return env.stub.SendMessage(rs.SendMessageRequest(messages=list(messages)))


def _receive(env: RocketMQEnv, group: str = "g", expression: str = "*",
             filter_type: int = rd.TAG, invisible_s: int = 30, topic: str = "orders",
             batch: int = 16) -> list[Any]:
    request = rs.ReceiveMessageRequest(
        group=rd.Resource(name=group),
        message_queue=rd.MessageQueue(topic=rd.Resource(name=topic)),
        filter_expression=rd.FilterExpression(type=filter_type, expression=expression),
        batch_size=batch, invisible_duration=Duration(seconds=invisible_s),
        long_polling_timeout=Duration(seconds=0))
    return list(env.stub.ReceiveMessage(request, timeout=5))


def test_timestamps_in_seconds_or_milliseconds() -> None:
    assert timestamp_ms(Timestamp(seconds=1_800_000_000, nanos=250_000_000)) == \
        1_800_000_000_250
    assert timestamp_ms(Timestamp(seconds=1_800_000_000_250)) == 1_800_000_000_250
    assert duration_s(Duration(seconds=9, nanos=1)) == 10  # rounded up, never shorter
    assert duration_s(Duration(seconds=9)) == 9


def test_query_route(rmq: RocketMQEnv) -> None:
    asked = rd.Endpoints(scheme=rd.IPv4, addresses=[rd.Address(host="10.1.2.3", port=8081)])
    r = rmq.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders"),
                                                 endpoints=asked))
    assert r.status.code == C.OK
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]
    q = r.message_queues[0]
    assert (q.topic.name, q.permission, q.broker.id) == ("orders", rd.READ_WRITE, 0)
    assert set(q.accept_message_types) == {rd.NORMAL, rd.DELAY}
    assert q.broker.endpoints == asked  # the address the client dialled
    missing = rmq.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="nope")))
    assert missing.status.code == C.TOPIC_NOT_FOUND and "nope" in missing.status.message
    bare = rmq.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders")))
    (address,) = bare.message_queues[0].broker.endpoints.addresses
    assert f"{address.host}:{address.port}" == rmq.endpoint


def test_telemetry_completes_settings(rmq: RocketMQEnv) -> None:
    producer = rd.Settings(client_type=rd.PRODUCER, publishing=rd.Publishing(
        topics=[rd.Resource(name="orders")]))
    consumer = rd.Settings(client_type=rd.SIMPLE_CONSUMER, subscription=rd.Subscription(
        group=rd.Resource(name="g"), long_polling_timeout=Duration(seconds=120)))
    bare = rd.Settings(client_type=rd.CLIENT_TYPE_UNSPECIFIED)
    commands = iter([rs.TelemetryCommand(settings=producer),
                     rs.TelemetryCommand(settings=consumer),
                     rs.TelemetryCommand(settings=bare)])
    first, second, third = list(rmq.stub.Telemetry(commands, timeout=5))
    assert first.status.code == second.status.code == third.status.code == C.OK
    assert third.settings.HasField("backoff_policy")  # some clients crash without one
    p = first.settings
    assert p.publishing.max_body_size == rmq.broker.config.store.max_body_bytes
    assert p.publishing.validate_message_type
    assert p.backoff_policy.max_attempts == 3
    assert p.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert not p.metric.on
    s = second.settings
    assert not s.subscription.fifo
    assert s.subscription.receive_batch_size == rmq.broker.config.pop.max_messages_cap
    assert s.subscription.long_polling_timeout.seconds == 5  # pop.max_wait_ms in the tests
    assert s.backoff_policy.max_attempts == rmq.broker.config.pop.max_attempts
    assert s.backoff_policy.customized_backoff.next[0].seconds == 1


def test_send_answers_one_entry_per_message(rmq: RocketMQEnv) -> None:
    r = _send(rmq, _msg(b"a", "ID-A"), _msg(b"", "ID-EMPTY"), _msg(b"c", "ID-C"))
    assert r.status.code == C.MULTIPLE_RESULTS
    assert [(e.message_id, e.status.code) for e in r.entries] == [
        ("ID-A", C.OK), ("ID-EMPTY", C.MESSAGE_BODY_EMPTY), ("ID-C", C.OK)]
    got = _receive(rmq)
    assert got[0].status.code == C.OK
    assert got[-1].WhichOneof("content") == "delivery_timestamp"
    messages = [x.message for x in got if x.WhichOneof("content") == "message"]
    assert sorted(m.system_properties.message_id for m in messages) == ["ID-A", "ID-C"]
    m = messages[0]
    assert m.system_properties.body_digest.type == rd.MD5
    assert m.system_properties.body_digest.checksum == \
        hashlib.md5(m.body).hexdigest().upper()
    assert m.system_properties.delivery_attempt == 1
    assert m.system_properties.receipt_handle


def test_a_message_without_an_id_gets_the_brokers(rmq: RocketMQEnv) -> None:
    r = _send(rmq, _msg(b"anonymous", ""))
    assert r.status.code == C.OK and len(r.entries[0].message_id) == 32
    (m,) = [x.message for x in _receive(rmq) if x.WhichOneof("content") == "message"]
    assert m.system_properties.message_id == r.entries[0].message_id


def test_a_retried_send_is_stored_once(rmq: RocketMQEnv) -> None:
    for _ in range(2):
        r = _send(rmq, _msg(b"once", "RETRIED-ID"))
        assert r.status.code == C.OK and r.entries[0].message_id == "RETRIED-ID"
    messages = [x for x in _receive(rmq) if x.WhichOneof("content") == "message"]
    assert [m.message.body for m in messages] == [b"once"]


def test_gzip_bodies_are_stored_plain(rmq: RocketMQEnv) -> None:
    body = b"compressible " * 1000
    r = _send(rmq, _msg(gzip.compress(body), "GZ", body_encoding=rd.GZIP))
    assert r.status.code == C.OK
    (m,) = [x.message for x in _receive(rmq) if x.WhichOneof("content") == "message"]
    assert m.body == body and m.system_properties.body_encoding == rd.IDENTITY
    bad = _send(rmq, _msg(b"not gzip", "GZ-BAD", body_encoding=rd.GZIP))
    assert bad.entries[0].status.code == C.MESSAGE_CORRUPTED


@pytest.mark.parametrize(("message", "code"), [
    (_msg(b"x", "F", message_group="g1", message_type=rd.FIFO),
     C.VERIFY_FIFO_MESSAGE_UNSUPPORTED),
    (_msg(b"x", "T", message_type=rd.TRANSACTION), C.UNSUPPORTED),
    (_msg(b"x", "D", message_type=rd.DELAY), C.ILLEGAL_DELIVERY_TIME),
    (_msg(b"x", "FAR", message_type=rd.DELAY,
          delivery_timestamp=Timestamp(seconds=4_000_000_000_000)), C.ILLEGAL_DELIVERY_TIME),
    (_msg(b"x", "NT", topic="nope"), C.TOPIC_NOT_FOUND),
    (_msg(b"x" * (65 << 10), "BIG"), C.MESSAGE_BODY_TOO_LARGE),
    (_msg(b"x", "TAG", tag="a||b"), C.ILLEGAL_MESSAGE_TAG),
    (_msg(b"x", "KEY", keys=["two words"]), C.ILLEGAL_MESSAGE_KEY),
    (_msg(b"x", "bad\nid"), C.ILLEGAL_MESSAGE_ID),
    (rd.Message(topic=rd.Resource(name="orders"), body=b"x",
                user_properties={"big": "v" * (65 << 10)},
                system_properties=rd.SystemProperties(message_id="PROPS")),
     C.MESSAGE_PROPERTIES_TOO_LARGE),
])
def test_refused_messages_get_a_clear_status_and_store_nothing(
        rmq: RocketMQEnv, message: Any, code: int) -> None:
    r = _send(rmq, message)
    assert r.status.code == r.entries[0].status.code == code
    assert r.status.message
    assert rmq.broker.store.statistics().messages_appended == 0


def test_receive_errors(rmq: RocketMQEnv) -> None:
    def status(**kw: Any) -> int:
        (only,) = _receive(rmq, **kw)
        return int(only.status.code)

    assert status() == C.MESSAGE_NOT_FOUND  # nothing there: an empty answer, not an error
    assert status(filter_type=rd.SQL, expression="a > 1") == C.ILLEGAL_FILTER_EXPRESSION
    assert status(expression="a ||") == C.ILLEGAL_FILTER_EXPRESSION
    assert status(topic="nope") == C.TOPIC_NOT_FOUND
    assert status(group="bad group") == C.ILLEGAL_CONSUMER_GROUP
    assert status(invisible_s=0) == C.ILLEGAL_INVISIBLE_TIME
    assert status(batch=0) == C.BAD_REQUEST


def test_long_poll_ends_before_the_client_deadline(rmq: RocketMQEnv) -> None:
    request = rs.ReceiveMessageRequest(
        group=rd.Resource(name="g"),
        message_queue=rd.MessageQueue(topic=rd.Resource(name="orders")),
        batch_size=1, invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=60))
    (only,) = list(rmq.stub.ReceiveMessage(request, timeout=1.5))  # no DEADLINE_EXCEEDED
    assert only.status.code == C.MESSAGE_NOT_FOUND


def test_settle_errors_and_dead_letter(rmq: RocketMQEnv) -> None:
    _send(rmq, _msg(b"poison", "POISON"))
    (m,) = [x.message for x in _receive(rmq) if x.WhichOneof("content") == "message"]
    handle = m.system_properties.receipt_handle
    group, topic = rd.Resource(name="g"), rd.Resource(name="orders")
    bad = rmq.stub.AckMessage(rs.AckMessageRequest(group=group, topic=topic, entries=[
        rs.AckMessageEntry(message_id="POISON", receipt_handle="garbage")]))
    assert bad.status.code == bad.entries[0].status.code == C.INVALID_RECEIPT_HANDLE
    foreign = rmq.stub.AckMessage(rs.AckMessageRequest(
        group=rd.Resource(name="other"), topic=topic,
        entries=[rs.AckMessageEntry(message_id="POISON", receipt_handle=handle)]))
    assert foreign.status.code == C.INVALID_RECEIPT_HANDLE  # issued to another group
    change = rmq.stub.ChangeInvisibleDuration(rs.ChangeInvisibleDurationRequest(
        group=group, topic=topic, receipt_handle=handle, message_id="POISON",
        invisible_duration=Duration(seconds=100_000)))
    assert change.status.code == C.ILLEGAL_INVISIBLE_TIME
    forward = rmq.stub.ForwardMessageToDeadLetterQueue(
        rs.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=handle, message_id="POISON",
            delivery_attempt=1, max_delivery_attempts=16))
    assert forward.status.code == C.OK
    (dead,) = [x.message for x in _receive(rmq, group="dlq-reader", topic="%DLQ%g%orders")
               if x.WhichOneof("content") == "message"]
    assert dead.body == b"poison"
    assert "forwarded by the client" in dead.user_properties["chronomq.dlq.reason"]


def test_unsupported_rpcs_answer_at_once(rmq: RocketMQEnv) -> None:
    answers = [
        rmq.stub.EndTransaction(rs.EndTransactionRequest(), timeout=5),
        rmq.stub.UpdateOffset(rs.UpdateOffsetRequest(), timeout=5),
        rmq.stub.GetOffset(rs.GetOffsetRequest(), timeout=5),
        rmq.stub.QueryOffset(rs.QueryOffsetRequest(), timeout=5),
        rmq.stub.SyncLiteSubscription(rs.SyncLiteSubscriptionRequest(), timeout=5),
        *rmq.stub.PullMessage(rs.PullMessageRequest(), timeout=5),
    ]
    assert [a.status.code for a in answers] == [C.UNSUPPORTED] * 6
    assert all("not supported" in a.status.message for a in answers)


def test_heartbeat_assignment_and_termination(rmq: RocketMQEnv) -> None:
    md = (("x-mq-client-id", "client-1"),)
    hb = rmq.stub.Heartbeat(rs.HeartbeatRequest(group=rd.Resource(name="g"),
                                                client_type=rd.SIMPLE_CONSUMER), metadata=md)
    assert hb.status.code == C.OK and "client-1" in rmq.running.server.rocketmq.clients
    a = rmq.stub.QueryAssignment(rs.QueryAssignmentRequest(
        topic=rd.Resource(name="orders"), group=rd.Resource(name="g")))
    assert a.status.code == C.OK and len(a.assignments) == 1
    bye = rmq.stub.NotifyClientTermination(
        rs.NotifyClientTerminationRequest(group=rd.Resource(name="g")), metadata=md)
    assert bye.status.code == C.OK and "client-1" not in rmq.running.server.rocketmq.clients


def test_front_is_off_unless_enabled(tmp_path: Any) -> None:
    from tests.conftest import RunningServer, broker_config
    srv = RunningServer(broker_config(tmp_path / "d"))
    try:
        assert srv.server.rocketmq_port == 0 and srv.server.rocketmq is None
    finally:
        srv.stop()


def test_unsigned_calls_are_refused_when_keys_are_set(tmp_path: Any) -> None:
    env = RocketMQEnv(tmp_path, access_key="app", secret_key="k")
    try:  # an answer, as RocketMQ's proxy gives it (tests/rocketmq/test_access.py)
        r = env.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders")))
        assert r.status.code == C.UNAUTHORIZED and not r.message_queues
    finally:
        env.close()


def test_tls_like_the_chronomq_api(tmp_path: Any) -> None:
    from tests.chronomq.test_grpc_api import _self_signed
    cert, key = _self_signed(tmp_path)
    env = RocketMQEnv(tmp_path, server={"tls_cert_file": str(cert),
                                        "tls_key_file": str(key)})
    try:
        r = env.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders")))
        assert r.status.code == C.OK
        with grpc.insecure_channel(env.endpoint) as plain:
            stub = service_grpc.MessagingServiceStub(plain)
            with pytest.raises(grpc.RpcError):
                stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders")),
                                timeout=2)
    finally:
        env.close()


def test_advertised_address_wins(tmp_path: Any) -> None:
    env = RocketMQEnv(tmp_path, advertise_address="mq.example.com:9876")
    try:
        asked = rd.Endpoints(scheme=rd.IPv4, addresses=[rd.Address(host="10.0.0.1", port=1)])
        r = env.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name="orders"),
                                                     endpoints=asked))
        endpoints = r.message_queues[0].broker.endpoints
        assert endpoints.scheme == rd.DOMAIN_NAME
        assert [(a.host, a.port) for a in endpoints.addresses] == [("mq.example.com", 9876)]
    finally:
        env.close()


def _receive_auto_renew(env: RocketMQEnv, client: str) -> list[Any]:
    request = rs.ReceiveMessageRequest(
        group=rd.Resource(name="pushers"),
        message_queue=rd.MessageQueue(topic=rd.Resource(name="orders")),
        filter_expression=rd.FilterExpression(type=rd.TAG, expression="*"),
        batch_size=16, auto_renew=True, long_polling_timeout=Duration(seconds=0))
    return [x.message for x in env.stub.ReceiveMessage(
        request, timeout=5, metadata=(("x-mq-client-id", client),))
        if x.WhichOneof("content") == "message"]


def test_auto_renew_keeps_a_message_while_its_client_lives(rmq: RocketMQEnv) -> None:
    _send(rmq, _msg(b"slow work", "SLOW"))
    (m,) = _receive_auto_renew(rmq, "push-1")
    assert m.system_properties.invisible_duration.seconds == 30  # the default
    issued = m.system_properties.receipt_handle
    heartbeat = rs.HeartbeatRequest(group=rd.Resource(name="pushers"))
    for _ in range(12):  # two minutes of work, far past the 30 s invisible time
        rmq.stub.Heartbeat(heartbeat, metadata=(("x-mq-client-id", "push-1"),))
        rmq.tick(10_000)
        assert _receive_auto_renew(rmq, "push-2") == []  # nobody else gets it
    assert rmq.running.server.rocketmq.figures()["rocketmq.renewing"] == 1
    ack = rmq.stub.AckMessage(rs.AckMessageRequest(
        group=rd.Resource(name="pushers"), topic=rd.Resource(name="orders"),
        entries=[rs.AckMessageEntry(message_id="SLOW", receipt_handle=issued)]))
    assert ack.status.code == C.OK  # the handle as issued still works
    assert rmq.running.server.rocketmq.figures()["rocketmq.renewing"] == 0
    rmq.tick(60_000)
    assert _receive_auto_renew(rmq, "push-2") == []


def test_auto_renew_stops_when_the_client_is_gone(rmq: RocketMQEnv) -> None:
    _send(rmq, _msg(b"orphan", "ORPHAN"))
    start = rmq.clock.now_ms()
    assert len(_receive_auto_renew(rmq, "push-1")) == 1
    got: list[Any] = []
    for _ in range(30):  # the client never calls again
        rmq.tick(10_000)
        got = _receive_auto_renew(rmq, "push-2")
        if got:
            break
    (again,) = got
    assert again.system_properties.delivery_attempt == 2
    # renewed until the client had been silent for CLIENT_GONE_MS, then left to run out
    assert rmq.clock.now_ms() - start >= CLIENT_GONE_MS + 10_000


def test_auto_renew_ends_after_an_hour(rmq: RocketMQEnv) -> None:
    _send(rmq, _msg(b"endless", "ENDLESS"))
    start = rmq.clock.now_ms()
    assert len(_receive_auto_renew(rmq, "push-1")) == 1
    got: list[Any] = []
    while not got and rmq.clock.now_ms() - start < 2 * MAX_RENEW_MS:
        rmq.stub.Heartbeat(rs.HeartbeatRequest(), metadata=(("x-mq-client-id", "push-1"),))
        rmq.tick(10_000)
        got = _receive_auto_renew(rmq, "push-2")
    assert len(got) == 1 and got[0].system_properties.delivery_attempt == 2
    assert MAX_RENEW_MS <= rmq.clock.now_ms() - start <= MAX_RENEW_MS + 60_000


def test_a_running_broker_renews_leases_every_second(tmp_path: Any) -> None:
    import dataclasses

    from chronomq.config import RocketMQConfig
    from tests.conftest import RunningServer, broker_config
    config = dataclasses.replace(broker_config(tmp_path / "d"), rocketmq=RocketMQConfig(
        enabled=True, host="127.0.0.1", port=0))
    srv = RunningServer(config)
    try:
        job = srv.server._scheduler.get_job("rocketmq-renew")  # type: ignore[union-attr]
        assert job is not None and job.trigger.interval.total_seconds() == 1
    finally:
        srv.stop()


@pytest.mark.parametrize("client_type", [rd.LITE_PUSH_CONSUMER, rd.LITE_SIMPLE_CONSUMER])
def test_lite_consumers_are_refused_with_a_reason(rmq: RocketMQEnv, client_type: int) -> None:
    """A lite consumer (rocketmq-a2a's reply path) learns at start-up that lite topics
    are not supported, instead of failing later on max_lite_topic_size = 0."""
    settings = rd.Settings(client_type=client_type, subscription=rd.Subscription(
        group=rd.Resource(name="replies")))
    (answer,) = list(rmq.stub.Telemetry(iter([rs.TelemetryCommand(settings=settings)]),
                                        timeout=5))
    assert answer.status.code == C.UNSUPPORTED
    assert "lite topics are not supported" in answer.status.message
    beat = rmq.stub.Heartbeat(rs.HeartbeatRequest(group=rd.Resource(name="replies"),
                                                  client_type=client_type))
    assert beat.status.code == C.UNSUPPORTED and "lite" in beat.status.message
    # other clients are untouched
    ok = rmq.stub.Heartbeat(rs.HeartbeatRequest(group=rd.Resource(name="replies"),
                                                client_type=rd.PUSH_CONSUMER))
    assert ok.status.code == C.OK


def test_settings_answer_waits_for_the_clients_route_queries(rmq: RocketMQEnv) -> None:
    """A client that sends its settings after its first route query, while it fetches the
    others, gets the answer once they are fetched (see chronomq.rocketmq.startup)."""
    import threading

    for name in ("t1", "t2"):
        rmq.broker.create_topic(Topic(name, 1))
    me = (("x-mq-client-id", "starting-1"),)

    def route(topic: str) -> None:
        answer = rmq.stub.QueryRoute(rs.QueryRouteRequest(topic=rd.Resource(name=topic)),
                                     metadata=me)
        assert answer.status.code == C.OK

    route("orders")
    settings = rd.Settings(client_type=rd.PRODUCER, publishing=rd.Publishing(
        topics=[rd.Resource(name=t) for t in ("orders", "t1", "t2")]))
    answered = threading.Event()

    def telemetry() -> None:
        list(rmq.stub.Telemetry(iter([rs.TelemetryCommand(settings=settings)]), timeout=10,
                                metadata=me))
        answered.set()

    waiter = threading.Thread(target=telemetry)
    waiter.start()
    assert not answered.wait(0.5)  # still fetching routes: held (for up to 3 s)
    route("t1")
    route("t2")
    assert answered.wait(2.0)
    waiter.join()
    # a client that has fetched no route yet is answered at once
    fresh = (("x-mq-client-id", "starting-2"),)
    t0 = time.monotonic()
    list(rmq.stub.Telemetry(iter([rs.TelemetryCommand(settings=settings)]), timeout=10,
                            metadata=fresh))
    assert time.monotonic() - t0 < 1.0


def test_per_key_flow_control_through_the_rocketmq_front(tmp_path: Path) -> None:
    """``max_in_flight_per_key`` holds a hot key for a RocketMQ consumer group too, while
    its other keys flow; an ack lets the hot key's next one out."""
    env = RocketMQEnv(tmp_path, key_limits={"g": KeyLimits(max_in_flight_per_key=1)})
    try:
        r = _send(env, *[_msg(b"hot-%d" % i, f"H{i}", keys=["hot"]) for i in range(5)],
                  *[_msg(b"cold", f"C{i}", keys=[f"cold-{i}"]) for i in range(5)])
        assert all(e.status.code == C.OK for e in r.entries)
        got = [x.message for x in _receive(env) if x.WhichOneof("content") == "message"]
        assert sorted(m.body for m in got) == [b"cold"] * 5 + [b"hot-0"]
        assert [x.message for x in _receive(env)
                if x.WhichOneof("content") == "message"] == []
        (hot,) = [m for m in got if m.body == b"hot-0"]
        ack = env.stub.AckMessage(rs.AckMessageRequest(
            group=rd.Resource(name="g"), topic=rd.Resource(name="orders"),
            entries=[rs.AckMessageEntry(message_id=hot.system_properties.message_id,
                                        receipt_handle=hot.system_properties.receipt_handle)]))
        assert ack.status.code == C.OK
        again = [x.message for x in _receive(env) if x.WhichOneof("content") == "message"]
        assert [m.body for m in again] == [b"hot-1"]
    finally:
        env.close()
