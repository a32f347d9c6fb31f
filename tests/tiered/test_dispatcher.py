"""TieredDispatcher on a real store and a local-directory tier: batches by size or age,
checkpoint, replay after a restart without duplicates, delayed records left out."""

from __future__ import annotations

from pathlib import Path

from cluster.replay import stream
from store.clock import ManualClock
from store.message import FLAG_DELAYED, Message, decode_record
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.durable import BUSY_BYTES
from tiered.mount import MountedBroker
from tiered.providers.local import LocalProvider


def _open(root: Path, clock: ManualClock) -> tuple[MessageStore, TieredDispatcher]:
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, LocalProvider(str(root / "tier")), "b0",
                            str(root / "data" / "tiered"),
                            TierConfig(upload_batch_bytes=4000, upload_batch_ms=1000,
                                       index_ms=1000),
                            clock)
    tier.open()
    return store, tier


def _send(store: MessageStore, n: int, start: int = 0, flags: int = 0) -> None:
    store.put([Message("", "t", f"m{start + i}".encode(), flags=flags,
                       deliver_at_ms=10**13 if flags else 0) for i in range(n)]).result(10)


def _bodies(tier: TieredDispatcher, qid: int) -> list[bytes]:
    return [decode_record(e.record).body for e in tier.read("t", qid, 0, 10_000)]


def test_batches_go_up_by_size_or_age_and_replay_adds_nothing(tmp_path: Path,
                                                              manual_clock: ManualClock) -> None:
    store, tier = _open(tmp_path, manual_clock)
    store.create_topic(Topic("t", 2))
    _send(store, 10)
    _send(store, 3, flags=FLAG_DELAYED)  # the timer's: not uploaded until delivered
    tier.step()
    assert tier.read("t", 0, 0, 100) == []  # small and young: still buffered
    assert tier.position() == 0
    manual_clock.advance(1000)
    tier.step()  # old enough now
    assert sorted(_bodies(tier, 0) + _bodies(tier, 1)) == sorted(f"m{i}".encode()
                                                                  for i in range(10))
    assert tier.position() == store.commitlog.confirmed_offset
    _send(store, 200, start=10)  # > batch_bytes: goes up at once
    tier.step()
    assert len(_bodies(tier, 0)) + len(_bodies(tier, 1)) == 210
    tier.stop()
    store.stop()
    # a restart that replays from before the checkpoint adds nothing twice
    (tmp_path / "data" / "tiered" / "checkpoint").write_text("0")
    store, tier = _open(tmp_path, manual_clock)
    try:
        while tier.step():
            pass
        tier.commit()
        bodies = _bodies(tier, 0) + _bodies(tier, 1)
        assert len(bodies) == 210 and len(set(bodies)) == 210
        metas = LocalProvider(str(tmp_path / "tier")).list("b0/meta/")
        assert metas == ["b0/meta/t/0.json", "b0/meta/t/1.json"]
    finally:
        tier.stop()
        store.stop()


