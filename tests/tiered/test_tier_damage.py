"""Damaged tier objects: a TimerFlatFile or a tiered queue object cut short (or with a
flipped byte) costs only the entries it damaged.  What is still whole is read and
delivered, the damage is logged at ERROR with the object and the byte and counted, and
nothing waits on it: the timer keeps delivering other buckets, Pop keeps serving other
queue offsets.  Real providers (memory, local directory), real RocksDB, a manual clock."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from store.clock import ManualClock
from store.consumequeue import ENTRY
from store.message import Draft, Message, decode_record, draft_of, encode_record
from store.store import StoreConfig
from store.topics import Topic
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider
from tiered.queue import TieredEntry, TieredQueue
from tiered.readahead import ReadAheadCache
from tiered.timerflatfile import TimerFlatFiles
from timer.model import TimerConfig

SEC = 1000
BUCKET_MS = 5 * SEC


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _cut(provider: Provider, path: str, keep: int) -> None:
    """Replace the object by its first ``keep`` bytes (what a faulty copy leaves)."""
    provider.write(path, provider.read(path)[:keep])


def _flip(provider: Provider, path: str, at: int) -> None:
    data = bytearray(provider.read(path))
    data[at] ^= 0xFF
    provider.write(path, bytes(data))


# ---------------------------------------------------------------------- TimerFlatFiles


def _timer_record(i: int) -> bytes:
    return encode_record(Message(f"id{i}", "t", f"body-{i}".encode() * 10,
                                 deliver_at_ms=BUCKET_MS + i))


def _entry_ends(records: list[tuple[int, bytes]]) -> list[int]:
    """Where each entry (8-byte offset + record) of one object ends."""
    ends, at = [], 0
    for _, r in records:
        at += 8 + len(r)
        ends.append(at)
    return ends


def test_a_cut_timer_flat_file_yields_every_whole_entry_for_every_cut() -> None:
    # Given one bucket with one object of four entries and a second object
    provider = MemoryProvider()
    flat = TimerFlatFiles(provider, BUCKET_MS)
    records = [(1000 + 300 * i, _timer_record(i)) for i in range(4)]
    path = flat.append(BUCKET_MS, records)
    other = [(9000, _timer_record(9))]
    flat.append(BUCKET_MS, other)
    whole = provider.read(path)
    ends = _entry_ends(records)
    # When the first object is cut at every length from one byte short to empty
    for keep in range(len(whole) - 1, -1, -1):
        provider.write(path, whole[:keep])
        got = list(flat.read_bucket(BUCKET_MS))
        # Then every entry that ends within what is left is read, then the other object
        survivors = [r for r, end in zip(records, ends, strict=True) if end <= keep]
        assert got == survivors + other, keep
    # and the damage is counted once per object
    assert flat.statistics().damaged_objects == 1


def test_a_flipped_byte_costs_only_its_entry(caplog: pytest.LogCaptureFixture) -> None:
    provider = MemoryProvider()
    flat = TimerFlatFiles(provider, BUCKET_MS)
    records = [(1000 + 300 * i, _timer_record(i)) for i in range(4)]
    path = flat.append(BUCKET_MS, records)
    second = _entry_ends(records)[0]
    _flip(provider, path, second + 8 + 70)  # inside the second entry's record
    with caplog.at_level(logging.ERROR):
        got = list(flat.read_bucket(BUCKET_MS, flat.objects(BUCKET_MS)))
    assert got == [records[0], *records[2:]]  # reading resumes at the next valid entry
    assert any(path in m and f"at byte {second}" in m for m in _errors(caplog))
    assert flat.statistics().damaged_objects == 1


def test_a_cut_object_is_logged_with_its_path_and_byte(caplog: pytest.LogCaptureFixture,
                                                       tmp_path: Path) -> None:
    provider = LocalProvider(str(tmp_path / "tier"))
    flat = TimerFlatFiles(provider, BUCKET_MS)
    records = [(1000 + 300 * i, _timer_record(i)) for i in range(3)]
    path = flat.append(2 * BUCKET_MS, records)
    ends = _entry_ends(records)
    (tmp_path / "tier" / path).write_bytes(provider.read(path)[: ends[1] + 30])
    flat.recover()  # as after a restart
    with caplog.at_level(logging.ERROR):
        assert list(flat.read_bucket(2 * BUCKET_MS)) == records[:2]
    assert any(path in m and f"at byte {ends[1]}" in m for m in _errors(caplog))
    # dropping the bucket after its valid entries are safe removes the damaged object too
    flat.drop_bucket(2 * BUCKET_MS, flat.objects(2 * BUCKET_MS))
    assert provider.list("timer/") == [] and flat.statistics().buckets == 0


TIMER = TimerConfig(wheel_window_ms=5 * SEC, rocks_horizon_ms=10 * SEC, bucket_ms=BUCKET_MS,
                    preload_ahead_ms=5 * SEC, flat_batch_ms=0)


@pytest.fixture
def timer_broker(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Broker]:
    broker = Broker(BrokerConfig(store=StoreConfig(str(tmp_path / "data")), timer=TIMER,
                                 tier=TierConfig(provider="local",
                                                 local_dir=str(tmp_path / "tier"))),
                    manual_clock)
    broker.open()
    broker.start(timer_thread=False)
    broker.create_topic(Topic("t", 2))
    yield broker
    broker.stop()


def _send_far(broker: Broker, clock: ManualClock, delays_s: list[int]) -> None:
    """One batch of far-future messages (body = delay): parked in TimerFlatFiles."""
    now = clock.now_ms()
    drafts = []
    for s in delays_s:
        due, flags = broker.sender.resolve_deliver_at(0, s * SEC, now)
        drafts.append(Draft("", "t", "", "", str(s).encode() * 40, b"", now, due, flags, 0,
                            b""))
    broker.sender.send(drafts).result(10)
    assert broker.store.wait_visible(10)
    broker.timer.write_parked()


def _tick(broker: Broker, clock: ManualClock) -> list[bytes]:
    now = clock.now_ms()
    broker.timer.preload_due(now)
    while not broker.timer.load_due(now):
        broker.timer.deliver_due(now)
    broker.timer.deliver_due(now)
    assert broker.store.wait_visible(10)
    got = broker.pop.pop("t", "g", 32, 60)
    broker.pop.ack_many("g", [p.receipt_handle for p in got])
    return sorted(p.message.body[:2] for p in got)


def test_the_timer_delivers_what_survives_and_every_other_bucket(
        timer_broker: Broker, manual_clock: ManualClock,
        caplog: pytest.LogCaptureFixture) -> None:
    broker, clock = timer_broker, manual_clock
    # Given three far-future messages in the bucket [30 s, 35 s) (one object), and two in
    # the bucket [40 s, 45 s)
    _send_far(broker, clock, [30, 31, 32])
    _send_far(broker, clock, [40, 41])
    objects = broker.tier.list("broker-0/timer/")
    assert len(objects) == 2
    first = objects[0]
    # When the first object is cut inside its last entry
    data = broker.tier.read(first)
    broker.tier.write(first, data[: len(data) - 50])
    # Then, as time passes, the two whole entries and the other bucket are delivered on time
    delivered: dict[int, list[bytes]] = {}
    with caplog.at_level(logging.ERROR):
        for t in range(1, 46):
            clock.advance(SEC)
            if got := _tick(broker, clock):
                delivered[t] = got
    assert delivered == {30: [b"30"], 31: [b"31"], 40: [b"40"], 41: [b"41"]}
    # and the damage is logged with the object and the byte, and counted
    assert any(first in m and "at byte" in m for m in _errors(caplog))
    assert broker.flat_files.statistics().damaged_objects == 1
    assert broker.tier.list("broker-0/timer/") == []  # nothing left waiting


# ---------------------------------------------------------------------- tiered queues


def _record(qo: int) -> bytes:
    return encode_record(Message(f"id{qo}", "t", f"body-{qo}".encode() * 8, queue_offset=qo,
                                 store_at_ms=1000 + qo))


def _queue(provider: Provider, n: int = 60, batch: int = 10) -> TieredQueue:
    """Queue offsets 0..n-1, committed ``batch`` at a time: one log and one cq object
    per batch."""
    q = TieredQueue(provider, "b0", "t", 0, segment_bytes=1 << 20)
    for qo in range(n):
        q.append(qo, _record(qo), 0, 1000 + qo)
        if qo % batch == batch - 1:
            assert q.commit()
    return q


def _read_all(read: object, chunk: int = 7) -> list[int]:
    """Read the way Pop does: from where the last read ended, until nothing is left."""
    got: list[int] = []
    at = 0
    while batch := read(at, chunk):  # type: ignore[operator]
        offsets = [e.queue_offset for e in batch]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # unbroken
        assert offsets[0] >= at
        got += offsets
        at = offsets[-1] + 1
    return got


def _where(q: TieredQueue, qo: int) -> tuple[str, int, int]:
    """The log object holding ``qo``'s record, where it starts in it, and its size."""
    pos, size, _, _ = ENTRY.unpack(q.cq.read(qo * ENTRY.size, ENTRY.size))
    path, offset = q.log.locate(pos)
    return path, offset, size


