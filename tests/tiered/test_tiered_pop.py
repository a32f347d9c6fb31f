"""The tiered message store end to end on a real broker: sends go up to the tier (local
directory and moto's S3 over HTTP), local retention deletes them, and a new consumer
group still pops every message, from the tier; queries by id and key find them there;
read strategies; tier retention by time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from store.clock import ManualClock
from store.message import Message, draft_of
from store.store import StoreConfig
from store.topics import Topic
from tests.conftest import tier_config


def _tier(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
          **settings: Any) -> TierConfig:
    small = {"upload": True, "upload_batch_bytes": 8 << 10, "segment_bytes": 32 << 10,
             **settings}
    return tier_config(kind, tmp_path, request, "tp", **small)


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
            infos = broker.sender.send([draft_of(Message("", "t", f"{b}-{i}".encode() * 20,
                                                         key=f"k{i % 10}"))
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
        # QueryMessages falls through to the tier's key index for what left local disk
        first = sent[0]
        assert broker.store.query_by_message_id(first) == []  # gone locally
        assert [m.message_id for m in broker.queries.by_message_id(first)] == [first]
        by_key = broker.queries.by_key("t", "k3", 100)
        assert [m.key for m in by_key] == ["k3"] * 50 and len({m.message_id
                                                                 for m in by_key}) == 50
        assert by_key[-1].message_id == sent[-7]  # oldest first; the newest is 9-43
        assert broker.queries.by_key("t", "k3", 5) == by_key[-5:]
        assert broker.queries.by_message_id("0" * 32) == []
    finally:
        broker.stop()


def _filled(tmp_path: Path, clock: ManualClock, tier: TierConfig,
            retention_bytes: int = 0) -> tuple[Broker, list[str]]:
    store = StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10,
                        cq_entries_per_file=50, retention_bytes=retention_bytes)
    broker = Broker(BrokerConfig(store=store, tier=tier), clock)
    broker.open()
    broker.start(timer_thread=False)
    broker.create_topic(Topic("t", 1))
    infos = []
    for b in range(8):  # a batch is appended to one CommitLog segment: several batches
        infos += broker.sender.send([draft_of(Message("", "t", b"x" * 300, key=f"k{i % 10}"))
                                     for i in range(b * 50, b * 50 + 50)]).result(10)
    assert broker.store.wait_visible(10) and broker.store.dispatcher is not None
    broker.store.dispatcher.catch_up()
    assert broker.tiered is not None
    while broker.tiered.step():
        pass
    broker.tiered.commit()
    return broker, [i.message_id for i in infos]


def _pop_all(broker: Broker, group: str) -> list[str]:
    got: list[str] = []
    while batch := broker.pop.pop("t", group, 32, 60):
        got += [p.message.message_id for p in batch]
        broker.pop.ack_many(group, [p.receipt_handle for p in batch])
    return got


@pytest.mark.parametrize("strategy", ["force", "not_in_mem"])
def test_read_strategies_send_reads_of_data_still_on_disk_to_the_tier(
        strategy: str, tmp_path: Path, manual_clock: ManualClock,
        request: pytest.FixtureRequest) -> None:
    tier = _tier("local", tmp_path, request, read=strategy, hot_bytes=40 << 10)
    broker, sent = _filled(tmp_path, manual_clock, tier)
    try:
        assert broker.store.commitlog.min_offset == 0  # nothing left local disk
        assert broker.tier_reader is not None and broker.tier_reader.cache is not None
        assert _pop_all(broker, "g") == sent
        fetched = broker.tier_reader.cache.statistics().fetched
        if strategy == "force":
            assert fetched == 400  # all of it came from the tier
        else:  # the older part came from the tier, the hot part from local disk
            assert 100 < fetched < 400
    finally:
        broker.stop()


def test_disable_never_reads_the_tier(tmp_path: Path, manual_clock: ManualClock,
                                      request: pytest.FixtureRequest) -> None:
    broker, sent = _filled(tmp_path, manual_clock, _tier("local", tmp_path, request,
                                                         read="disable"), retention_bytes=1)
    try:
        assert broker.store.run_retention() > 0
        got = _pop_all(broker, "g")
        assert got and len(got) < len(sent) and got == sent[-len(got):]  # local part only
        assert broker.queries.by_message_id(sent[0]) == []
    finally:
        broker.stop()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_tier_retention_deletes_expired_segments_per_topic(
        kind: str, tmp_path: Path, manual_clock: ManualClock,
        request: pytest.FixtureRequest) -> None:
    tier = _tier(kind, tmp_path, request, retention_ms=3_600_000, segment_ms=60_000)
    broker, sent = _filled(tmp_path, manual_clock, tier, retention_bytes=1)
    assert broker.tiered is not None
    try:
        broker.create_topic(Topic("keep", 1, tier_retention_ms=10 * 3_600_000))
        broker.sender.send([draft_of(Message("", "keep", b"k" * 100))]).result(10)
        manual_clock.advance(120_000)  # newer data of t, in a new segment
        late = broker.sender.send([draft_of(Message("", "t", b"y" * 300, key="late"))
                                   for _ in range(20)]).result(10)
        broker.store.wait_visible(10)
        assert broker.store.dispatcher is not None
        broker.store.dispatcher.catch_up()
        while broker.tiered.step():
            pass
        broker.tiered.commit()
        broker.store.run_retention()  # local copies are gone: reads need the tier
        objects = broker.tier.list("broker-0/data/t/")
        broker.run_retention()
        # nothing is old enough (folds of small objects may be added: tiered.fold)
        assert set(objects) <= set(broker.tier.list("broker-0/data/t/"))
        manual_clock.advance(3_600_000 - 60_000)  # the first 400 are past 1 h, the rest not
        broker.run_retention()
        left = broker.tier.list("broker-0/data/t/")
        assert left and len(left) < len(objects)
        assert _pop_all(broker, "g") == [i.message_id for i in late]  # the expired are gone
        assert broker.queries.by_message_id(sent[0]) == []
        assert len(broker.queries.by_key("t", "late", 100)) == 20
        assert broker.tier.list("broker-0/data/keep/")  # its own, longer retention
        manual_clock.advance(3_600_000)
        broker.run_retention()
        # the objects folds replaced go once the tier's copy of the metadata is new
        broker.tiered.commit()
        broker.run_retention()
        assert broker.tier.list("broker-0/data/t/") == []
        assert broker.tier.list("broker-0/data/keep/")
    finally:
        broker.stop()


def test_a_pop_that_meets_retention_mid_read_reads_the_tier_at_once(
        tmp_path: Path, manual_clock: ManualClock, request: pytest.FixtureRequest) -> None:
    """Local retention may delete the records a Pop is reading from local disk between
    the read of their ConsumeQueue entries and of the records.  Seen from outside: a
    Pop then answered nothing though the messages were in the tier, and a consumer
    draining the queue until an empty Pop stopped short.  The Pop reads them from the
    tier at once instead."""
    broker, sent = _filled(tmp_path, manual_clock, _tier("local", tmp_path, request),
                           retention_bytes=1)
    source = broker.pop._source
    read_rows = source.read_rows
    raced: list[int] = []

    def retention_between(*args: Any, **kw: Any) -> Any:
        rows, load = read_rows(*args, **kw)

        def load_after_retention(picked: list[int]) -> Any:
            if not raced:  # once: the local records go after the entries were read
                raced.append(broker.store.run_retention())
            return load(picked)
        return rows, load_after_retention
    try:
        source.read_rows = retention_between  # type: ignore[method-assign]
        first = broker.pop.pop("t", "g", 32, 60)
        assert raced and raced[0] > 0 and broker.store.commitlog.min_offset > 0
        assert [p.message.message_id for p in first] == sent[:32]
        broker.pop.ack_many("g", [p.receipt_handle for p in first])
        assert sent[:32] + _pop_all(broker, "g") == sent
    finally:
        broker.stop()


def test_a_deleted_topics_objects_leave_the_tier(tmp_path: Path, manual_clock: ManualClock,
                                                 request: pytest.FixtureRequest) -> None:
    """A deleted topic's data stayed in the tier for good (its queues' segments and the
    key-index files naming it only), though nothing reads it again; with tier retention
    off (keep forever) nothing ever removed it.  The next retention pass deletes it all,
    and nothing of the topics that live on, nor of a namesake created since."""
    broker, _ = _filled(tmp_path, manual_clock, _tier("local", tmp_path, request))
    assert broker.tiered is not None

    def uploaded() -> None:
        broker.store.wait_visible(10)
        assert broker.store.dispatcher is not None and broker.tiered is not None
        broker.store.dispatcher.catch_up()
        while broker.tiered.step():
            pass
        broker.tiered.commit()
    try:
        broker.create_topic(Topic("keep", 1))
        kept = broker.sender.send([draft_of(Message("", "keep", b"k" * 100, key="kk"))
                                   for _ in range(30)]).result(10)
        uploaded()
        assert broker.tier.list("broker-0/data/t/")
        keep_objects = broker.tier.list("broker-0/data/keep/")
        broker.run_retention()
        assert broker.tier.list("broker-0/data/t/")  # kept forever while it lives
        broker.delete_topic("t")
        broker.run_retention()
        assert broker.tier.list("broker-0/data/t/") == [], broker.tier.list("broker-0/data/t/")
        assert broker.tier.list("broker-0/data/keep/") == keep_objects
        assert [m.message_id for m in broker.queries.by_key("keep", "kk", 100)] == \
            [i.message_id for i in kept]
        # a namesake created afterwards keeps its own data
        broker.create_topic(Topic("t", 1))
        again = broker.sender.send([draft_of(Message("", "t", b"z" * 300, key="again"))
                                    for _ in range(10)]).result(10)
        uploaded()
        broker.store.run_retention()  # local copies gone: reads need the tier
        broker.run_retention()
        assert broker.tier.list("broker-0/data/t/")
        assert _pop_all(broker, "g") == [i.message_id for i in again]
    finally:
        broker.stop()
