"""Recovery after a crash or a damaged disk: every reader of the CommitLog is clamped to
the recovered end, queue offsets are never reused, a damaged record is skipped and
reported (recovery, dispatch, reads) and never blocks what follows it, and after a
restart reads below local retention fall through to the tier."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from store import recovery
from store.checkpoint import OffsetCheckpoint
from store.clock import ManualClock, SystemClock
from store.commitlog import CommitLog
from store.errors import DamagedRecord
from store.message import DispatchInfo, Message, encode_record
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.providers.local import LocalProvider

SEGMENT0 = f"{0:020d}.log"


class Recorder:
    """A dispatch handler like the timer's: remembers what it saw and its rewinds."""

    name = "recorder"

    def __init__(self, position: int = 0) -> None:
        self._position = position
        self.records: list[DispatchInfo] = []
        self.rewinds: list[int] = []

    def position(self) -> int:
        return self._position

    def dispatch(self, records: list[DispatchInfo], end_offset: int) -> None:
        self.records += records
        self._position = end_offset

    def flush(self) -> None:
        pass

    def rewind(self, offset: int) -> None:
        self.rewinds.append(offset)
        self._position = min(self._position, offset)


def _config(tmp_path: Path, **settings: int) -> StoreConfig:
    return StoreConfig(str(tmp_path / "data"), **{"segment_bytes": 1 << 20,
                                                  "cq_entries_per_file": 100, **settings})


def _open(config: StoreConfig, *handlers: Recorder, clock: ManualClock | None = None,
          start: bool = True) -> MessageStore:
    store = MessageStore(config, clock or SystemClock())
    for h in handlers:
        store.add_dispatch_handler(h)
    store.open()
    if start:
        store.start()
    return store


def _put(store: MessageStore, n: int, topic: str = "t", key: str = "",
         body: bytes = b"") -> list[DispatchInfo]:
    out = store.put([Message("", topic, body or f"body-{i}".encode() * 10, key=key)
                     for i in range(n)]).result(10)
    assert store.wait_visible(10)
    return out


def _filled(tmp_path: Path, n: int, queues: int = 1, key: str = ""
            ) -> tuple[StoreConfig, list[DispatchInfo]]:
    config = _config(tmp_path)
    store = _open(config)
    store.create_topic(Topic("t", queues))
    sent = _put(store, n, key=key)
    store.stop()
    return config, sent


def _log_dir(config: StoreConfig) -> str:
    return os.path.join(config.data_dir, "commitlog")


def _cut(config: StoreConfig, at: int) -> None:
    """A torn tail: the log ends at ``at`` and its checkpoint says no more was fsynced."""
    os.truncate(os.path.join(_log_dir(config), SEGMENT0), at)
    os.remove(os.path.join(_log_dir(config), "checkpoint"))


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _entries(store: MessageStore, qid: int = 0) -> list:  # type: ignore[type-arg]
    lo, hi = store.queue_bounds("t", qid)
    out = []
    while lo < hi and (got := store.consume_queue_entries("t", qid, lo, 1000)):
        out += got
        lo = got[-1].queue_offset + 1
    return out


def _cq_checkpoint(config: StoreConfig) -> int | None:
    return OffsetCheckpoint(os.path.join(config.data_dir, "checkpoint", "consumequeue")).read()


def _log_with_segments(tmp_path: Path, n: int = 40, segment_bytes: int = 2000
                       ) -> tuple[list[int], list[bytes]]:
    log = CommitLog(str(tmp_path), SystemClock(), segment_bytes=segment_bytes)
    log.open()
    log.start()
    recs = [encode_record(Message(f"id{i}", "t", bytes([i]) * 100)) for i in range(n)]
    offsets = []
    for r in recs:
        offsets.append(log.append(lambda o, r=r: ([r], o)).result(10))
    log.stop()
    log.close()
    os.remove(tmp_path / "checkpoint")  # recovery scans everything
    return offsets, recs


def _segment_of(tmp_path: Path, offset: int) -> tuple[str, int]:
    bases = sorted(int(n[:-4]) for n in os.listdir(tmp_path) if n.endswith(".log"))
    base = max(b for b in bases if b <= offset)
    return str(tmp_path / f"{base:020d}.log"), offset - base



# ---------------------------------------------------------------- 1. readers are clamped


