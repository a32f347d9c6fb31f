"""A chain of takeovers does not make each takeover read every broker it passed.

The backlog of a taken topic is spread over the tiers of the chain's brokers: each is
mounted lazily (``MountedBroker(lazy=True)``), its metadata read at the first read of
the offsets it holds, not by the takeover (a mount is a LIST and a read per queue).

The TimerFlatFiles: a broker reads another's TimerFlatFiles as its own only while they hold objects
(``ParkingLot.adopt_flat_files``, forgotten once the preload deleted the last one), and
its timer snapshot names only those as ``flat_brokers`` for a takeover of it to adopt in
place (``cluster.timersnapshot``), while ``folded_brokers`` keeps naming every broker whose
adopted offsets its parts may hold.

Seen in the 270-cycle failover chaos: each takeover listed ``<broker>/timer/`` for every
broker of the fleet's history (~180, one request each, none with an object left),
and the timer step grew from 0.5 s to 5-16 s.  Real brokers in one process, a real
local-directory tier, RocksDB, a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from cluster.timersnapshot import Pointer, read_pointer
from store.clock import ManualClock
from store.topics import Topic
from tests.chronomq.test_takeover_adoption import (
    HOUR_MS,
    MINUTE_MS,
    _departed_with_far_future,
    _gone,
    _objects,
    _open,
    _run,
    brokers,  # noqa: F401 (the fixture)
)
from tests.chronomq.test_timer_compaction import _caught_up, _dispatched, _send_delayed
from tiered.providers.local import LocalProvider


def _record_lists(monkeypatch: pytest.MonkeyPatch, folder: str) -> list[str]:
    """The prefixes ``<broker>/<folder>/`` listed in the tier from now on, in order."""
    listed: list[str] = []
    real = LocalProvider.list

    def recording(self: LocalProvider, prefix: str = "") -> list[str]:
        parts = prefix.split("/")
        if len(parts) == 3 and parts[1] == folder and not parts[2]:
            listed.append(prefix)
        return real(self, prefix)
    monkeypatch.setattr(LocalProvider, "list", recording)
    return listed


@pytest.fixture
def meta_lists(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The brokers' queue metadata listed in the tier (``<broker>/meta/``: a mount)."""
    yield _record_lists(monkeypatch, "meta")


@pytest.fixture
def timer_lists(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The TimerFlatFile prefixes listed in the tier (``<broker>/timer/``), in order."""
    yield _record_lists(monkeypatch, "timer")


def _folded(b: Broker) -> Pointer:
    """B's timer snapshot once it folded what it adopted in."""
    _caught_up(b)
    assert b.compactor is not None and b.compactor.step(force=True)
    pointer = read_pointer(b.tier, b.config.tier.broker_name)
    assert pointer is not None
    return pointer


def test_a_chain_of_takeovers_lists_only_the_departed_brokers_timer_files(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],  # noqa: F811
        timer_lists: list[str]) -> None:
    # Given A with delayed messages due within the hour (none in TimerFlatFiles), gone
    a = _open(tmp_path, "a", manual_clock, brokers)
    a.create_topic(Topic("t", 2))
    start = manual_clock.now_ms()
    _send_delayed(a, [f"m-{i}" for i in range(10)], start + 30 * MINUTE_MS)
    _dispatched(a)
    _gone(tmp_path, a, brokers)
    # and a chain: B took A over and folded it in, then was lost, C likewise
    departed = "a"
    for name in ("b", "c"):
        taker = _open(tmp_path, name, manual_clock, brokers)
        assert taker.takeover(departed, force=True).pending == 10
        # (nothing in the departed broker's TimerFlatFiles: no prefix read as its own)
        assert taker.timer_store.adopted_prefixes() == []
        pointer = _folded(taker)
        assert pointer.flat_brokers == []
        assert pointer.folded_brokers == (["a"] if name == "b" else ["a", "b"])
        _gone(tmp_path, taker, brokers)
        departed = name

    # When D takes C over
    d = _open(tmp_path, "d", manual_clock, brokers)
    timer_lists.clear()  # (after D's start, which lists its own)
    assert d.takeover("c", force=True).pending == 10

    # Then it listed C's TimerFlatFiles only, not those of every broker of the chain
    assert timer_lists == ["c/timer/"]
    # and every message still comes once, on time
    got, when = _run(d, manual_clock, start + HOUR_MS)
    assert set(got) == {f"m-{i}" for i in range(10)} and max(got.values()) == 1
    assert min(when.values()) >= start + 30 * MINUTE_MS


