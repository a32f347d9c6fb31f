"""The broker's start is one place: constructing it touches nothing, ``open`` does all the
I/O, and an ``open`` that fails part-way closes what it opened and raises one error."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.store import StoreConfig
from store.topics import Topic
from tiered.config import TierConfig


def _config(root: Path, upload: bool) -> BrokerConfig:
    return BrokerConfig(store=StoreConfig(str(root / "data")),
                        tier=TierConfig(local_dir=str(root / "tier"), upload=upload))


def test_constructing_a_broker_touches_no_file(tmp_path: Path) -> None:
    # When a broker is built from its configuration
    Broker(_config(tmp_path, upload=True), ManualClock())
    # Then neither its data directory nor its tier exists yet
    assert list(tmp_path.iterdir()) == []


def test_a_failed_open_closes_what_it_opened(tmp_path: Path) -> None:
    # Given a data directory where the tier upload's metadata folder cannot be made
    # (its place is taken by a file), so open fails after RocksDB and the timer opened
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tiered").write_bytes(b"not a folder")
    broker = Broker(_config(tmp_path, upload=True), ManualClock())
    # When it opens, Then one error names what failed
    with pytest.raises(OSError, match="tiered"):
        broker.open()
    # And nothing stays held: a broker on the same data directory opens (RocksDB's locks
    # were released) and works
    again = Broker(_config(tmp_path, upload=False), ManualClock())
    again.open()
    try:
        again.start(timer_thread=False)
        topic, created = again.create_topic(Topic("t", 1))
        assert created and again.topic("t") == topic
    finally:
        again.stop()
