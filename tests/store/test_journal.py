"""The delayed stream, the journal and durable-ack waits, on a real store and tier.

- delayed records take the delayed stream's offsets and go up in it (the tier holds every
  pending one); without the stream they stay out of the tier until delivered;
- journal records replay to the same state (``JournalState``), deletes and resets too;
- ``wait_durable`` returns only once the tier has the record, and fails with
  ``TierUnavailable`` while the tier refuses it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from store.clock import ManualClock
from store.journal import (
    POP,
    POP_RESET,
    JournalState,
    StateJournal,
    decode_ops,
    encode_ops,
)
from store.message import FLAG_DELAYED, Message, decode_record
from store.names import DELAYED_STREAM, SYSTEM_STREAMS
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tests.tiered.faults import FaultyProvider
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.errors import TierUnavailable
from tiered.providers.local import LocalProvider


def _open(root: Path, clock: ManualClock, provider: object | None = None,
          durable: bool = True) -> tuple[MessageStore, TieredDispatcher]:
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, provider or LocalProvider(str(root / "tier")),  # type: ignore[arg-type]
                            "b0", str(root / "data" / "tiered"),
                            TierConfig(upload=True, durable_ack=durable, upload_timeout_s=1.0),
                            clock)
    tier.open()
    for stream in SYSTEM_STREAMS:
        store.create_topic(Topic(stream, 1), system=True)
    store.create_topic(Topic("t", 2))
    return store, tier


def test_delayed_records_go_up_in_the_delayed_stream(tmp_path: Path,
                                                     manual_clock: ManualClock) -> None:
    store, tier = _open(tmp_path, manual_clock, durable=False)
    try:
        infos = store.put([Message("", "t", f"d{i}".encode(), flags=FLAG_DELAYED,
                                   deliver_at_ms=10**13) for i in range(5)]).result(10)
        assert [i.queue_offset for i in infos] == [0, 1, 2, 3, 4]  # the stream's own
        while tier.step():
            pass
        tier.commit()
        got = tier.read(DELAYED_STREAM, 0, 0, 100)
        assert [decode_record(e.record).body for e in got] == [f"d{i}".encode()
                                                               for i in range(5)]
        assert all(decode_record(e.record).topic == "t" for e in got)
        assert tier.read("t", 0, 0, 100) == tier.read("t", 1, 0, 100) == []  # not due yet
    finally:
        tier.stop()
        store.stop()


def test_journal_records_replay_to_the_same_state() -> None:
    puts = [(b"o\x01", b"v1"), (b"c\x02", b"v2")]
    body = encode_ops(puts, [b"p\x03"])
    assert list(decode_ops(body)) == [*puts, (b"p\x03", None)]
    state = JournalState()
    state.apply(POP, encode_ops([(b"stale", b"x")]))
    state.apply(POP_RESET, encode_ops(puts))  # a snapshot clears what came before
    state.apply(POP, encode_ops([], [b"o\x01"]))
    state.apply("timer-done", (7).to_bytes(8, "big"))
    state.apply("timer-move", (8).to_bytes(8, "big") + (1234).to_bytes(8, "big"))
    state.apply(POP, b"Zbad")  # damaged: counted, never raised
    assert state.pop == {b"c\x02": b"v2"}
    assert state.pending_due(7, FLAG_DELAYED, 99) is None  # delivered or cancelled
    assert state.pending_due(8, FLAG_DELAYED, 99) == 1234  # rescheduled
    assert state.pending_due(9, FLAG_DELAYED, 99) == 99
    assert state.bad == 1


def test_a_durable_wait_ends_only_once_the_tier_has_the_record(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    faulty = FaultyProvider(LocalProvider(str(tmp_path / "tier")))
    store, tier = _open(tmp_path, manual_clock, faulty)
    journal = StateJournal(store, tier, durable_ack=True)
    try:
        faulty.refuse = "/"  # every write fails: nothing reaches the tier
        future = journal.append(POP, encode_ops([(b"o\x01", b"v")]))
        assert future is not None
        infos = future.result(10)
        tier.step()
        with pytest.raises(TierUnavailable):
            journal.wait_tier(infos)  # tier.upload_timeout_s = 1 s
        faulty.refuse = ""
        done = threading.Event()

        def wait() -> None:
            journal.wait_tier(infos)
            done.set()
        waiter = threading.Thread(target=wait)
        waiter.start()
        assert not done.wait(0.2)  # not before a commit took it
        manual_clock.advance(10_000)  # past the failed commit's back-off
        while not done.is_set():
            tier.step()
            tier.commit()
            done.wait(0.05)
        waiter.join(5)
        assert tier.position() >= infos[-1].commit_offset + infos[-1].record_size
    finally:
        tier.stop()
        store.stop()
