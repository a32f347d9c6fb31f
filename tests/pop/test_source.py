"""QueueSource on its own, on a real store (local disk; the tier paths run in
tests/tiered through the broker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pop.model import Requeue, placeholder
from pop.source import QueueBounds, QueueSource
from store.clock import ManualClock
from store.message import Message
from store.queues import tag_hash
from store.store import MessageStore, StoreConfig
from store.topics import Topic


@pytest.fixture
def store(tmp_path: Path, manual_clock: ManualClock) -> Iterator[MessageStore]:
    s = MessageStore(StoreConfig(str(tmp_path / "data")), manual_clock)
    s.open()
    s.start()
    s.create_topic(Topic("t", 1))
    s.put([Message("", "t", f"m{i}".encode(), tag="a" if i % 2 else "b")
           for i in range(4)]).result(10)
    assert s.wait_visible(10)
    yield s
    s.stop()


def test_bounds_of_a_local_queue(store: MessageStore) -> None:
    assert QueueSource(store).bounds("t", 0) == QueueBounds(0, 0, 4)


def test_rows_first_then_only_the_picked_messages(store: MessageStore) -> None:
    rows, load = QueueSource(store).read_rows("t", 0, 1, 10, 0)
    assert rows == [(1, tag_hash("a")), (2, tag_hash("b")), (3, tag_hash("a"))]
    picked = load([0, 2])
    assert [m.body if m else None for m in picked] == [b"m1", b"m3"]


def test_fill_loads_each_entry_and_names_the_lost(store: MessageStore) -> None:
    there = Requeue("G", "t", 0, 2, 1, placeholder(), 0, None)  # queue offset 3
    gone = Requeue("G", "t", 0, 8, 0, placeholder(), 0, None)  # never written
    assert QueueSource(store).fill([there, gone]) == [gone]
    assert (there.message.body, there.message.queue_offset) == (b"m3", 3)
    assert gone.message.body == b""