def test_a_torn_tail_rewinds_every_reader_before_new_appends(tmp_path: Path) -> None:
    # Given: ten messages dispatched everywhere, then the last three lost in a torn tail
    config, sent = _filled(tmp_path, 10, key="k")
    end = sent[7].commit_offset
    _cut(config, end + 30)
    recorder = Recorder(position=sent[-1].commit_offset + sent[-1].record_size)
    # When: the store opens (nothing appended yet)
    store = _open(config, recorder, start=False)
    # Then: every position is back at the recovered end, and persisted
    assert store.commitlog.confirmed_offset == end
    assert recorder.rewinds == [end]
    assert _cq_checkpoint(config) == end
    assert store.queues.position() == end and store.index.position() == end
    # and what is appended next reaches every view
    store.start()
    try:
        new = _put(store, 3, key="k")
        assert [e.commit_offset for e in _entries(store)[-3:]] == [m.commit_offset
                                                                  for m in new]
        assert [r.commit_offset for r in recorder.records] == [m.commit_offset for m in new]
        assert {m.message_id for m in store.query_by_key("t", "k", 100)} == {
            m.message_id for m in sent[:7] + new}
    finally:
        store.stop()


def test_a_position_inside_a_record_is_not_trusted(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # Given: the ConsumeQueue checkpoint points into the middle of record 4
    config, sent = _filled(tmp_path, 10)
    shutil.rmtree(os.path.join(config.data_dir, "consumequeue"))
    OffsetCheckpoint(os.path.join(config.data_dir, "checkpoint", "consumequeue")).write(
        sent[4].commit_offset + 20)
    # When: it opens
    with caplog.at_level(logging.WARNING):
        store = _open(config)
    try:
        # Then: it replays from the start of record 4 instead
        assert [e.commit_offset for e in _entries(store) if not e.is_hole] == [
            m.commit_offset for m in sent[4:]]
        assert any("inside a record" in r.getMessage() for r in caplog.records)
    finally:
        store.stop()


def test_record_boundary_finds_the_record_a_position_points_into(tmp_path: Path) -> None:
    offsets, recs = _log_with_segments(tmp_path, n=30)
    log = CommitLog(str(tmp_path), SystemClock(), segment_bytes=2000)
    end = log.open()
    assert log.statistics().segments > 2
    try:
        for at, rec in zip(offsets, recs, strict=True):
            assert log.record_boundary(at) == at
            assert log.record_boundary(at + 1) == at
            assert log.record_boundary(at + len(rec) - 1) == at
        assert log.record_boundary(end) == end
        assert log.record_boundary(end + 5) == end
    finally:
        log.close()


def test_the_tier_checkpoint_is_clamped_too(tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given: everything uploaded, then a torn tail takes the last three records
    config = _config(tmp_path)
    store = _open(config, clock=manual_clock)
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            os.path.join(config.data_dir, "tiered"), TierConfig(), manual_clock)
    tier.open()
    store.create_topic(Topic("t", 1))
    sent = _put(store, 10)
    while tier.step():
        pass
    tier.commit()
    assert tier.position() == store.commitlog.confirmed_offset
    tier.stop()
    store.stop()
    end = sent[7].commit_offset
    _cut(config, end)
    # When: the broker opens (the tier dispatcher is made before the store opens)
    store = MessageStore(config, manual_clock)
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            os.path.join(config.data_dir, "tiered"), TierConfig(), manual_clock)
    tier.open()
    store.open()
    # Then: its checkpoint is back at the recovered end, on disk too
    assert tier.position() == end
    assert (tmp_path / "data" / "tiered" / "checkpoint").read_text().strip() == str(end)
    store.start()
    try:
        new = _put(store, 2)
        while tier.step():
            pass
        tier.commit()
        # the new records continue the queue after the lost ones and reach the tier
        assert [m.queue_offset for m in new] == [10, 11]
        assert [e.queue_offset for e in tier.read("t", 0, 10, 10)] == [10, 11]
    finally:
        tier.stop()
        store.stop()


# ---------------------------------------------------------------- 2. no reused queue offsets