def test_a_folded_brokers_timer_files_are_read_until_preloaded_then_forgotten(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],  # noqa: F811
        timer_lists: list[str]) -> None:
    # Given A gone with far-future messages in its TimerFlatFiles, taken over by B
    due, _ = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    b = _open(tmp_path, "b", manual_clock, brokers)
    assert b.takeover("a", force=True).pending == len(due)
    assert b.timer_store.adopted_prefixes() == ["a/timer"]
    # and B's snapshot folded the adoption in while A's objects are still to preload
    pointer = _folded(b)
    assert pointer.folded_brokers == ["a"] and pointer.flat_brokers == ["a"]

    # When B's clock runs past every hour A's objects hold, preloading them (and
    # deleting them)
    got, _ = _run(b, manual_clock, start + 31 * HOUR_MS)
    assert _objects(b, "a") == {}

    # Then B no longer reads A's prefix, and its next snapshot names A as folded only
    assert b.timer_store.adopted_prefixes() == []
    _send_delayed(b, ["late-0"], start + 32 * HOUR_MS)  # (the streams moved)
    _dispatched(b)
    pointer = _folded(b)
    assert pointer.folded_brokers == ["a"] and pointer.flat_brokers == []
    # and a takeover of B lists B's TimerFlatFiles alone
    _gone(tmp_path, b, brokers)
    c = _open(tmp_path, "c", manual_clock, brokers)
    timer_lists.clear()
    pending = {m for m in due if m not in got} | {"late-0"}
    assert c.takeover("b", force=True).pending == len(pending)
    assert timer_lists == ["b/timer/"]
    got, _ = _run(c, manual_clock, start + 41 * HOUR_MS, got=got)
    assert {*due, "late-0"} <= set(got) and max(got.values()) == 1


def test_a_takeover_mounts_the_chain_of_the_backlog_at_its_first_read(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],  # noqa: F811
        meta_lists: list[str]) -> None:
    # Given a chain: A took sends and was lost, B took A over, took sends, folded what
    # it adopted and was lost, C likewise, each an hour after the one before (their
    # ids long out of the resend horizon: ``InheritedIds`` reads the recent ones only)
    departed, sent = "", []
    for name in ("a", "b", "c"):
        broker = _open(tmp_path, name, manual_clock, brokers)
        if departed:
            broker.takeover(departed, force=True)
        else:
            broker.create_topic(Topic("t", 2))
        ids = [f"{name}-{i}" for i in range(6)]
        _send_delayed(broker, ids, manual_clock.now_ms())  # (due now: immediate)
        _send_delayed(broker, [f"{name}-later"], manual_clock.now_ms() + 10 * HOUR_MS)
        sent += ids
        _dispatched(broker)
        _folded(broker)
        _gone(tmp_path, broker, brokers)
        departed = name
        manual_clock.advance(HOUR_MS)
    d = _open(tmp_path, "d", manual_clock, brokers)
    meta_lists.clear()

    # When D takes C over
    d.takeover("c", force=True)

    # Then it read C's queue metadata, and not that of the brokers before it
    assert "c/meta/" in meta_lists and not {"a/meta/", "b/meta/"} & set(meta_lists)
    # and a group reading from the start reads through the chain, every message once
    got: list[str] = []
    while batch := d.pop.pop("t", "g", 32, 60):
        got += [p.message.message_id for p in batch]
        d.pop.ack_many("g", [p.receipt_handle for p in batch])
    assert sorted(got) == sorted(sent)
    assert meta_lists.count("a/meta/") == 1 and meta_lists.count("b/meta/") == 1  # (now)
