"""A broker taken over serves again under its name (``cluster.rejoin``), on real brokers in
one process, a real local-directory tier and RocksDB, with ``tier.durable_ack``.

Broker A answers OK to sends, then B takes it over (A paused or partitioned, or its
machine lost).  Restarted with its data directory, or with an empty one, A used to exit
("start this broker with an empty data directory under a new tier.broker_name"; "holds
none of it"): a crash loop under a supervisor with fixed names.  Now it starts as a new
incarnation (tier prefix ``a--1``), its old data set aside, and serves again; every send
it answered OK, in either life, is at the broker that took that life over.  The slow
tier at start and the whole story on SeaweedFS with broker processes are in
``tests/chronomq/test_restart_taken_over.py``.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronomq.broker import Broker
from chronomq.client import ChronomqClient, RpcError
from chronomq.config import BrokerConfig, load_config
from chronomq.server import BrokerServer
from cluster.layout import catalogue_path, lease_path
from cluster.lease import claim, read_lease, successor
from cluster.rejoin import read_incarnation
from store.clock import ManualClock
from store.errors import FailedPrecondition
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from tests.tiered.test_tiered_pop import _pop_all
from tiered.config import TierConfig


def _broker(root: Path, name: str, clock: ManualClock, data: str = "") -> Broker:
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1, upload_timeout_s=10,
                      rejoin_timeout_s=5)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / (data or name))), tier=tier), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    b.tiered.start()
    return b


def _send(b: Broker, topic: str, mids: list[str]) -> None:
    """Sends as the gRPC front makes them: submitted, then ``stored`` (the OK)."""
    now = b.clock.now_ms()
    b.sender.stored(b.sender.submit([Draft(m, topic, "", "", m.encode(), b"", now, now, 0)
                                     for m in mids], now))


@pytest.mark.parametrize("disk", ["its data directory", "an empty data directory"])
def test_a_broker_taken_over_restarts_under_its_name_and_serves_again(
        disk: str, tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given A answered OK to sends of t, then B took it over while A was away
    a = _broker(tmp_path, "a", manual_clock)
    a.create_topic(Topic("t", 1))
    first = [f"first-{i}" for i in range(5)]
    _send(a, "t", first)
    a.stop()
    b = _broker(tmp_path, "b", manual_clock)
    again: Broker | None = None
    try:
        assert b.takeover("a", force=True).done
        # When A starts again under its name
        again = _broker(tmp_path, "a", manual_clock,
                        data="a" if disk == "its data directory" else "a-new-machine")
        # Then it runs as incarnation 1 under a prefix of its own, and serves
        assert again.incarnation == 1 and again.prefix == "a--1"
        view, _ = read_lease(again.tier, "a--1")
        assert view is not None and (view.name, view.incarnation) == ("a", 1)
        old, _ = read_lease(again.tier, "a")
        assert old is not None and old.taken_by == "b"  # its old life stays B's
        assert again.topic("t") is None  # t is B's now
        again.create_topic(Topic("t2", 1))
        second = [f"second-{i}" for i in range(5)]
        _send(again, "t2", second)
        assert again.tier.exists(catalogue_path("a--1"))
        assert not again.tier.list("a/meta/t2/")  # nothing written under the old prefix
        data = tmp_path / ("a" if disk == "its data directory" else "a-new-machine")
        assert read_incarnation(str(data)) == 1
        if disk == "its data directory":  # set aside, not deleted
            assert (data / "incarnations" / "0" / "commitlog").is_dir()
        # and every OK of its first life is at B
        assert sorted(_pop_all(b, "g")) == sorted(first)
        # When its second life is taken over too, by B: nothing of it is lost either
        again.stop()
        again = None
        assert sorted(b.takeover("a--1", force=True).topics) == ["t2"]
        got = []
        while batch := b.pop.pop("t2", "g", 32, 60):
            got += [p.message.message_id for p in batch]
            b.pop.ack_many("g", [p.receipt_handle for p in batch])
        assert sorted(got) == sorted(second)
    finally:
        b.stop()
        if again is not None:
            again.stop()


def test_an_empty_broker_under_a_name_nobody_took_over_says_what_to_run(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """Without tier.failover nobody takes a lost broker over by itself: an empty broker
    under its name refuses, names the command, and leaves the lease alone; once the
    takeover ran it starts (was: refused for good under that name)."""
    a = _broker(tmp_path, "a", manual_clock)
    a.create_topic(Topic("t", 1))
    _send(a, "t", ["m"])
    a.stop()
    lease_before = a.tier.read_versioned(lease_path("a"))
    with pytest.raises(FailedPrecondition, match="`chronomq takeover a`"):
        _broker(tmp_path, "a", manual_clock, data="a-new-machine")
    assert a.tier.read_versioned(lease_path("a")) == lease_before
    b = _broker(tmp_path, "b", manual_clock)
    try:
        b.takeover("a", force=True)
        again = _broker(tmp_path, "a", manual_clock, data="a-new-machine")
        assert again.prefix == "a--1"
        again.stop()
        assert _pop_all(b, "g") == ["m"]
    finally:
        b.stop()


def test_a_broker_in_a_later_life_takes_over_under_its_prefix(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """A broker's later incarnation that takes another over claims it, records the chain
    and is followed under its prefix (``a--1``), not its name (whose lease and tier are
    its first life's): a broker taking the later life over finds what it had taken."""
    a = _broker(tmp_path, "a", manual_clock)
    a.stop()
    b = _broker(tmp_path, "b", manual_clock)
    c = _broker(tmp_path, "c", manual_clock)
    c.create_topic(Topic("t", 1))
    _send(c, "t", ["from-c"])
    c.stop()
    again: Broker | None = None
    try:
        b.takeover("a", force=True)
        again = _broker(tmp_path, "a", manual_clock)
        assert again.prefix == "a--1"
        again.takeover("c", force=True)
        view = successor(again.tier, "c")
        assert view is not None and view.broker == "a--1"  # clients of c come to a--1
        assert again.tier.list("a--1/takeovers/")  # the chain, under its own prefix
        _send(again, "t", ["at-a--1"])
        again.stop()
        again = None
        b.takeover("a--1", force=True)  # its successor serves c's backlog too
        assert sorted(_pop_all(b, "g")) == ["at-a--1", "from-c"]
    finally:
        b.stop()
        if again is not None:
            again.stop()


def test_a_local_tier_inside_the_data_directory_stays_where_it_is(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """Setting a broker's old data aside moves nothing of a local tier kept inside its
    data directory (the other brokers' too): only the broker's own files."""
    def broker(name: str, data: str) -> Broker:
        tier = TierConfig(provider="local", local_dir=str(tmp_path / "a" / "tier"),
                          broker_name=name, upload=True, durable_ack=True,
                          durable_ack_ms=1, upload_timeout_s=10)
        b = Broker(BrokerConfig(store=StoreConfig(str(tmp_path / data)), tier=tier),
                   manual_clock)
        b.open()
        b.start(timer_thread=False)
        assert b.tiered is not None
        b.tiered.start()
        return b
    a = broker("a", "a")
    a.create_topic(Topic("t", 1))
    _send(a, "t", ["m"])
    a.stop()
    b = broker("b", "b")
    try:
        b.takeover("a", force=True)
        again = broker("a", "a")
        assert again.prefix == "a--1"
        again.stop()
        assert (tmp_path / "a" / "tier" / "brokers" / "b.json").exists()
        assert not (tmp_path / "a" / "incarnations" / "0" / "tier").exists()
        assert _pop_all(b, "g") == ["m"]
    finally:
        b.stop()


def test_a_running_broker_taken_over_says_not_serving_so_a_probe_restarts_it(
        tmp_path: Path) -> None:
    """A broker paused or partitioned, then resumed, is taken over but still runs: no
    supervisor restarts a live process.  Its gRPC health check answers NOT_SERVING from
    the moment it finds itself taken over (a liveness probe restarts it, and it
    rejoins); was: SERVING for good, fenced until a person restarted it."""
    config = load_config(None, [
        f"store.data_dir={tmp_path / 'a'}", "server.port=0", "server.metrics_port=0",
        "console.port=0", "tier.provider=local", f"tier.local_dir={tmp_path / 'tier'}",
        "tier.broker_name=a", "tier.upload=true", "tier.durable_ack=true"])
    server = BrokerServer(config)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            assert check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
            assert claim(server.broker.tier, "a", "b", 0) == "b"
            with ChronomqClient(f"127.0.0.1:{server.port}") as c, \
                    pytest.raises(RpcError, match="taken over by b"):
                c.create_topic("t", queue_count=1)  # its lease write finds the claim
            assert check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        server.stop()
