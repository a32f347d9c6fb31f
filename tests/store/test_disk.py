"""DiskGuard's watermarks and reserve file (an injected free-space probe over a real
directory, and the manual clock), and the store on a real volume that fills up (a
tmpfs): a write refused for want of space leaves no hole and no garbage."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.disk import RESERVE_FILE, DiskGuard, statvfs_probe
from store.errors import InvalidArgument, ResourceExhausted
from store.message import Message, draft_of
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tests.conftest import fill_volume

MB = 1 << 20


class Volume:
    """A free-space reading the test sets: ``(total, free)`` for the guard's probe."""

    def __init__(self, total: int, free: int) -> None:
        self.total, self.free = total, free

    def __call__(self, path: str) -> tuple[int, int]:
        assert os.path.isdir(path)
        return self.total, self.free


def guard(tmp_path: Path, vol: Volume, clock: ManualClock, **kw: int) -> DiskGuard:
    return DiskGuard(str(tmp_path), clock, 0.9, 0.8, reserve_bytes=kw.get("reserve", 4 * MB),
                     probe_interval_ms=kw.get("interval", 0), probe=vol)


def test_sends_are_refused_at_the_watermark_and_resume_below_it(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    vol = Volume(100 * MB, 50 * MB)
    g = guard(tmp_path, vol, manual_clock, reserve=0)
    g.check_send(30 * MB)
    assert not g.should_clean()
    with pytest.raises(ResourceExhausted, match=rf"{tmp_path}.*is 50\.0% used"):
        g.check_send(40 * MB)  # this request would cross the mark
    vol.free = 15 * MB
    assert g.should_clean()
    vol.free = 9 * MB
    with pytest.raises(ResourceExhausted, match=r"91\.0% used"):
        g.check_send()
    assert g.refresh().refusing_sends and g.refresh().refused_sends == 2
    vol.free = 30 * MB  # retention or the operator freed space
    g.check_send(MB)
    assert not g.refresh().refusing_sends


def test_readings_are_spaced_by_the_probe_interval(tmp_path: Path,
                                                   manual_clock: ManualClock) -> None:
    vol = Volume(100 * MB, 50 * MB)
    g = guard(tmp_path, vol, manual_clock, reserve=0, interval=100)
    assert g.refresh().free_bytes == 50 * MB
    vol.free = 5 * MB
    assert g.refresh().free_bytes == 50 * MB
    manual_clock.advance(100)
    assert g.refresh().free_bytes == 5 * MB
    vol.free = 60 * MB
    assert g.refresh(force=True).free_bytes == 60 * MB


def test_the_reserve_is_released_when_space_is_short_and_comes_back(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    path = tmp_path / RESERVE_FILE
    vol = Volume(200 * MB, 100 * MB)
    g = guard(tmp_path, vol, manual_clock)
    s = g.refresh()
    assert path.stat().st_size == s.reserve_bytes == 4 * MB
    assert s.free_bytes == 96 * MB  # what the probe said, less the file just made
    assert s.used_ratio == pytest.approx(0.5)  # the reserve does not count as use
    vol.free = 3 * MB  # someone else filled the volume
    s = g.refresh()
    assert not path.exists() and s.reserve_bytes == 0 and s.reserve_releases == 1
    assert s.free_bytes == 7 * MB
    vol.free = 7 * MB  # not yet twice the reserve: no flapping
    assert not path.exists() and g.refresh().reserve_bytes == 0
    vol.free = 9 * MB
    assert g.refresh().reserve_bytes == 4 * MB and path.exists()


def test_the_reserve_takes_at_most_a_twentieth_of_the_volume(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    g = guard(tmp_path, Volume(40 * MB, 30 * MB), manual_clock, reserve=64 * MB)
    assert g.refresh().reserve_bytes == 2 * MB


def test_a_start_on_a_nearly_full_volume_releases_the_reserve_first(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    (tmp_path / RESERVE_FILE).write_bytes(b"\0" * (4 * MB))
    vol = Volume(200 * MB, 5 * MB)
    g = guard(tmp_path, vol, manual_clock)
    g.release_if_short()
    assert not (tmp_path / RESERVE_FILE).exists()
    assert g.refresh().reserve_releases == 1


def test_watermarks_must_be_ordered(tmp_path: Path, manual_clock: ManualClock) -> None:
    with pytest.raises(InvalidArgument, match="disk_clean_ratio"):
        DiskGuard(str(tmp_path), manual_clock, max_used_ratio=0.7, clean_ratio=0.8)


def test_a_write_that_finds_the_volume_full_leaves_no_hole_and_no_garbage(
        small_volume: Callable[[int], Path]) -> None:
    vol = small_volume(16)
    config = StoreConfig(data_dir=str(vol / "data"), segment_bytes=64 * MB)
    clock = ManualClock()
    store = MessageStore(config, clock)
    store.open()
    store.start()
    store.create_topic(Topic("t", 1))
    body = b"x" * (256 << 10)
    before = store.put([Message("", "t", body)]).result()
    filler = vol / "filler"
    fill_volume(filler)
    with pytest.raises(ResourceExhausted, match="is full"):
        store.put([Message("", "t", body) for _ in range(4)]).result()
    filler.unlink()
    after = store.put([Message("", "t", b"after")]).result()  # no restart needed
    assert [i.queue_offset for i in before + after] == [0, 1]  # the refused took none
    store.stop()
    store = MessageStore(config, clock)
    store.open()
    try:
        entries = store.queues.queue("t", 0).get(0, 10)
        assert [e.queue_offset for e in entries] == [0, 1]
        found = store.read_messages([(e.commit_offset, e.record_size) for e in entries])
        assert [m.body for m in found] == [body, b"after"]
        assert store.statistics().damaged_records == 0
    finally:
        store.stop()


def test_early_retention_keeps_data_younger_than_retention(
        small_volume: Callable[[int], Path]) -> None:
    vol = small_volume(16)
    store = StoreConfig(str(vol / "data"), segment_bytes=MB, disk_reserve_bytes=0,
                        disk_clean_ratio=0.3, disk_max_used_ratio=0.9)
    broker = Broker(BrokerConfig(store=store), ManualClock())
    broker.open()
    broker.start(timer_thread=False)
    try:
        broker.create_topic(Topic("t", 1))
        while not broker.disk.should_clean():
            broker.sender.send([draft_of(Message("", "t", b"b" * (64 << 10)))
                                for _ in range(8)]).result(10)
        assert broker.store.wait_visible(10)
        assert broker.store.dispatcher is not None
        broker.store.dispatcher.catch_up()
        broker.watch_disk()
        assert broker.store.commitlog.min_offset == 0  # nothing is past its retention
    finally:
        broker.stop()


def test_the_probe_counts_use_as_df_does(tmp_path: Path) -> None:
    """Blocks reserved for root are neither used nor free to us: a volume with most of
    its free space reserved must not read as nearly full (it read 81 % on a 38 % disk)."""
    total, free = statvfs_probe(str(tmp_path))
    usage = shutil.disk_usage(tmp_path)
    assert abs(total - (usage.used + usage.free)) < 64 * MB
    assert abs(free - usage.free) < 64 * MB
