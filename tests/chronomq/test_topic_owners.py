"""Two brokers sharing one S3 bucket (moto's server) with ``tier.claim_topics``: a topic
lives on the broker that claimed it first in the shared tier; the other refuses to
create it and names the owner; deleting releases it; a restart keeps the claim."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from chronomq.client import RpcError
from tests.conftest import RunningServer, broker_config, tier_config


def _broker(tmp_path: Path, request: pytest.FixtureRequest, name: str, node: int
            ) -> RunningServer:
    tier = dataclasses.replace(tier_config("s3", tmp_path, request, "owners"),
                               broker_name=name, claim_topics=True)
    config = broker_config(tmp_path / name)
    config = dataclasses.replace(config, tier=tier,
                                 store=dataclasses.replace(config.store, node_id=node))
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
        assert b.server.broker.owners is not None
        assert b.server.broker.owners.owner("payments").address == b.target
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
