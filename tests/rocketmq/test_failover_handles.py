"""A push consumer's ack across a failover (finding 7 of issue 51): the official RocketMQ
5 Python client's PushConsumer, brokers in this process with their RocketMQ fronts on
127.0.0.1, a real local-directory tier (durable-ack), RocksDB, a manual clock.

Broker A hands the message to the consumer (an ``auto_renew`` receive) and renews its
lease while the listener works, far past the receive's invisible time; then A is gone
and B takes it over, serving on A's address.  The client acks with the handle it was
given: B must accept it (the handle and the adopted lease are all an Ack needs), and the
message must not come again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
)

from chronomq.config import RocketMQConfig
from store.clock import ManualClock
from store.topics import Topic
from testkit.seaweed import free_ports
from testkit.wait import wait_until
from tests.conftest import RunningServer, broker_config
from tiered.config import TierConfig

INVISIBLE_MS = 30_000  # the front's default for a push consumer's receive
STEP_MS = 25_000  # each step leaves 5 s of the lease: the front renews it


def _server(root: Path, name: str, clock: ManualClock, port: int) -> RunningServer:
    config = dataclasses.replace(
        broker_config(root / name),
        rocketmq=RocketMQConfig(enabled=True, host="127.0.0.1", port=port),
        tier=TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                        upload=True, durable_ack=True, durable_ack_ms=1))
    running = RunningServer(config, clock, background=False)
    tiered = running.server.broker.tiered
    assert tiered is not None
    tiered.start()  # every OK waits for the tier: what A answered, B finds
    return running


class _Blocking(MessageListener):  # type: ignore[misc]
    """Holds each message until ``release`` is set (a listener at work), then succeeds."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.release = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        self.seen.append((message.message_id, message.delivery_attempt))
        self.release.wait(60)
        return ConsumeResult.SUCCESS


def _at_the_listener(a: RunningServer, config: ClientConfiguration, consumer: PushConsumer,
                     listener: _Blocking) -> str:
    """One message sent to topic ``orders`` at A, then at the push consumer's listener
    (which holds it); its id."""
    a.server.broker.create_topic(Topic("orders", 2))
    producer = Producer(config, ("orders",))
    producer.startup()
    m = Message()
    m.topic, m.body = "orders", b"slow work"
    sent: str = producer.send(m).message_id
    producer.shutdown()
    consumer.startup()
    wait_until(lambda: listener.seen, 30, "the message at the listener", poll_s=0.05)
    return sent


def test_a_push_consumers_ack_after_a_failover_is_accepted(tmp_path: Path) -> None:
    clock = ManualClock(int(time.time() * 1000))  # the client stamps with its own clock
    (port,) = free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    config = ClientConfiguration(endpoint, Credentials("", ""), request_timeout=5)
    a: RunningServer | None = _server(tmp_path, "a", clock, port)
    assert a is not None
    b: RunningServer | None = None
    listener = _Blocking()
    consumer = PushConsumer(config, "pushers", listener, {"orders": FilterExpression()})
    try:
        # Given a message the push consumer's listener works on at A, its lease renewed
        # by A's front for 75 s (the receive's invisible time is 30 s)
        sent = _at_the_listener(a, config, consumer, listener)
        front = a.server.rocketmq
        for _ in range(3):
            assert front.renew_leases(clock.advance(STEP_MS)) == 1
        # When A is gone and B takes it over on A's address
        a.stop()
        a = None
        b = _server(tmp_path, "b", clock, port)
        assert b.server.broker.takeover("a", force=True).done
        # Then the listener's ack (with the handle it was given, 45 s past that handle's
        # deadline) is accepted by B
        listener.release.set()
        acked = wait_until(lambda: b.server.rocketmq.figures()["rocketmq.acked"], 30,
                           "the client's ack at B", poll_s=0.05)
        assert acked == 1
        # and the message does not come again after its lease would have run out
        now = clock.advance(2 * INVISIBLE_MS)
        b.server.broker.pop.revive_due(now)
        b.server.broker.store.wait_visible()
        time.sleep(2)  # the consumer's receives go on meanwhile
        assert listener.seen == [(sent, 1)]
        assert b.server.broker.pop.pop("orders", "pushers", 16, 30) == []
    finally:
        listener.release.set()
        consumer.shutdown()
        for running in (a, b):
            if running is not None:
                running.stop()


def test_a_push_consumers_lease_goes_on_renewing_after_a_failover(tmp_path: Path) -> None:
    clock = ManualClock(int(time.time() * 1000))
    (port,) = free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    config = ClientConfiguration(endpoint, Credentials("", ""), request_timeout=5)
    a: RunningServer | None = _server(tmp_path, "a", clock, port)
    assert a is not None
    b: RunningServer | None = None
    listener = _Blocking()
    consumer = PushConsumer(config, "pushers", listener, {"orders": FilterExpression()})
    try:
        # Given a message the push consumer's listener works on at A, renewed once there
        sent = _at_the_listener(a, config, consumer, listener)
        assert a.server.rocketmq.renew_leases(clock.advance(STEP_MS)) == 1
        # When A is gone and B takes it over on A's address, and hears of the client
        a.stop()
        a = None
        b = _server(tmp_path, "b", clock, port)
        assert b.server.broker.takeover("a", force=True).done
        front = b.server.rocketmq
        wait_until(lambda: front.figures()["rocketmq.clients"], 30, "the client heard at B",
                   poll_s=0.05)
        # Then B goes on renewing the lease while the listener works (A's renewal list
        # came with its leases), for three invisible times and more
        renewals = [front.renew_leases(clock.advance(STEP_MS)) for _ in range(4)]
        assert renewals == [1, 1, 1, 1]
        now = clock.advance(STEP_MS - 1_000)  # the last renewal's lease still runs
        b.server.broker.pop.revive_due(now)
        b.server.broker.store.wait_visible()
        assert b.server.broker.pop.pop("orders", "pushers", 16, 30) == []
        assert listener.seen == [(sent, 1)]  # not handed out again
        # and the ack ends it: no more renewals, nothing comes again
        listener.release.set()
        wait_until(lambda: front.figures()["rocketmq.acked"], 30, "the client's ack at B",
                   poll_s=0.05)
        assert front.renew_leases(clock.advance(STEP_MS)) == 0
        assert front.figures()["rocketmq.renewing"] == 0
        b.server.broker.pop.revive_due(clock.advance(2 * INVISIBLE_MS))
        b.server.broker.store.wait_visible()
        assert b.server.broker.pop.pop("orders", "pushers", 16, 30) == []
        assert listener.seen == [(sent, 1)]
    finally:
        listener.release.set()
        consumer.shutdown()
        for running in (a, b):
            if running is not None:
                running.stop()
