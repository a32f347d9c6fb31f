"""The tiered message store end to end on a real broker: sends go up to the tier (local
directory and moto's S3 over HTTP), local retention deletes them, and a new consumer
group still pops every message, from the tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from store.clock import ManualClock
from store.message import Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from tests.conftest import CREDS, create_bucket


def _tier(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> TierConfig:
    small = {"upload": True, "upload_batch_bytes": 8 << 10, "segment_bytes": 32 << 10}
    if kind == "local":
        return TierConfig(provider="local", local_dir=str(tmp_path / "tier"), **small)
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"tp-{abs(hash(tmp_path)) % 10**8}"
    create_bucket(endpoint, bucket)
    return TierConfig(provider="s3", s3_bucket=bucket, s3_endpoint_url=endpoint,
                      s3_access_key_id=CREDS["access_key_id"],
                      s3_secret_access_key=CREDS["secret_access_key"], **small)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_new_group_pops_everything_from_the_tier(kind: str, tmp_path: Path,
                                                   manual_clock: ManualClock,
                                                   request: pytest.FixtureRequest) -> None:
    store = StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10,
                        cq_entries_per_file=50, retention_bytes=1)
    broker = Broker(BrokerConfig(store=store, tier=_tier(kind, tmp_path, request)),
                    manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    tiered = broker.tiered
    assert tiered is not None
    try:
        broker.create_topic(Topic("t", 2))
        sent: list[str] = []
        for b in range(10):
            infos = broker.send([draft_of(Message("", "t", f"{b}-{i}".encode() * 20))
                                 for i in range(50)]).result(10)
            sent += [i.message_id for i in infos]
        assert broker.store.wait_visible(10)
        assert broker.store.dispatcher is not None
        broker.store.dispatcher.catch_up()  # persists every local dispatcher's position
        while tiered.step():
            pass
        tiered.commit()
        assert tiered.position() == broker.store.commitlog.confirmed_offset
        freed = broker.store.run_retention()
        assert freed > 0  # most local segments are gone
        assert broker.store.commitlog.min_offset > 0
        got: list[str] = []
        while batch := broker.pop.pop("t", "late-group", 32, 60):
            got += [p.message.message_id for p in batch]
            broker.pop.ack_many("late-group", [p.receipt_handle for p in batch])
        assert sorted(got) == sorted(sent)  # every message, once
        assert all(p.message.topic == "t" for p in broker.pop.pop("t", "other", 5, 60))
    finally:
        broker.stop()
