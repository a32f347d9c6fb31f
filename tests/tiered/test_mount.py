"""A departed broker's tier mounted read-only by a surviving one, with real processes:
broker A (``tier.upload``) takes sends and uploads them to moto's S3 server, then is
killed for good (kill -9); broker B, started with ``tier.mounts = broker-a`` on the same
bucket, lists A's topics and serves them read-only: every message acked by A and
uploaded is consumable through B exactly as it was (ids, bodies, keys, due times), over
Pop and Subscribe, with B's own group checkpoints (kept across B's restart); sends and
creates are refused; without the setting the topics are gone (unmounted)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess, wait_tier_caught_up
from testkit.wait import wait_until
from tests.chronomq.test_cli_exit_codes import chronomq
from tests.conftest import CREDS, create_bucket


def _tier(endpoint: str, bucket: str, name: str) -> list[str]:
    return ["tier.provider=s3", f"tier.s3_bucket={bucket}", f"tier.s3_endpoint_url={endpoint}",
            f"tier.s3_access_key_id={CREDS['access_key_id']}",
            f"tier.s3_secret_access_key={CREDS['secret_access_key']}",
            f"tier.broker_name={name}"]


def _drain(c: ChronomqClient, topic: str, group: str) -> dict[str, tuple[bytes, str, int]]:
    got: dict[str, tuple[bytes, str, int]] = {}
    while batch := c.pop(topic, group, 32, 30, 0):
        got.update({m.message_id: (m.body, m.key, m.deliver_at_ms) for m in batch})
        assert c.ack(group, [m.receipt_handle for m in batch]) == [""] * len(batch)
    return got


@pytest.mark.slow
def test_a_departed_brokers_tier_is_served_read_only(tmp_path: Path, s3_endpoint: str) -> None:
    bucket = "mount-test"
    create_bucket(s3_endpoint, bucket)
    a = ServerProcess(tmp_path / "a", *_tier(s3_endpoint, bucket, "broker-a"), "store.node_id=1",
                      "tier.upload=true", "tier.upload_batch_ms=50", "tier.index_ms=200")
    sent: dict[str, tuple[bytes, str, int]] = {}
    with ChronomqClient(a.target) as c:
        c.create_topic("orders", queue_count=2)
        for b in range(3):
            out = c.send([message("orders", f"order-{b}-{i}".encode(), key=f"k{i % 5}")
                          for i in range(50)])
            assert all(o.ok for o in out)
            sent.update({o.message_id: (f"order-{b}-{i}".encode(), f"k{i % 5}",
                                        o.deliver_at_ms) for i, o in enumerate(out)})
        wait_tier_caught_up(c)
        wait_until(lambda: c.stats()["tier.index_files"] >= 1, 30,
                   "its key index sealed into the tier (Stats tier.index_files >= 1)",
                   show=lambda: c.stats()["tier.index_files"], poll_s=0.1)
    a.kill9()  # gone for good

    b_settings = [*_tier(s3_endpoint, bucket, "broker-b"), "store.node_id=2",
                  "tier.mounts=broker-a"]
    b = ServerProcess(tmp_path / "b", *b_settings)
    try:
        with ChronomqClient(b.target) as c:
            (orders,) = c.list_topics()
            assert (orders.name, orders.queue_count, orders.mounted_from) == \
                ("orders", 2, "broker-a")
            assert _drain(c, "orders", "billing") == sent  # exactly as A acked them
            # QueryMessages by id and by key, through A's key index in the tier
            some = next(iter(sent))
            (by_id,) = c.query(message_id=some)
            assert (by_id.message_id, by_id.body) == (some, sent[some][0])
            by_key = c.query("orders", key="k3", max_messages=64)
            assert {m.message_id for m in by_key} == \
                {mid for mid, (_, key, _) in sent.items() if key == "k3"}
            # Subscribe, another group, its own position
            seen: dict[str, bytes] = {}
            with c.subscribe("orders", "audit") as sub:
                for response in sub.responses():
                    seen.update({m.message_id: m.body for m in response.messages})
                    sub.ack([m.receipt_handle for m in response.messages])
                    if len(seen) == len(sent):
                        break
            assert seen == {mid: body for mid, (body, _, _) in sent.items()}
            with pytest.raises(RpcError) as refused:
                c.create_topic("orders")
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            (out,) = c.send([message("orders", b"new")])
            assert not out.ok and "read-only" in out.error
            stats = c.stats()
            assert stats["mount.broker-a.topics"] == 1
            assert stats["mount.broker-a.messages"] == len(sent)
        b.terminate()
        b = ServerProcess(tmp_path / "b", *b_settings)  # B's checkpoints survive a restart
        with ChronomqClient(b.target) as c:
            assert c.pop("orders", "billing", 32, 30, 0) == []
            assert len(_drain(c, "orders", "late-group")) == len(sent)
        b.terminate()
        b = ServerProcess(tmp_path / "b", *b_settings[:-1])  # unmounted
        with ChronomqClient(b.target) as c:
            assert c.list_topics() == []
            with pytest.raises(RpcError) as gone:
                c.pop("orders", "billing", 32, 30, 0)
            assert gone.value.code == grpc.StatusCode.NOT_FOUND
        # mounted and unmounted at run time, by the console command
        mounted = chronomq("mount", "broker-a", "--target", b.target, "--json")
        assert mounted.code == 0 and json.loads(mounted.out)["mounted"] == "orders"
        with ChronomqClient(b.target) as c:
            assert c.pop("orders", "billing", 32, 30, 0) == []  # its position kept
        nobody = chronomq("mount", "nobody", "--target", b.target)
        assert nobody.code == 1 and "NOT_FOUND" in nobody.err
        assert chronomq("unmount", "broker-a", "--target", b.target).code == 0
        with ChronomqClient(b.target) as c, pytest.raises(RpcError):
            c.pop("orders", "billing", 32, 30, 0)
    finally:
        b.kill9()
