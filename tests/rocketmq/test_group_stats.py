"""Group statistics after every way a message can be settled: unary Pop + Ack, Subscribe,
the Consumer iterator, ChangeInvisibleTime then Ack, Nack, and the RocketMQ front's Ack
(plain and auto-renewed leases).  A group that has acked everything shows nothing in
flight, no backlog and no lag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration

from chronomq.client import ChronomqClient, message
from chronomq.client.consumer import Consumer
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from tests.conftest import RunningServer
from tests.rocketmq.conftest import RocketMQEnv

SETTLED = {"in_flight": 0, "backlog": 0, "lag": 0}


def _group(c: ChronomqClient, group: str, topic: str) -> dict[str, int]:
    stats = c.stats()
    return {k: int(stats[f"group.{group}.{topic}.{k}"]) for k in SETTLED}


def test_every_chronomq_ack_path_leaves_the_group_settled(server: RunningServer) -> None:
    with server.client() as c:
        c.create_topic("t", queue_count=4)
        c.send([message("t", b"x", tag="a" if i % 2 else "b") for i in range(300)])
        while got := c.pop("t", "unary", 32, 30, 0):
            c.ack("unary", [m.receipt_handle for m in got])
        while got := c.pop("t", "tagged", 32, 30, 0, "a"):
            c.ack("tagged", [m.receipt_handle for m in got])
        with c.subscribe("t", "sub", invisible_time_s=30, max_outstanding=64) as sub:
            handled = 0
            for response in sub.responses():
                sub.ack([m.receipt_handle for m in response.messages])
                handled += len(response.messages)
                if handled >= 300:
                    break
        with Consumer(c, "t", "iter", prefetch=64) as consumer:
            for n, m in enumerate(consumer, 1):
                consumer.ack(m).result(10)
                if n == 300:
                    break
        got = c.pop("t", "changed", 32, 30, 0)
        moved = c.change_invisible_time("changed", got[0].receipt_handle, 60)
        assert c.ack("changed", [moved, *(m.receipt_handle for m in got[1:])]) == [""] * 32
        got = c.pop("t", "nacked", 32, 30, 0)
        assert c.nack("nacked", [got[0].receipt_handle], delay_ms=0) == [""]
        c.ack("nacked", [m.receipt_handle for m in got[1:]])
        for group in ("changed", "nacked"):
            while more := c.pop("t", group, 32, 30, 0):
                c.ack(group, [m.receipt_handle for m in more])
        for group in ("unary", "tagged", "sub", "iter", "changed", "nacked"):
            assert _group(c, group, "t") == SETTLED, group
        # one message still held (its lease extended), everything after it acked: lag
        # counts that one, not every settled message after it (seen: lag 252, 1 in flight)
        got = c.pop("t", "held", 32, 30, 0)
        c.change_invisible_time("held", got[0].receipt_handle, 600)
        c.ack("held", [m.receipt_handle for m in got[1:]])
        while more := c.pop("t", "held", 32, 30, 0):
            c.ack("held", [m.receipt_handle for m in more])
        assert _group(c, "held", "t") == {"in_flight": 1, "backlog": 0, "lag": 1}


def _receive(env: RocketMQEnv, auto_renew: bool) -> list[Any]:
    request = rs.ReceiveMessageRequest(
        group=rd.Resource(name="rmq"), message_queue=rd.MessageQueue(
            topic=rd.Resource(name="orders")),
        filter_expression=rd.FilterExpression(type=rd.TAG, expression="*"),
        batch_size=32, invisible_duration=Duration(seconds=30), auto_renew=auto_renew,
        long_polling_timeout=Duration(seconds=0))
    return [x.message for x in env.stub.ReceiveMessage(
        request, timeout=5, metadata=(("x-mq-client-id", "c1"),))
        if x.WhichOneof("content") == "message"]


def test_rocketmq_acks_leave_the_group_settled(tmp_path: Path) -> None:
    env = RocketMQEnv(tmp_path)
    try:
        with env.running.client() as c:
            c.send([message("orders", b"x") for _ in range(100)])
            for auto_renew in (False, True, True):
                got = _receive(env, auto_renew)
                assert got
                if auto_renew:  # leases renewed by the front before the ack
                    env.stub.Heartbeat(rs.HeartbeatRequest(group=rd.Resource(name="rmq")),
                                       metadata=(("x-mq-client-id", "c1"),))
                    env.tick(25_000)
                ack = env.stub.AckMessage(rs.AckMessageRequest(
                    group=rd.Resource(name="rmq"), topic=rd.Resource(name="orders"),
                    entries=[rs.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle) for m in got]))
                assert ack.status.code == rd.Code.OK
            while got := _receive(env, False):
                env.stub.AckMessage(rs.AckMessageRequest(
                    group=rd.Resource(name="rmq"), topic=rd.Resource(name="orders"),
                    entries=[rs.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle) for m in got]))
            assert _group(c, "rmq", "orders") == SETTLED
    finally:
        env.running.stop()
