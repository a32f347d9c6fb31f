"""Message ids after a torn tail: a new record that takes a lost record's CommitLog offset
never gets its id, even in the same millisecond, and the dedupe entry of a client-chosen
id whose record was lost does not count.  Real store on real files, manual clock."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from store.clock import ManualClock
from store.index import DedupeEntry, decode_dedupe, encode_dedupe
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic

SEGMENT0 = f"{0:020d}.log"


def _config(tmp_path: Path, flush: str = "sync") -> StoreConfig:
    return StoreConfig(str(tmp_path / "data"), segment_bytes=1 << 20, cq_entries_per_file=100,
                       flush=flush)


def _open(config: StoreConfig, clock: ManualClock) -> MessageStore:
    store = MessageStore(config, clock)
    store.open()
    store.start()
    return store


def _tear(config: StoreConfig, at: int) -> None:
    """A torn tail: the record at ``at`` is cut in its middle, and the CommitLog's
    checkpoint says nothing past ``at`` was fsynced (a power cut after the write)."""
    log_dir = os.path.join(config.data_dir, "commitlog")
    os.truncate(os.path.join(log_dir, SEGMENT0), at + 20)
    os.remove(os.path.join(log_dir, "checkpoint"))


def _send(store: MessageStore, *messages: Message) -> list[str]:
    infos = store.put(list(messages)).result(10)
    assert store.wait_visible(10)
    return [i.message_id for i in infos]


def test_a_lost_records_id_is_not_given_again_in_the_same_millisecond(
        tmp_path: Path) -> None:
    # Given: three records written at one millisecond, the last lost in a torn tail
    clock = ManualClock()
    config = _config(tmp_path)
    store = _open(config, clock)
    store.create_topic(Topic("t", 1))
    infos = store.put([Message("", "t", f"m{i}".encode()) for i in range(3)]).result(10)
    store.stop()
    _tear(config, infos[2].commit_offset)
    # When: the store starts again and writes, the clock still at that millisecond
    store = _open(config, clock)
    try:
        (again,) = store.put([Message("", "t", b"new")]).result(10)
        # Then: the new record took the lost offset, not the lost id
        assert again.commit_offset == infos[2].commit_offset
        assert again.message_id not in {i.message_id for i in infos}
        assert store.query_by_message_id(infos[2].message_id) == []
        assert [m.body for m in store.query_by_message_id(again.message_id)] == [b"new"]
    finally:
        store.stop()


def test_ids_stay_unique_across_many_starts_with_a_clock_that_stands_still(
        tmp_path: Path) -> None:
    clock = ManualClock()
    config = _config(tmp_path)
    seen: set[str] = set()
    for _ in range(5):
        store = _open(config, clock)
        store.create_topic(Topic("t", 1))
        infos = store.put([Message("", "t", b"x") for _ in range(2)]).result(10)
        store.stop()
        ids = {i.message_id for i in infos}
        assert not ids & seen
        seen |= ids
        _tear(config, infos[1].commit_offset)


def test_the_dedupe_entry_of_a_lost_record_does_not_count(tmp_path: Path) -> None:
    # Given: a client-chosen id whose record is lost in a torn tail (flush = async)
    clock = ManualClock()
    config = _config(tmp_path, flush="async")
    store = _open(config, clock)
    store.create_topic(Topic("t", 1))
    _send(store, Message("kept-1", "t", b"kept"))
    (lost,) = store.put([Message("lost-1", "t", b"lost")]).result(10)
    assert store.wait_visible(10)
    assert store.stored_at([("t", "lost-1")]) == [clock.now_ms()]
    store.stop()
    _tear(config, lost.commit_offset)
    # When: the store starts again
    store = _open(config, clock)
    try:
        # Then: only the surviving record counts for the dedupe
        assert store.stored_at([("t", "kept-1"), ("t", "lost-1")]) == [clock.now_ms(), None]
        # and a resend of the lost id is stored and counts from then on
        clock.advance(5)
        _send(store, Message("lost-1", "t", b"resent"))
        assert store.stored_at([("t", "lost-1")]) == [clock.now_ms()]
        assert [m.body for m in store.query_by_message_id("lost-1")] == [b"resent"]
    finally:
        store.stop()


def test_a_dedupe_entry_pointing_into_another_record_does_not_count(tmp_path: Path) -> None:
    # Given: a lost record's offset taken by a longer record of the next run
    clock = ManualClock()
    config = _config(tmp_path, flush="async")
    store = _open(config, clock)
    store.create_topic(Topic("t", 1))
    _send(store, Message("a", "t", b"a"))
    (lost,) = store.put([Message("lost-2", "t", b"short")]).result(10)
    assert store.wait_visible(10)
    store.stop()
    _tear(config, lost.commit_offset)
    store = _open(config, clock)
    try:
        _send(store, Message("", "t", b"z" * 500), Message("other", "t", b"y"))
        # Then: the stale entry names bytes that are no record of that id
        assert store.stored_at([("t", "lost-2")]) == [None]
    finally:
        store.stop()


@given(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1), st.integers(0, 2**32 - 1))
def test_dedupe_entries_round_trip(store_at_ms: int, offset: int, size: int) -> None:
    entry = DedupeEntry(store_at_ms, offset, size)
    assert decode_dedupe(encode_dedupe(entry)) == entry
    # an entry written before entries held the location: its time, no location
    assert decode_dedupe(store_at_ms.to_bytes(8, "big")) == DedupeEntry(store_at_ms, -1, 0)