def test_a_cut_log_object_costs_only_the_records_it_cut_for_every_cut() -> None:
    provider = MemoryProvider()
    q = _queue(provider)
    meta = q.to_json()
    path, _, _ = _where(q, 20)  # the object of queue offsets 20..29
    whole = provider.read(path)
    layout = [_where(q, qo) for qo in range(60)]
    for keep in range(len(whole) - 1, -1, -7):
        provider.write(path, whole[:keep])
        fresh = TieredQueue(provider, "b0", "t", 0, meta)  # as after a restart
        lost = {qo for qo, (p, at, size) in enumerate(layout) if p == path and at + size > keep}
        assert _read_all(fresh.read) == [qo for qo in range(60) if qo not in lost], keep
        assert fresh.damaged_objects == 1
    provider.write(path, whole)


def test_a_cut_log_object_is_reported_and_reads_go_on_past_it(
        caplog: pytest.LogCaptureFixture) -> None:
    provider = MemoryProvider()
    q = _queue(provider)
    path, at, size = _where(q, 24)
    _cut(provider, path, at + size // 2)  # inside the record of queue offset 24
    with caplog.at_level(logging.ERROR):
        assert [e.queue_offset for e in q.read(0, 100)] == list(range(24))
        assert [e.queue_offset for e in q.read(24, 100)] == list(range(30, 60))
        assert [e.queue_offset for e in q.read(26, 1)] == [30]  # a read at the damage
    assert [decode_record(e.record).body for e in q.read(30, 2)] == [
        decode_record(_record(30)).body, decode_record(_record(31)).body]
    errors = _errors(caplog)
    assert any(path in m and f"byte {at + size // 2}" in m for m in errors)
    assert any("24..29" in m for m in errors)  # the queue offsets it cost
    assert q.damaged_objects == 1


def test_a_cut_consume_queue_object_costs_only_its_missing_entries(
        caplog: pytest.LogCaptureFixture) -> None:
    provider = MemoryProvider()
    q = _queue(provider)
    path, offset = q.cq.locate(45 * ENTRY.size)
    assert offset == 5 * ENTRY.size  # the object of entries 40..49
    _cut(provider, path, offset + ENTRY.size // 2)  # in the middle of entry 45
    with caplog.at_level(logging.ERROR):
        assert _read_all(q.read) == [*range(45), *range(50, 60)]
    assert any(path in m and f"byte {offset + ENTRY.size // 2}" in m for m in _errors(caplog))
    assert q.damaged_objects == 1


def test_a_missing_object_and_a_bad_record_are_skipped_too() -> None:
    provider = MemoryProvider()
    q = _queue(provider)
    provider.delete(_where(q, 5)[0])  # queue offsets 0..9 gone
    path, at, _ = _where(q, 33)
    _flip(provider, path, at + 40)  # a header byte of queue offset 33's record
    assert _read_all(q.read) == [*range(10, 33), *range(34, 60)]
    assert q.damaged_objects == 2


def test_everything_damaged_from_an_offset_reads_as_nothing() -> None:
    provider = MemoryProvider()
    q = _queue(provider, n=20)
    for qo in (10, 15):  # the last two objects cut to nothing
        _cut(provider, _where(q, qo)[0], 0)
    assert q.read(10, 5) == [] and q.read(12, 1) == []
    assert _read_all(q.read) == list(range(10))


def test_the_read_ahead_cache_never_returns_a_broken_run(manual_clock: ManualClock) -> None:
    provider = MemoryProvider()
    q = _queue(provider)
    path, at, _ = _where(q, 24)
    _cut(provider, path, at)  # queue offsets 24..29 gone
    cache = ReadAheadCache(lambda t, qid, qo, n: q.read(qo, n), manual_clock, min_window=4,
                           max_window=16)

    def read(qo: int, n: int) -> list[TieredEntry]:
        return cache.read("t", 0, qo, n)
    assert _read_all(read, chunk=5) == [*range(24), *range(30, 60)]
    assert _read_all(read, chunk=3) == [*range(24), *range(30, 60)]  # from memory too


# ---------------------------------------------------------------------- Pop over the tier


def _tiered_broker(tmp_path: Path, clock: ManualClock) -> tuple[Broker, list[str]]:
    """400 messages of one queue in the tier, most of them gone from local disk."""
    store = StoreConfig(str(tmp_path / "data"), segment_bytes=16 << 10,
                        cq_entries_per_file=50, retention_bytes=1)
    tier = TierConfig(provider="local", local_dir=str(tmp_path / "tier"), upload=True,
                      upload_batch_bytes=8 << 10, segment_bytes=32 << 10)
    broker = Broker(BrokerConfig(store=store, tier=tier), clock)
    broker.open()
    broker.start(timer_thread=False)
    broker.create_topic(Topic("t", 1))
    infos = []
    for b in range(8):
        infos += broker.sender.send([draft_of(Message("", "t", f"{b}-{i}".encode() * 60))
                                     for i in range(50)]).result(10)
    assert broker.store.wait_visible(10) and broker.store.dispatcher is not None
    broker.store.dispatcher.catch_up()
    assert broker.tiered is not None
    while broker.tiered.step():
        pass
    broker.tiered.commit()
    assert broker.store.run_retention() > 0
    return broker, [i.message_id for i in infos]


def test_pop_delivers_everything_but_the_damaged_records_of_the_tier(
        tmp_path: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    broker, sent = _tiered_broker(tmp_path, manual_clock)
    try:
        assert broker.tiered is not None
        q = broker.tiered.queue("t", 0)
        assert q is not None
        local_low = broker.store.queue_bounds("t", 0)[0]
        assert local_low > 150  # what Pop reads below this comes from the tier
        # Given a log object cut inside a record and a cq object cut inside an entry, both
        # in what only the tier still holds
        log_path, at, _ = _where(q, 30)
        layout = {qo: _where(q, qo) for qo in range(local_low)}
        log_lost = {qo for qo, (p, o, n) in layout.items() if p == log_path and o + n > at + 10}
        _cut(broker.tier, log_path, at + 10)
        cq_path, cq_at = q.cq.locate(120 * ENTRY.size)
        _cut(broker.tier, cq_path, cq_at + 3)
        cq_lost = {qo for qo in range(120, local_low)
                   if q.cq.locate(qo * ENTRY.size)[0] == cq_path}
        assert log_lost and cq_lost
        # When a group pops everything
        got: list[str] = []
        with caplog.at_level(logging.ERROR):
            while batch := broker.pop.pop("t", "g", 32, 60):
                got += [p.message.message_id for p in batch]
                broker.pop.ack_many("g", [p.receipt_handle for p in batch])
        # Then it gets every message but the damaged ones, in order, each once
        lost = log_lost | cq_lost
        assert got == [m for qo, m in enumerate(sent) if qo not in lost]
        errors = _errors(caplog)
        assert any(log_path in m and f"byte {at + 10}" in m for m in errors)
        assert any(cq_path in m and f"byte {cq_at + 3}" in m for m in errors)
        assert broker.tiered.statistics().damaged_objects == 2
        # and the queue goes on: a new message is delivered
        (info,) = broker.sender.send([draft_of(Message("", "t", b"after"))]).result(10)
        assert broker.store.wait_visible(10)
        assert [p.message.message_id for p in broker.pop.pop("t", "g", 32, 60)] == [
            info.message_id]
    finally:
        broker.stop()


def test_pop_goes_on_at_local_disk_when_the_rest_of_the_tier_is_damaged(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    broker, sent = _tiered_broker(tmp_path, manual_clock)
    try:
        assert broker.tiered is not None
        q = broker.tiered.queue("t", 0)
        assert q is not None
        local_low = broker.store.queue_bounds("t", 0)[0]
        # Given every log object from the one holding queue offset 100 on cut to nothing:
        # the tier has no readable record from there to its end
        layout = {qo: _where(q, qo) for qo in range(len(sent))}
        first = layout[100][0]
        doomed = sorted({p for p, _, _ in layout.values() if p >= first})
        for path in doomed:
            _cut(broker.tier, path, 0)
        # When a group pops everything
        got: list[str] = []
        while batch := broker.pop.pop("t", "g", 32, 60):
            got += [p.message.message_id for p in batch]
            broker.pop.ack_many("g", [p.receipt_handle for p in batch])
        # Then it gets what the tier still has, then goes on with what local disk has
        lost = {qo for qo, (p, _, _) in layout.items() if p in doomed and qo < local_low}
        assert got == [m for qo, m in enumerate(sent) if qo not in lost]
        assert got[-1] == sent[-1]
    finally:
        broker.stop()
