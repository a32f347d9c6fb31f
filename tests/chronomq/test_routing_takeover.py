"""Clients follow a topic away from a broker that was taken over and came back (issue 37).

Two broker processes on SeaweedFS's S3 with ``tier.failover``.  Broker A owns ``orders``;
it is paused (SIGSTOP) past its lease, B takes it over, then A is resumed (SIGCONT) and
learns at its next renewal that it was taken over: it still has ``orders`` on its disk,
and refuses every change with FAILED_PRECONDITION naming B.  A client given the
addresses ``[A, B]`` (A first) or the bucket must reach B for Send and Pop, and so must
the ``Producer`` and ``Consumer`` it makes: none stays pinned to A.  The brokers (and
their bucket) are started once for the module (each test changes only B).

Two quick tests without processes give ``BrokerDirectory`` brokers as a client sees them
(what ListTopics lists, what a call answers): one that still lists its former topic after
it was taken over (a broker of an older version) and one that mounts the topic.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from chronomq.config import load_config
from chronomq.providers import make_provider
from chronomq.v1 import broker_pb2 as pb
from testkit import seaweed
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.tiered.test_mount import _tier
from tiered.provider import Provider

LEASE_S = 2

slow = pytest.mark.slow


def _settings(endpoint: str, bucket: str, name: str) -> list[str]:
    return [*_tier(endpoint, bucket, name), "tier.upload=true", "tier.claim_topics=true",
            "tier.durable_ack=true", "tier.failover=true", f"tier.lease_s={LEASE_S}"]


@dataclass
class TakenOver:
    a: ServerProcess  # taken over, resumed: still has ``orders`` on its disk
    b: ServerProcess  # the owner now
    tier: Provider  # the bucket, as a client reads it
    sent: set[str]  # ids A answered OK before it was paused


@pytest.fixture(scope="module")
def taken_over(tmp_path_factory: pytest.TempPathFactory, seaweed_endpoint: str
               ) -> Iterator[TakenOver]:
    """A took ``orders`` and 5 messages, was paused until B took it over, and runs
    again knowing it was taken over (the module's tests share it: they change only B).
    Both processes are killed after the module, also when the setup fails, and before
    their bucket is deleted."""
    tmp = tmp_path_factory.mktemp("routing-takeover")
    with seaweed.bucket(seaweed_endpoint, __name__) as bucket:
        yield from _taken_over(tmp, seaweed_endpoint, bucket)


def _taken_over(tmp: Path, endpoint: str, bucket: str) -> Iterator[TakenOver]:
    a = ServerProcess(tmp / "a", *_settings(endpoint, bucket, "broker-a"))
    b: ServerProcess | None = None
    try:
        with ChronomqClient(a.target) as ca:
            ca.create_topic("orders", queue_count=2)
            out = ca.send([message("orders", f"before-{i}".encode()) for i in range(5)])
            assert all(o.ok for o in out)
        b = ServerProcess(tmp / "b", *_settings(endpoint, bucket, "broker-b"))
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            with ChronomqClient(b.target) as cb:
                wait_until(lambda: any(t.name == "orders" and t.taken_over_from == "broker-a"
                                       for t in cb.list_topics()), 60,
                           "B taking A's topic over while A is paused")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        with ChronomqClient(a.target) as ca:
            wait_until(lambda: ca.stats().get("lease.taken_over") == 1, 5 * LEASE_S,
                       "A learning at its renewal that it was taken over")
        tier = make_provider(load_config(None, _settings(endpoint, bucket, "client")))
        yield TakenOver(a, b, tier, {o.message_id for o in out})
    finally:
        for p in (a, b):
            if p is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)
                p.kill9()


def _by_addresses(t: TakenOver) -> RoutedClient:
    return RoutedClient(BrokerDirectory([t.a.target, t.b.target], timeout_s=5), follow_s=20)


def _by_bucket(t: TakenOver) -> RoutedClient:
    return RoutedClient(BrokerDirectory(tier=t.tier, timeout_s=5), follow_s=20)


@slow
def test_a_taken_over_broker_lists_none_of_its_former_topics(taken_over: TakenOver) -> None:
    with ChronomqClient(taken_over.a.target) as ca, ChronomqClient(taken_over.b.target) as cb:
        assert "orders" not in {t.name for t in ca.list_topics()}
        assert "orders" in {t.name for t in cb.list_topics()}


@slow
@pytest.mark.parametrize("directory", [_by_addresses, _by_bucket], ids=["addresses", "bucket"])
def test_routed_send_and_pop_reach_the_new_owner(
        taken_over: TakenOver, directory: Callable[[TakenOver], RoutedClient]) -> None:
    with directory(taken_over) as rc:
        (out,) = rc.send([message("orders", b"after")])
        assert out.ok, out.error
        assert rc.directory.locate("orders") == taken_over.b.target
        got = rc.pop("orders", f"g-{out.message_id}", 32, 30, 500)
        assert taken_over.sent <= {m.message_id for m in got}


@slow
def test_a_stale_owner_record_is_followed_through_the_leases(taken_over: TakenOver) -> None:
    """The bucket still names A as the owner (as while B's takeover has not rewritten the
    owner records yet): A's lease says B took it over, and B's lease gives its address."""
    record = "owners/orders.json"
    now = taken_over.tier.read(record)
    stale = {**json.loads(now), "broker": "broker-a", "address": taken_over.a.target}
    taken_over.tier.write(record, json.dumps(stale, sort_keys=True).encode())
    try:
        with _by_bucket(taken_over) as rc:
            (out,) = rc.send([message("orders", b"stale-record")])
            assert out.ok, out.error
            assert rc.directory.locate("orders") == taken_over.b.target
            assert rc.pop("orders", "g-stale", 32, 30, 500)
    finally:
        taken_over.tier.write(record, now)


@slow
def test_producer_and_consumer_reach_the_new_owner(taken_over: TakenOver) -> None:
    with _by_addresses(taken_over) as rc, \
            rc.consumer("orders", "g-stream") as consumer, \
            rc.producer("orders", delivery_timeout_s=15) as producer:
        futures = [producer.send("orders", f"p{i}".encode()) for i in range(20)]
        assert producer.flush(20)
        ok = {f.result().message_id for f in futures} | taken_over.sent
        seen: set[str] = set()
        while not ok <= seen and (m := consumer.receive(timeout_s=15)) is not None:
            seen.add(m.message_id)
            consumer.ack(m)
        assert ok <= seen, f"not consumed: {sorted(ok - seen)}"


class _SeenBroker:
    """A broker as ``BrokerDirectory`` sees it: the topics ListTopics lists, and a Pop
    answered with one message or refused with ``refusal`` (FAILED_PRECONDITION)."""

    def __init__(self, name: str, listed: list[pb.Topic], refusal: str = "") -> None:
        self.name, self.listed, self.refusal = name, listed, refusal

    def list_topics(self) -> list[pb.Topic]:
        return self.listed

    def pop(self, topic: str, group: str, *args: object) -> list[pb.ReceivedMessage]:
        if self.refusal:
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, self.refusal)
        return [pb.ReceivedMessage(topic=topic, message_id=f"from-{self.name}")]


def _directory(monkeypatch: pytest.MonkeyPatch, *brokers: _SeenBroker) -> BrokerDirectory:
    directory = BrokerDirectory([b.name for b in brokers])
    by_name = {b.name: b for b in brokers}
    monkeypatch.setattr(directory, "client", by_name.__getitem__)
    return directory


def test_an_older_taken_over_broker_that_still_lists_the_topic_is_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given A, taken over by B, still listing "orders" (older brokers do), and B listing it
    a = _SeenBroker("a", [pb.Topic(name="orders")], refusal="broker broker-a was taken "
                    "over by broker-b: its topics are served there now")
    b = _SeenBroker("b", [pb.Topic(name="orders", taken_over_from="broker-a")])
    rc = RoutedClient(_directory(monkeypatch, a, b), follow_s=5)
    # When a Pop is refused at A, the first broker listing the topic
    got = rc.pop("orders", "g")
    # Then it is answered at B, and A is not asked again
    assert [m.message_id for m in got] == ["from-b"]
    assert rc.directory.locate("orders") == "b"


def test_the_broker_owning_a_topic_comes_before_one_mounting_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mounting = _SeenBroker("m", [pb.Topic(name="orders", mounted_from="broker-o")])
    owning = _SeenBroker("o", [pb.Topic(name="orders")])
    assert _directory(monkeypatch, mounting, owning).locate("orders") == "o"
    assert _directory(monkeypatch, mounting).locate("orders") == "m"  # the only one
