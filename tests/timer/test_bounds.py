"""What the timer keeps in memory stays bounded however many delayed messages pass
(issue 16): real RocksDB and store, manual clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.memtrace import rocksdb_figures
from store.clock import ManualClock
from store.message import Message, encode_record
from store.topics import Topic
from tests.timer.test_timer_service import WINDOW, Env
from tiered.providers.memory import MemoryProvider
from tiered.timerflatfile import TimerFlatFiles
from timer.store import WRITE_BUFFER_BYTES, TimerStore


def memtable_bytes(store: TimerStore) -> int:
    return rocksdb_figures({"timer": store.kv})["timer"]["memtables"]


def test_timer_store_memtables_stay_within_two_write_buffers(tmp_path: Path) -> None:
    # Given a timer store taking 48 MB of delayed records, as a busy minute does
    store = TimerStore(str(tmp_path / "timer"))
    record = os.urandom(1200)
    most = 0
    try:
        for batch in range(40):
            entries = [(f"id-{batch}-{i}", 1_000 + i, batch * 1000 + i, record)
                       for i in range(1000)]
            store.add(entries, position=batch)
            most = max(most, memtable_bytes(store))
    finally:
        store.close()
    # Then RocksDB never held more than two write buffers of it in memory (the 64 MiB
    # default held all of it)
    assert most <= 2 * WRITE_BUFFER_BYTES + (1 << 20)


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    e.broker.create_topic(Topic("t", 1))
    yield e
    e.broker.stop()


def test_the_wheel_holds_only_the_window_ahead(env: Env) -> None:
    # Given 600 messages due over the next ten minutes, one a second
    for i in range(600):
        env.send(b"x", delay_ms=(i + 1) * 1000)
    env.broker.store.wait_visible(10)
    for _ in range(10):
        # When the timer loads and delivers at each minute
        now = env.clock.now_ms()
        while not env.timer.load_due(now):
            pass
        env.timer.deliver_due(now)
        # Then the wheel holds the next minute (timer.wheel_window_ms) only
        assert env.timer.statistics().pending_wheel <= WINDOW // 1000 + 1
        env.clock.advance(WINDOW)


def test_damaged_flat_file_objects_are_forgotten_when_their_bucket_goes() -> None:
    # Given a TimerFlatFile bucket whose one object turned out damaged
    provider = MemoryProvider()
    flat = TimerFlatFiles(provider, 3_600_000)
    path = flat.append(3_600_000, [(100, encode_record(Message("id", "t", b"x")))])
    provider.write(path, b"\0" * 64)
    assert list(flat.read_bucket(3_600_000)) == []
    # When the preload drops the bucket
    flat.drop_bucket(3_600_000, flat.objects(3_600_000))
    # Then the damage is still counted, but memory no longer holds the object's name
    assert flat.statistics().damaged_objects == 1
    assert not flat._damaged
