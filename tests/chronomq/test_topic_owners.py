"""Two brokers sharing one S3 bucket (moto's server) with ``tier.claim_topics``: a topic
lives on the broker that claimed it first in the shared tier; the other refuses to
create it and names the owner; deleting releases it; a restart keeps the claim."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import grpc
import pytest

from chronomq.client import RpcError, message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from chronomq.config import RocketMQConfig
from chronomq.providers import make_provider
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from chronomq.rocketmq.pb import service_grpc
from testkit.process import wait_tier_caught_up
from tests.conftest import RunningServer, broker_config, tier_config


def _broker(tmp_path: Path, request: pytest.FixtureRequest, name: str, node: int,
            rocketmq: bool = False) -> RunningServer:
    tier = dataclasses.replace(tier_config("s3", tmp_path, request, "owners"),
                               broker_name=name, claim_topics=True)
    config = broker_config(tmp_path / name)
    config = dataclasses.replace(
        config, tier=tier, store=dataclasses.replace(config.store, node_id=node),
        rocketmq=RocketMQConfig(enabled=rocketmq, host="127.0.0.1", port=0))
    return RunningServer(config)


def test_one_owner_per_topic_across_brokers(tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    a = _broker(tmp_path, request, "broker-a", 1)
    b = _broker(tmp_path, request, "broker-b", 2)
    try:
        with a.client() as ca, b.client() as cb:
            assert ca.create_topic("orders")
            with pytest.raises(RpcError) as refused:
                cb.create_topic("orders")
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "broker-a" in refused.value.details and a.target in refused.value.details
            assert [t.name for t in cb.list_topics()] == []  # nothing created on b
            assert cb.create_topic("payments")
            with pytest.raises(RpcError):
                ca.create_topic("payments")
            assert ca.create_topic("orders") is False  # again on its owner: exists
            ca.delete_topic("orders")
            assert cb.create_topic("orders")  # released: b may take it
        # a restart claims its topics again (they stay b's)
        b.stop()
        b = _broker(tmp_path, request, "broker-b", 2)
        assert b.server.broker.mounts.owners is not None
        assert b.server.broker.mounts.owners.owner("payments").address == b.target
        with a.client() as ca, pytest.raises(RpcError):
            ca.create_topic("payments")
    finally:
        a.stop()
        b.stop()


def test_claims_need_explicit_topic_creation(tmp_path: Path) -> None:
    from chronomq.config import load_config
    from store.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="auto_create_topics"):
        load_config(None, ["tier.claim_topics=true", "store.auto_create_topics=true"])


@pytest.mark.parametrize("find_by", ["addresses", "bucket"])
def test_one_client_over_two_brokers(tmp_path: Path, request: pytest.FixtureRequest,
                                     find_by: str) -> None:
    """A client given both brokers' addresses (or the bucket) sends, pops, acks and
    subscribes on each topic at its owner; a topic moved to the other broker is found
    again; the RocketMQ front's QueryRoute sends clients to the owner's front."""
    a = _broker(tmp_path, request, "broker-a", 1, rocketmq=True)
    b = _broker(tmp_path, request, "broker-b", 2, rocketmq=True)
    try:
        with a.client() as ca, b.client() as cb:
            ca.create_topic("orders")
            cb.create_topic("payments")
        directory = (BrokerDirectory([a.target, b.target]) if find_by == "addresses" else
                     BrokerDirectory(tier=make_provider(a.config)))
        with RoutedClient(directory) as rc:
            out = rc.send([message("orders", b"o1"), message("payments", b"p1"),
                           message("orders", b"o2")])
            assert all(o.ok for o in out) and len({o.message_id for o in out}) == 3
            assert directory.locate("orders") == a.target
            assert directory.locate("payments") == b.target
            got = rc.pop("orders", "g", 10, 30, 0)
            assert sorted(m.body for m in got) == [b"o1", b"o2"]
            assert rc.ack("orders", "g", [m.receipt_handle for m in got]) == ["", ""]
            with rc.subscribe("payments", "g") as sub:
                (response,) = [next(iter(sub.responses()))]
                assert [m.body for m in response.messages] == [b"p1"]
                sub.ack([m.receipt_handle for m in response.messages])
            with a.client() as ca:
                assert [m.message_id for m in ca.query("orders", message_id=out[0].message_id)]
            # "orders" moves: deleted on a, created on b; the client finds it there
            with a.client() as ca, b.client() as cb:
                ca.delete_topic("orders")
                cb.create_topic("orders")
            assert rc.send([message("orders", b"o3")])[0].ok
            assert directory.locate("orders") == b.target
            # a topic no broker has, every broker answering, is NOT_FOUND at once (it
            # waited out the 30 s of follow_s, as if a failover were moving it)
            started = time.monotonic()
            with pytest.raises(RpcError) as missing:
                rc.pop("nowhere", "g")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND
            assert time.monotonic() - started < rc.follow_s / 3
        # the RocketMQ front of a answers QueryRoute for b's topic with b's front
        with grpc.insecure_channel(f"127.0.0.1:{a.server.rocketmq_port}") as channel:
            route = service_grpc.MessagingServiceStub(channel).QueryRoute(
                rs.QueryRouteRequest(topic=rd.Resource(name="payments")))
        assert route.status.code == rd.Code.OK
        (address,) = route.message_queues[0].broker.endpoints.addresses
        assert (address.host, address.port) == ("127.0.0.1", b.server.rocketmq_port)
        assert route.message_queues[0].broker.name == "broker-b"
    finally:
        a.stop()
        b.stop()


def test_a_topic_no_answering_broker_has_is_followed_while_one_is_away(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Given a client over a broker that answers and an address where none does (a
    # broker down: the topic may be on it, or a failover moving it)
    a = _broker(tmp_path, request, "broker-a", 1)
    try:
        with a.client() as ca:
            ca.create_topic("orders")
        directory = BrokerDirectory([a.target, "127.0.0.1:1"])
        with RoutedClient(directory, follow_s=1.0) as rc:
            # When a call names a topic neither has
            started = time.monotonic()
            with pytest.raises(RpcError) as missing:
                rc.pop("payments", "g")
            # Then it looked for the topic for follow_s before NOT_FOUND, saying why
            assert time.monotonic() - started >= 1.0
            assert missing.value.code == grpc.StatusCode.NOT_FOUND
            assert "did not answer" in missing.value.details
            # and a topic the answering broker has is still served at once
            assert rc.pop("orders", "g") == []
    finally:
        a.stop()


def test_a_mount_takes_over_a_departed_brokers_topics(tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    """Broker A owns "orders" and uploads it, then leaves; broker B mounts A's tier and
    becomes the owner in the bucket, so a client that looks owners up there reads
    A's messages from B."""
    first = _broker(tmp_path, request, "broker-a", 1)
    first.stop()
    tier_a = dataclasses.replace(first.config.tier, upload=True, upload_batch_ms=50)
    a = RunningServer(dataclasses.replace(first.config, tier=tier_a))
    with a.client() as ca:
        ca.create_topic("orders")
        ids = [o.message_id for o in ca.send([message("orders", b"x%d" % i)
                                              for i in range(20)])]
        wait_tier_caught_up(ca)
    a.stop()  # gone
    b = _broker(tmp_path, request, "broker-b", 2)
    try:
        owners = b.server.broker.mounts.owners
        assert owners is not None and owners.owner("orders").broker == "broker-a"
        with b.client() as cb:
            assert cb.mount("broker-a") == ["orders"]
        assert owners.owner("orders") == dataclasses.replace(
            owners.owner("orders"), broker="broker-b", address=b.target)
        with RoutedClient(BrokerDirectory(tier=make_provider(b.config))) as rc:
            got = rc.pop("orders", "g", 32, 30, 0)
            assert sorted(m.message_id for m in got) == sorted(ids)
            assert not rc.send([message("orders", b"new")])[0].ok  # read-only
    finally:
        b.stop()


def test_a_topic_auto_created_by_a_send_is_claimed(tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    # Given two brokers on one bucket that create topics on their first send
    def auto(name: str, node: int) -> RunningServer:
        server = _broker(tmp_path, request, name, node)
        config = server.server.config
        server.stop()
        return RunningServer(dataclasses.replace(config, store=dataclasses.replace(
            config.store, auto_create_topics=True)))

    a = auto("broker-a", 1)
    b = auto("broker-b", 2)
    try:
        with a.client() as ca, b.client() as cb:
            # When a send to a new topic creates it on a
            assert ca.send_one("fresh", b"first")
            # Then a owns it in the shared tier: b refuses to create it, and b's sends to
            # it are refused naming a (two brokers never both accept sends for one topic)
            with pytest.raises(RpcError) as refused:
                cb.create_topic("fresh")
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "broker-a" in refused.value.details
            with pytest.raises(RpcError) as sent:
                cb.send_one("fresh", b"second")
            assert "broker-a" in sent.value.details
            assert [t.name for t in cb.list_topics()] == []
    finally:
        a.stop()
        b.stop()
