"""The official RocketMQ 5 Python client (rocketmq-python-client from PyPI) against the
RocketMQ front on 127.0.0.1: Producer, SimpleConsumer, delayed messages, recall."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.v5.exception import BadRequestException, NotFoundException

from testkit.wait import wait_until
from tests.rocketmq.conftest import RocketMQEnv

DELAY = 3  # rocketmq MessageType.DELAY
NORMAL = 1


def _config(env: RocketMQEnv, ak: str = "", sk: str = "") -> ClientConfiguration:
    return ClientConfiguration(env.endpoint, Credentials(ak, sk), request_timeout=5)


@pytest.fixture
def producer(rmq: RocketMQEnv) -> Iterator[Producer]:
    p = Producer(_config(rmq), ("orders",))
    p.startup()
    yield p
    p.shutdown()


def _consumer(env: RocketMQEnv, group: str = "workers", expression: str = "*",
              topic: str = "orders", ak: str = "", sk: str = "") -> SimpleConsumer:
    c = SimpleConsumer(_config(env, ak, sk), group, {topic: FilterExpression(expression)},
                       await_duration=1)
    c.startup()
    return c


@pytest.fixture
def consumer(rmq: RocketMQEnv) -> Iterator[SimpleConsumer]:
    c = _consumer(rmq)
    yield c
    c.shutdown()


def _message(body: bytes, tag: str = "", keys: str = "", deliver_at_ms: int = 0,
             **props: str) -> Message:
    m = Message()
    m.topic = "orders"
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    if deliver_at_ms:
        m.delivery_timestamp = deliver_at_ms
    for k, v in props.items():
        m.add_property(k, v)
    return m


def test_send_receive_change_and_ack(rmq: RocketMQEnv, producer: Producer,
                                     consumer: SimpleConsumer) -> None:
    receipt = producer.send(_message(b"hello", tag="paid", keys="order-1", region="eu"))
    got = consumer.receive(16, 30)
    assert len(got) == 1
    m = got[0]
    assert (m.message_id, m.body, m.tag, m.keys, m.properties) == (
        receipt.message_id, b"hello", "paid", {"order-1"}, {"region": "eu"})
    assert m.delivery_attempt == 1 and m.message_type == NORMAL and not m.corrupted
    assert m.topic == "orders" and m.receipt_handle
    first_handle = m.receipt_handle
    consumer.change_invisible_duration(m, 60)
    assert m.receipt_handle and m.receipt_handle != first_handle
    rmq.tick(31_000)  # past the first invisible time, inside the changed one
    assert consumer.receive(16, 30) == []
    consumer.ack(m)
    rmq.tick(60_000)
    assert consumer.receive(16, 30) == []  # acknowledged: never comes back
    # the message is the chronomq API's too: another group pops it there
    with rmq.running.client() as native:
        assert [x.body for x in native.pop("orders", "audit")] == [b"hello"]


def test_delayed_message_arrives_at_its_time_as_delay(rmq: RocketMQEnv, producer: Producer,
                                                      consumer: SimpleConsumer) -> None:
    due = rmq.clock.now_ms() + 60_000
    receipt = producer.send(_message(b"later", deliver_at_ms=due))
    assert receipt.recall_handle
    assert consumer.receive(16, 30) == []
    rmq.tick(59_000)
    assert consumer.receive(16, 30) == []  # never early
    now = rmq.tick(1_000)
    (m,) = consumer.receive(16, 30)
    assert (m.message_id, m.body, m.message_type) == (receipt.message_id, b"later", DELAY)
    assert m.delivery_timestamp == due <= now
    consumer.ack(m)


def test_unacked_message_comes_back_with_attempt_two(rmq: RocketMQEnv, producer: Producer,
                                                     consumer: SimpleConsumer) -> None:
    receipt = producer.send(_message(b"retry me"))
    (first,) = consumer.receive(16, 10)
    assert first.delivery_attempt == 1
    rmq.tick(9_000)
    assert consumer.receive(16, 10) == []
    rmq.tick(1_000)
    (again,) = consumer.receive(16, 10)
    assert (again.message_id, again.body, again.delivery_attempt) == (
        receipt.message_id, b"retry me", 2)
    with pytest.raises(BadRequestException):
        consumer.ack(first)  # the first lease's handle is spent
    consumer.ack(again)
    rmq.tick(11_000)
    assert consumer.receive(16, 10) == []


def test_recall_cancels_a_delayed_message(rmq: RocketMQEnv, producer: Producer,
                                          consumer: SimpleConsumer) -> None:
    due = rmq.clock.now_ms() + 3_600_000
    receipt = producer.send(_message(b"cancel me", deliver_at_ms=due))
    keep = producer.send(_message(b"keep me", deliver_at_ms=due))
    with pytest.raises(NotFoundException):  # the handle names a message of "orders" only
        producer.recall_message("other", receipt.recall_handle)
    assert producer.recall_message("orders", receipt.recall_handle) == receipt.message_id
    with pytest.raises(NotFoundException):
        producer.recall_message("orders", receipt.recall_handle)
    rmq.tick(3_600_000)
    got = consumer.receive(16, 30)
    assert [(m.message_id, m.body) for m in got] == [(keep.message_id, b"keep me")]
    consumer.ack(got[0])
    with pytest.raises(BadRequestException):  # delivered: too late to recall
        producer.recall_message("orders", keep.recall_handle)


def test_tag_expression_filters(rmq: RocketMQEnv, producer: Producer) -> None:
    for tag in ("a", "b", "c", ""):
        producer.send(_message(f"tag {tag}".encode(), tag=tag))
    c = _consumer(rmq, group="ab", expression="a || b")
    try:
        got = c.receive(16, 30)
        assert sorted(m.tag for m in got) == ["a", "b"]
    finally:
        c.shutdown()


def test_access_key_signatures(tmp_path: Path) -> None:
    env = RocketMQEnv(tmp_path, access_key="app", secret_key="s3cret")
    try:
        good = Producer(_config(env, "app", "s3cret"), ("orders",))
        good.startup()
        try:
            assert good.send(_message(b"signed")).message_id
        finally:
            good.shutdown()
        bad = Producer(_config(env, "app", "wrong"), ("orders",))
        bad.startup()
        try:
            with pytest.raises(Exception, match="route"):  # QueryRoute was refused
                bad.send(_message(b"forged"))
        finally:
            bad.shutdown()
        c = _consumer(env, ak="app", sk="s3cret")
        try:
            assert [m.body for m in c.receive(16, 30)] == [b"signed"]
        finally:
            c.shutdown()
    finally:
        env.close()


def test_many_messages_each_once(rmq: RocketMQEnv, producer: Producer,
                                 consumer: SimpleConsumer) -> None:
    sent = {producer.send(_message(f"m{i}".encode())).message_id for i in range(100)}
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while seen != sent and time.monotonic() < deadline:
        for m in consumer.receive(32, 30):
            assert m.message_id not in seen
            seen.add(m.message_id)
            consumer.ack(m)
    assert seen == sent
    with rmq.running.client() as native:
        figures = native.stats()
    assert (figures["rocketmq.sent"], figures["rocketmq.received"],
            figures["rocketmq.acked"]) == (100, 100, 100)
    assert figures["rocketmq.clients"] >= 2  # this producer and consumer


class _Collect(MessageListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def consume(self, message: Message) -> ConsumeResult:
        self.seen.append((message.message_id, message.delivery_attempt))
        return ConsumeResult.SUCCESS


def test_push_consumer(rmq: RocketMQEnv, producer: Producer) -> None:
    listener = _Collect()
    c = PushConsumer(_config(rmq), "pushers", listener, {"orders": FilterExpression()})
    c.startup()
    try:
        sent = sorted(producer.send(_message(f"p{i}".encode())).message_id for i in range(20))
        wait_until(lambda: len(listener.seen) >= len(sent), 30,
                   f"{len(sent)} messages to the push consumer", show=lambda: len(listener.seen),
                   poll_s=0.05)
        assert sorted(listener.seen) == [(mid, 1) for mid in sent]
    finally:
        c.shutdown()
    with rmq.running.client() as native:
        assert native.stats()["rocketmq.acked"] == len(sent)
