"""Two broker processes (``chronomq serve``) sharing one bucket on moto's S3 server with
``tier.claim_topics``, and one client over both: each topic is served by the broker that
claimed it; a client that knows both addresses, or only the bucket, sends, pops, acks and
subscribes at the owner; when the owner is killed with kill -9, the survivor mounts its
tier, takes its topics over in the bucket, and the same client finds them there with
every uploaded message intact."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from chronomq.config import load_config
from chronomq.providers import make_provider
from testkit.process import ServerProcess, wait_tier_caught_up
from tests.conftest import CREDS, create_bucket

pytestmark = pytest.mark.slow


def _tier(endpoint: str, bucket: str, name: str, node: int) -> list[str]:
    return ["tier.provider=s3", f"tier.s3_bucket={bucket}", f"tier.s3_endpoint_url={endpoint}",
            f"tier.s3_access_key_id={CREDS['access_key_id']}",
            f"tier.s3_secret_access_key={CREDS['secret_access_key']}",
            f"tier.broker_name={name}", f"store.node_id={node}", "tier.claim_topics=true",
            "tier.upload=true", "tier.upload_batch_ms=50"]


@pytest.mark.parametrize("find_by", ["addresses", "bucket"])
def test_one_client_over_two_broker_processes(tmp_path: Path, s3_endpoint: str,
                                              find_by: str) -> None:
    bucket = f"two-brokers-{find_by}"
    create_bucket(s3_endpoint, bucket)
    a = ServerProcess(tmp_path / "a", *_tier(s3_endpoint, bucket, "broker-a", 1))
    with socket.socket() as s:  # b keeps its address across its restart
        s.bind(("127.0.0.1", 0))
        b_port = s.getsockname()[1]
    b_settings = [*_tier(s3_endpoint, bucket, "broker-b", 2), f"server.port={b_port}"]
    b = ServerProcess(tmp_path / "b", *b_settings)
    b_again: ServerProcess | None = None
    try:
        with ChronomqClient(a.target) as ca, ChronomqClient(b.target) as cb:
            assert ca.create_topic("orders", queue_count=2)
            assert cb.create_topic("payments")
            with pytest.raises(RpcError) as refused:  # one owner per topic
                cb.create_topic("orders")
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "broker-a" in refused.value.details
        tier = make_provider(load_config(None, b_settings))
        directory = (BrokerDirectory([a.target, b.target]) if find_by == "addresses"
                     else BrokerDirectory(tier=tier))
        with RoutedClient(directory) as rc:
            out = rc.send([message("orders", b"o%d" % i, key=f"k{i}") for i in range(10)]
                          + [message("payments", b"p1")])
            assert all(o.ok for o in out)
            orders = {o.message_id: b"o%d" % i for i, o in enumerate(out[:10])}
            assert directory.locate("orders") == a.target
            assert directory.locate("payments") == b.target
            with ChronomqClient(b.target) as cb:  # nothing of a's topic landed on b
                assert [t.name for t in cb.list_topics()] == ["payments"]
            got = rc.pop("orders", "g", 4, 30, 0)
            assert {m.message_id: m.body for m in got}.items() <= orders.items()
            assert rc.ack("orders", "g", [m.receipt_handle for m in got]) == [""] * len(got)
            acked = {m.message_id for m in got}
            with rc.subscribe("payments", "g") as sub:
                response = next(iter(sub.responses()))
                assert [m.body for m in response.messages] == [b"p1"]
                sub.ack([m.receipt_handle for m in response.messages])
            with ChronomqClient(a.target) as ca:
                wait_tier_caught_up(ca)
            a.kill9()  # broker-a is gone for good

            # the survivor restarts with a's tier mounted: it takes "orders" over
            b.terminate()
            b_again = ServerProcess(tmp_path / "b", *b_settings, "tier.mounts=broker-a")
            assert b_again.target == b.target
            # the client still knew a: a is down (UNAVAILABLE), so it looks again and
            # follows the topic to its new owner
            first = rc.pop("orders", "g2", 32, 30, 0)
            assert directory.locate("orders") == b.target
            rc.ack("orders", "g2", [m.receipt_handle for m in first])
            rest: dict[str, bytes] = {m.message_id: m.body for m in first}
            while batch := rc.pop("orders", "g2", 32, 30, 0):
                rest.update({m.message_id: m.body for m in batch})
                rc.ack("orders", "g2", [m.receipt_handle for m in batch])
            assert rest == orders  # a new group reads every message a answered OK
            assert acked  # (group g's acks lived on a; g2 is b's own position)
            sent = rc.send([message("orders", b"new")])
            assert not sent[0].ok  # mounted topics are read-only
            assert rc.pop("payments", "g", 8, 30, 0) == []  # b's own topic kept its ack
    finally:
        for p in (a, b, b_again):
            if p is not None and p.proc.poll() is None:
                p.kill9()