def test_a_re_created_topic_starts_a_new_generation_in_the_tier(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    store, tier = _open(tmp_path, manual_clock)
    try:
        store.create_topic(Topic("t", 1))
        _send(store, 5)
        tier.step()
        tier.commit()
        store.delete_topic("t")
        store.create_topic(Topic("t", 1))
        _send(store, 3, start=100)
        tier.step()
        tier.commit()
        assert _bodies(tier, 0) == [b"m100", b"m101", b"m102"]
    finally:
        tier.stop()
        store.stop()


def _upload_all(tier: TieredDispatcher) -> list[bytes]:
    """Step until the CommitLog is read, commit, and return every body in the tier."""
    while tier.step():
        pass
    tier.commit()
    return sorted(_bodies(tier, 0) + _bodies(tier, 1))


def _expected(n: int) -> list[bytes]:
    return sorted(f"m{i}".encode() for i in range(n))


def test_records_the_store_dispatcher_decoded_are_reused(tmp_path: Path,
                                                         manual_clock: ManualClock) -> None:
    store, tier = _open(tmp_path, manual_clock)
    try:
        assert store.dispatcher is not None
        store.dispatcher.add_listener(tier.offer)
        store.create_topic(Topic("t", 2))
        for start in range(0, 300, 100):
            _send(store, 100, start=start)
        store.wait_visible()
        assert tier.statistics().commits == 0
        assert _upload_all(tier) == _expected(300)
        stats = tier.statistics()
        assert stats.reused_records == 300  # none decoded a second time
        assert stats.commits >= 1 and stats.commit_seconds > 0  # what a commit takes
    finally:
        tier.stop()
        store.stop()


def test_a_dispatcher_behind_the_offers_decodes_itself(tmp_path: Path,
                                                       manual_clock: ManualClock) -> None:
    store, tier = _open(tmp_path, manual_clock)
    try:
        store.create_topic(Topic("t", 2))
        _send(store, 100)  # before the listener: only in the CommitLog
        store.wait_visible()
        assert store.dispatcher is not None
        store.dispatcher.add_listener(tier.offer)
        _send(store, 100, start=100)
        store.wait_visible()
        tier.step()  # reads from 0: the offers start later, so it decodes all 200
        assert tier.statistics().reused_records == 0
        _send(store, 100, start=200)  # caught up: this batch is taken as offered
        store.wait_visible()
        assert _upload_all(tier) == _expected(300)
        assert tier.statistics().reused_records == 100
    finally:
        tier.stop()
        store.stop()


def test_durable_ack_commits_at_once_for_a_lone_writer_and_fill_under_load(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """``tiered.durable.Linger``: back to back while commits are small; after one of at
    least BUSY_BYTES, a batch waits until it is ``durable_ack_ms`` old; small again, at
    once again."""
    store = MessageStore(StoreConfig(str(tmp_path / "data")), manual_clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            str(tmp_path / "data" / "tiered"),
                            TierConfig(upload=True, durable_ack=True, durable_ack_ms=50,
                                       upload_batch_bytes=8 << 20), manual_clock)
    tier.open()
    try:
        store.create_topic(Topic("t", 1))

        def send(n: int, size: int) -> int:
            store.put([Message("", "t", b"x" * size) for _ in range(n)]).result(10)
            tier.step()
            return store.commitlog.confirmed_offset

        end = send(1, 10)  # a lone writer: up at once
        assert tier.durable_position() == end and tier.linger.ms == 0
        end = send(100, BUSY_BYTES // 100)  # this commit still at once; it was busy
        assert tier.durable_position() == end and tier.linger.ms == 50
        end = send(1, 10)  # now the next batch fills for durable_ack_ms
        assert tier.durable_position() < end
        manual_clock.advance(49)
        tier.step()
        assert tier.durable_position() < end
        manual_clock.advance(1)
        tier.step()
        assert tier.durable_position() == end and tier.linger.ms == 0  # that one was small
        end = send(1, 10)
        assert tier.durable_position() == end
    finally:
        tier.stop()
        store.stop()


def test_a_mount_reads_what_was_stored_since_a_time(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """``MountedBroker.first_stored`` then ``cluster.replay.stream`` (what a takeover reads
    of the departed broker's dead-letter queues): the records stored since a time, in
    order, none twice, none older."""
    store, tier = _open(tmp_path, manual_clock)
    try:
        store.create_topic(Topic("t", 1))
        start_ms = manual_clock.now_ms()
        for i in range(7):  # one a second: stored at start + i s
            _send(store, 1, start=i)
            manual_clock.advance(1000)
        tier.step()
        tier.commit()
        mounted = MountedBroker(LocalProvider(str(tmp_path / "tier")), "b0",
                                str(tmp_path / "work"))
        bounds = mounted.bounds("t", 0)
        assert bounds == (0, 7)

        def since(at_ms: int) -> list[bytes]:
            first = mounted.first_stored("t", 0, *bounds, at_ms)
            return [decode_record(e.record).body for e in stream(mounted, "t", first)]

        assert since(start_ms + 4000) == [b"m4", b"m5", b"m6"]
        assert since(start_ms + 9000) == []
        assert since(start_ms) == [f"m{i}".encode() for i in range(7)]  # all, none twice
    finally:
        tier.stop()
        store.stop()