def test_queue_offsets_lost_in_a_torn_tail_become_holes(tmp_path: Path) -> None:
    config, sent = _filled(tmp_path, 10)
    _cut(config, sent[7].commit_offset + 50)
    store = _open(config)
    try:
        # Then: the queue keeps its end; the lost entries are holes
        assert store.queue_bounds("t", 0) == (0, 10)
        entries = _entries(store)
        assert [e.is_hole for e in entries] == [False] * 7 + [True] * 3
        # and new messages get new queue offsets
        new = _put(store, 2)
        assert [m.queue_offset for m in new] == [10, 11]
        assert [e.commit_offset for e in _entries(store)[10:]] == [m.commit_offset
                                                                   for m in new]
        with pytest.raises(ValueError, match="hole"):
            store.read_messages([(entries[8].commit_offset, entries[8].record_size)])
    finally:
        store.stop()
    # and a second restart keeps all of it
    store = _open(config)
    try:
        assert [e.is_hole for e in _entries(store)] == [False] * 7 + [True] * 3 + [False] * 2
    finally:
        store.stop()


# ---------------------------------------------------------------- 3a. recovery skips damage


@pytest.mark.parametrize("where", ["magic", "size", "crc", "body"])
def test_a_damaged_record_in_a_sealed_segment_is_skipped_and_reported(
        where: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    offsets, recs = _log_with_segments(tmp_path)
    victim = 3  # in the first (sealed) segment, with valid records after it
    path, pos = _segment_of(tmp_path, offsets[victim])
    _flip(path, pos + {"magic": 0, "size": 6, "crc": 9, "body": 90}[where])
    log = CommitLog(str(tmp_path), SystemClock(), segment_bytes=2000)
    with caplog.at_level(logging.ERROR):
        end = log.open()
    try:
        assert end == offsets[-1] + len(recs[-1])
        assert log.damaged_records == 1
        line = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        assert "damaged record" in line and path in line and str(offsets[victim]) in line
        for i, at in enumerate(offsets):  # nothing else was touched
            if i != victim:
                assert log.read(at, len(recs[i])) == recs[i]
    finally:
        log.close()


def test_a_damaged_record_in_the_newest_segment_is_skipped_not_truncated(
        tmp_path: Path) -> None:
    offsets, recs = _log_with_segments(tmp_path, n=10, segment_bytes=1 << 20)
    _flip(str(tmp_path / SEGMENT0), offsets[4] + 80)
    log = CommitLog(str(tmp_path), SystemClock())
    assert log.open() == offsets[-1] + len(recs[-1])
    assert log.damaged_records == 1
    log.close()


def test_scanning_works_across_read_chunks(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "SCAN_CHUNK", 150)  # smaller than one record
    offsets, recs = _log_with_segments(tmp_path, n=12, segment_bytes=1 << 20)
    _flip(str(tmp_path / SEGMENT0), offsets[2])
    _flip(str(tmp_path / SEGMENT0), offsets[6] + 70)
    with open(tmp_path / SEGMENT0, "ab") as f:
        f.write(recs[0][:100])  # and a torn tail
    log = CommitLog(str(tmp_path), SystemClock())
    assert log.open() == offsets[-1] + len(recs[-1])
    assert log.damaged_records == 2
    assert log.record_boundary(offsets[7] + 3) == offsets[7]
    log.close()


def test_a_torn_tail_of_any_length_is_truncated(tmp_path: Path) -> None:
    offsets, _ = _log_with_segments(tmp_path, n=3, segment_bytes=1 << 20)
    seg = tmp_path / SEGMENT0
    whole = seg.read_bytes()
    for cut in range(offsets[2] + 1, len(whole)):
        seg.write_bytes(whole[:cut])
        log = CommitLog(str(tmp_path), SystemClock())
        assert log.open() == offsets[2], cut
        assert log.damaged_records == 0
        log.close()
        os.remove(tmp_path / "checkpoint")


def test_a_record_forged_inside_a_damaged_body_is_not_picked_up(tmp_path: Path) -> None:
    # Given: a message whose body holds a valid record, and a damaged byte before it
    config = _config(tmp_path)
    store = _open(config)
    store.create_topic(Topic("t", 1))
    forged = encode_record(Message("FORGED", "t", b"evil"))
    sent = _put(store, 3)
    carrier = _put(store, 1, body=b"p" * 50 + forged + b"q" * 50)[0]
    sent += _put(store, 3)
    store.stop()
    os.remove(os.path.join(_log_dir(config), "checkpoint"))
    shutil.rmtree(os.path.join(config.data_dir, "consumequeue"))
    os.remove(os.path.join(config.data_dir, "checkpoint", "consumequeue"))
    _flip(os.path.join(_log_dir(config), SEGMENT0), carrier.commit_offset + 100)
    # When: recovery and the dispatcher go over it
    store = _open(config)
    try:
        # Then: the damaged record is reported once; the forged one never surfaces
        assert store.statistics().damaged_records == 1
        entries = _entries(store)
        assert [e.commit_offset for e in entries if not e.is_hole] == [
            m.commit_offset for m in sent]
        assert store.query_by_message_id("FORGED") == []
    finally:
        store.stop()


def test_whole_records_stops_at_a_cut_or_a_bad_record() -> None:
    a, b = (encode_record(Message(f"id{i}", "t", b"x" * 50)) for i in range(2))
    assert recovery.whole_records(a + b) == (len(a) + len(b), 0)
    assert recovery.whole_records(a + b[:30]) == (len(a), len(b))  # cut: read on
    assert recovery.whole_records(a + b[:5]) == (len(a), 0)
    bad = bytearray(b)
    bad[-1] ^= 1
    assert recovery.whole_records(a + bytes(bad) + a) == (len(a), -1)
    assert recovery.whole_records(b"\0" * 100) == (0, -1)


# ---------------------------------------------------------------- 3b. dispatch skips damage


def test_the_dispatcher_skips_a_damaged_record(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    # Given: a damaged record behind the CommitLog checkpoint, and a rebuild of the queues
    config, sent = _filled(tmp_path, 10, queues=2)
    path = os.path.join(_log_dir(config), SEGMENT0)
    _flip(path, sent[4].commit_offset)
    shutil.rmtree(os.path.join(config.data_dir, "consumequeue"))
    os.remove(os.path.join(config.data_dir, "checkpoint", "consumequeue"))
    # When: it opens and replays
    with caplog.at_level(logging.ERROR):
        store = _open(config)
    try:
        # Then: every other record is dispatched; the damaged one is reported once
        got = sorted(e.commit_offset for q in (0, 1) for e in _entries(store, q)
                     if not e.is_hole)
        assert got == [m.commit_offset for i, m in enumerate(sent) if i != 4]
        assert store.statistics().damaged_records == 1
        assert any("damaged record" in r.getMessage() and path in r.getMessage()
                   and str(sent[4].commit_offset) in r.getMessage() for r in caplog.records)
        new = _put(store, 1)  # and it keeps following the log
        assert store.dispatcher is not None
        assert store.dispatcher.dispatched_offset == new[0].commit_offset + new[0].record_size
    finally:
        store.stop()


def test_the_tier_dispatcher_skips_a_damaged_record(tmp_path: Path,
                                                    manual_clock: ManualClock) -> None:
    config, sent = _filled(tmp_path, 10, queues=2)
    _flip(os.path.join(_log_dir(config), SEGMENT0), sent[4].commit_offset)
    store = _open(config, clock=manual_clock)
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            os.path.join(config.data_dir, "tiered"), TierConfig(), manual_clock)
    tier.open()
    try:
        for _ in range(5):
            tier.step()
        tier.commit()
        assert tier.position() == store.commitlog.confirmed_offset
        other = 1 - sent[4].queue_id  # the queue without the damaged record: all of it
        assert len(tier.read("t", other, 0, 100)) == sum(m.queue_id == other for m in sent)
        # the rest of the damaged record's queue reaches the tier too, in order, and a
        # reader walks past the hole it left
        got, offset = [], 0
        while run := tier.read("t", sent[4].queue_id, offset, 100):
            got += [e.queue_offset for e in run]
            offset = run[-1].queue_offset + 1
        assert got == [m.queue_offset for m in sent
                       if m.queue_id == sent[4].queue_id and m is not sent[4]]
        assert store.statistics().damaged_records == 1
    finally:
        tier.stop()
        store.stop()


def test_a_record_bigger_than_a_tier_read_is_uploaded(tmp_path: Path,
                                                      manual_clock: ManualClock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import tiered.dispatcher
    monkeypatch.setattr(tiered.dispatcher, "READ_CHUNK", 1000)
    config, _ = _filled(tmp_path, 3)
    store = _open(config, clock=manual_clock)
    store.create_topic(Topic("big", 1))
    big = _put(store, 1, topic="big", body=b"b" * 5000)
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            os.path.join(config.data_dir, "tiered"), TierConfig(), manual_clock)
    tier.open()
    try:
        for _ in range(10):
            tier.step()
        tier.commit()
        assert tier.position() == big[0].commit_offset + big[0].record_size
        assert len(tier.read("big", 0, 0, 10)) == 1
    finally:
        tier.stop()
        store.stop()


# ---------------------------------------------------------------- 3c. reads report damage


def test_reads_raise_damaged_record_for_the_bad_record_only(tmp_path: Path) -> None:
    config, sent = _filled(tmp_path, 6)
    path = os.path.join(_log_dir(config), SEGMENT0)
    _flip(path, sent[2].commit_offset + 90)  # behind the checkpoint: recovery does not look
    store = _open(config)
    try:
        locations = [(m.commit_offset, m.record_size) for m in sent]
        with pytest.raises(DamagedRecord) as err:
            store.read_message(*locations[2])
        assert err.value.path == path and err.value.offset == sent[2].commit_offset
        with pytest.raises(DamagedRecord) as err:
            store.read_messages(locations)
        assert err.value.offset == sent[2].commit_offset
        got = store.read_messages_skipping(locations)
        assert isinstance(got[2], DamagedRecord)
        assert [m.message_id for i, m in enumerate(got) if i != 2] == [  # type: ignore[union-attr]
            m.message_id for i, m in enumerate(sent) if i != 2]
        assert store.read_messages(locations[3:]) != []
        # a wrong size for a good record is damage too (a bad ConsumeQueue entry)
        with pytest.raises(DamagedRecord):
            store.read_message(sent[3].commit_offset, sent[3].record_size - 1)
        assert store.statistics().damaged_records == 2  # re-reads are not counted again
    finally:
        store.stop()


# ---------------------------------------------------------------- 4. reads below retention


def test_queue_low_marks_follow_retention_after_a_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    config = _config(tmp_path, segment_bytes=4096, retention_bytes=8192)
    store = _open(config, clock=clock)
    store.create_topic(Topic("t", 1))
    for _ in range(20):
        _put(store, 5)
    assert store.dispatcher is not None
    store.dispatcher.catch_up()
    assert store.run_retention() > 0
    low = store.queue_bounds("t", 0)
    assert low[0] > 0
    store.stop()
    # When: restarted
    store = _open(config, clock=clock)
    try:
        # Then: the low mark still skips what local retention deleted
        assert store.queue_bounds("t", 0) == low
        first = store.consume_queue_entries("t", 0, 0, 1)[0]
        assert first.queue_offset == low[0]
        assert first.commit_offset >= store.commitlog.min_offset
    finally:
        store.stop()


def test_topic_retention_applies_on_open(tmp_path: Path) -> None:
    clock = ManualClock()
    config = _config(tmp_path)
    store = _open(config, clock=clock)
    store.create_topic(Topic("t", 1, retention_ms=60_000))
    _put(store, 5)
    store.stop()
    clock.advance(61_000)
    store = _open(config, clock=clock)
    try:
        assert store.queue_bounds("t", 0) == (5, 5)
    finally:
        store.stop()


def test_a_new_group_pops_from_the_tier_after_a_restart(tmp_path: Path,
                                                        manual_clock: ManualClock) -> None:
    from chronomq.broker import Broker
    from chronomq.config import BrokerConfig, TierConfig

    config = BrokerConfig(
        store=StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10,
                          cq_entries_per_file=100, retention_bytes=1),
        tier=TierConfig(provider="local", local_dir=str(tmp_path / "tier"), upload=True,
                        upload_batch_bytes=8 << 10, segment_bytes=32 << 10))
    # Given: everything uploaded, and local retention deleted most of the CommitLog
    broker = Broker(config, manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    broker.create_topic(Topic("t", 1))
    sent = []
    for b in range(8):  # batches that do not line up with the ConsumeQueue files
        infos = broker.store.put([Message("", "t", f"{b}-{i}".encode() * 30)
                                  for i in range(40)]).result(10)
        sent += [i.message_id for i in infos]
    assert broker.store.wait_visible(10) and broker.store.dispatcher is not None
    broker.store.dispatcher.catch_up()
    assert broker.tiered is not None
    while broker.tiered.step():
        pass
    broker.tiered.commit()
    assert broker.store.run_retention() > 0
    low = broker.store.queue_bounds("t", 0)[0]
    assert low % 100 != 0
    broker.stop()
    # When: it restarts and a new group pops
    broker = Broker(config, manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    try:
        got: list[str] = []
        while batch := broker.pop.pop("t", "late-group", 32, 60):
            got += [p.message.message_id for p in batch]
            broker.pop.ack_many("late-group", [p.receipt_handle for p in batch])
        # Then: it gets every message, the old ones from the tier
        assert got == sent
    finally:
        broker.stop()
