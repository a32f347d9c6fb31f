"""QueryMessages finds every message the tier holds, whether or not its key-index entry
was sealed into a compacted file yet: the owner's open index file is searched too (local
retention may have deleted the record's segment long before the file is sealed), and a
mount indexes what the departed broker's sealed files do not cover (it was killed with
its open file unsealed)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.client import ChronomqClient, message
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.message import Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from testkit.process import ServerProcess, wait_tier_caught_up
from tests.conftest import CREDS, create_bucket, tier_config
from tiered.index import OPEN_ENTRY, key_digest, scan
from tiered.mount import MountedBroker


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_key_is_found_after_local_retention_while_its_index_file_is_open(
        kind: str, tmp_path: Path, manual_clock: ManualClock,
        request: pytest.FixtureRequest) -> None:
    # Given a broker whose tier has every record, its key index still open (index_ms 5 min)
    store = StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10,
                        cq_entries_per_file=50, retention_bytes=1)
    tier = tier_config(kind, tmp_path, request, "gap", upload=True,
                       upload_batch_bytes=8 << 10, segment_bytes=32 << 10)
    broker = Broker(BrokerConfig(store=store, tier=tier), manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    tiered = broker.tiered
    assert tiered is not None
    try:
        broker.create_topic(Topic("t", 4))
        sent: list[tuple[str, str]] = []
        for b in range(10):
            infos = broker.sender.send([draft_of(Message("", "t", b"x" * 100, key=f"k{b * 50 + i}"))
                                        for i in range(50)]).result(10)
            sent += [(i.message_id, i.key) for i in infos]
        assert broker.store.wait_visible(10) and broker.store.dispatcher is not None
        broker.store.dispatcher.catch_up()
        while tiered.step():
            pass
        manual_clock.advance(tier.upload_batch_ms)  # every queue's batch is due, the
        tiered.commit(force=False)                  # index file is not (5 min)
        stats = tiered.statistics()
        assert stats.upload_lag_bytes == 0 and stats.index_files == 0
        # When local retention deletes the segments
        assert broker.store.run_retention() > 0
        assert broker.store.commitlog.min_offset > 0
        gone = [(mid, key) for mid, key in sent if not broker.store.query_by_message_id(mid)]
        assert len(gone) > 400  # most records left local disk
        # Then each of them is still found by its key and by its id, in the tier
        for mid, key in gone:
            assert [m.message_id for m in broker.queries.by_key("t", key, 10)] == [mid]
            assert [m.message_id for m in broker.queries.by_message_id(mid)] == [mid]
        assert tiered.statistics().index_files == 0  # found without sealing the file
    finally:
        broker.stop()


def test_scan_takes_only_whole_entries() -> None:
    d = key_digest("t", "k1")
    raw = struct.pack(">Q", d)
    # an entry whose queue offset and store time hold the digest's bytes: not a match
    decoy = OPEN_ENTRY.pack(key_digest("t", "k2"), d, d >> 8, 0, 0)
    body = decoy + OPEN_ENTRY.pack(d, 7, 70, 700, 1) + decoy + OPEN_ENTRY.pack(d, 9, 90, 900, 1)
    assert body.count(raw) == 4
    assert scan([(3, body)], d) == [(3, 7, 70, 700), (3, 9, 90, 900)]
    assert scan([(3, decoy)], d) == []


def test_a_mount_of_an_older_catalogue_indexes_by_store_time(
        tmp_path: Path, manual_clock: ManualClock, request: pytest.FixtureRequest) -> None:
    # Given a broker with a sealed index file and an open one, whose catalogue in the tier
    # has no queue offsets (written before they were kept)
    store = StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10)
    tier = tier_config("local", tmp_path, request, "old", upload=True,
                       upload_batch_bytes=8 << 10, segment_bytes=32 << 10)
    broker = Broker(BrokerConfig(store=store, tier=tier), manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    tiered = broker.tiered
    assert tiered is not None
    sent: dict[str, str] = {}
    try:
        broker.create_topic(Topic("t", 2))
        for b in range(4):
            infos = broker.sender.send([draft_of(Message("", "t", b"x" * 100, key=f"k{i % 7}"))
                                        for i in range(50)]).result(10)
            sent.update({i.message_id: i.key for i in infos})
            assert broker.store.wait_visible(10) and broker.store.dispatcher is not None
            broker.store.dispatcher.catch_up()
            while tiered.step():
                pass
            manual_clock.advance(tier.upload_batch_ms)
            tiered.commit(force=b == 1)  # sealed after the second batch
        assert tiered.statistics().index_files == 1
        catalogue = tmp_path / "tier" / "broker-0" / "index" / "catalog.json"
        raw = json.loads(catalogue.read_text())
        assert all(f.pop("ends") for f in raw["files"])
        catalogue.write_text(json.dumps(raw))
        # When another broker mounts the tier
        mounted = MountedBroker(broker.tier, "broker-0", str(tmp_path / "mount"))
        # Then every key and id is found, once
        for key in ("k0", "k6"):
            got = mounted.query_by_key("t", key, 100)
            assert sorted(m.message_id for m in got) == \
                sorted(mid for mid, k in sent.items() if k == key)
        for mid in list(sent)[::37]:
            assert [m.message_id for m in mounted.query_by_message_id(mid)] == [mid]
    finally:
        broker.stop()


def _tier(kind: str, tmp_path: Path, endpoint: str, bucket: str, name: str) -> list[str]:
    if kind == "local":
        return ["tier.provider=local", f"tier.local_dir={tmp_path / 'tier'}",
                f"tier.broker_name={name}"]
    return ["tier.provider=s3", f"tier.s3_bucket={bucket}", f"tier.s3_endpoint_url={endpoint}",
            f"tier.s3_access_key_id={CREDS['access_key_id']}",
            f"tier.s3_secret_access_key={CREDS['secret_access_key']}",
            f"tier.broker_name={name}"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_mount_finds_the_keys_of_a_brokers_open_index_file(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    endpoint = bucket = ""
    if kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"gap-mount-{abs(hash(tmp_path)) % 10**9}"
        create_bucket(endpoint, bucket)
    # Given broker A whose key index sealed one file (4,000 entries) and holds the rest
    # of its keys in its open file (never sealed: 5 min), killed with kill -9
    a = ServerProcess(tmp_path / "a", *_tier(kind, tmp_path, endpoint, bucket, "broker-a"),
                      "store.node_id=1", "tier.upload=true", "tier.upload_batch_ms=50",
                      "tier.index_entries=4000")
    sent: dict[str, str] = {}  # id -> key
    try:
        with ChronomqClient(a.target) as c:
            c.create_topic("orders", queue_count=4)
            for b in range(30):
                out = c.send([message("orders", f"order-{b}-{i}".encode(), key=f"k{i}")
                              for i in range(100)])
                assert all(o.ok for o in out)
                sent.update({o.message_id: f"k{i}" for i, o in enumerate(out)})
                if b == 24:  # 5,000 entries: one file sealed
                    wait_tier_caught_up(c)
            wait_tier_caught_up(c)
            assert c.stats()["tier.index_files"] == 1
    finally:
        a.kill9()
    # When broker B mounts A's tier
    b = ServerProcess(tmp_path / "b", *_tier(kind, tmp_path, endpoint, bucket, "broker-b"),
                      "store.node_id=2", "tier.mounts=broker-a")
    try:
        with ChronomqClient(b.target) as c:
            # Then every key is found (30 messages each, sealed and open alike) ...
            for key in ("k17", "k0", "k99"):
                got = c.query("orders", key=key, max_messages=64)
                assert sorted(m.message_id for m in got) == \
                    sorted(mid for mid, k in sent.items() if k == key)
                assert {m.key for m in got} == {key}
            # ... and every id, the first message and the last
            ids = list(sent)
            for mid in (ids[0], ids[-1], ids[2600]):
                (found,) = c.query(message_id=mid)
                assert (found.message_id, found.key) == (mid, sent[mid])
    finally:
        b.kill9()
