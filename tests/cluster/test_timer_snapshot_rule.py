"""When a timer snapshot is due (``TimerCompactor.due``), on a real local-directory tier:
every ``tier.journal_snapshot_records`` stream records, or half as many as the latest
snapshot holds, if more (the streams past a snapshot stay under half its size); every
``tier.journal_snapshot_s`` once ``BY_TIME_RECORDS`` and that half came (the injected
clock); never with snapshots off; and at once for a finished adoption not folded in
yet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cluster.timersnapshot import (
    BY_TIME_RECORDS,
    POINTER,
    Fold,
    PendingRecord,
    Pointer,
    TimerCompactor,
)
from store.clock import ManualClock
from store.names import DELAYED_STREAM, TIMER_STREAM
from tiered.providers.local import LocalProvider


def _compactor(tmp_path: Path, ends: dict[str, int], every: int, records: int,
               folds: list[Fold] | None = None, every_s: float = 0.0,
               clock: ManualClock | None = None) -> TimerCompactor:
    tier = LocalProvider(str(tmp_path / "tier"))
    tier.write(f"b/{POINTER}", Pointer(1_000, 500, [], "", records).encode())
    return TimerCompactor(tier, "b", lambda s, qo, n: [], lambda s: ends[s], lambda: True,
                          every, lambda t: folds or [], every_s,
                          (clock or ManualClock()).monotonic_ms)


def test_a_snapshot_is_due_after_half_what_the_last_one_holds_if_more_than_every(
        tmp_path: Path) -> None:
    ends = {DELAYED_STREAM: 1_000, TIMER_STREAM: 500}
    c = _compactor(tmp_path, ends, every=100, records=10_000)
    ends[DELAYED_STREAM] += 4_000
    ends[TIMER_STREAM] += 999
    assert not c.due()  # 4,999 records past it: under half of 10,000
    ends[TIMER_STREAM] += 1
    assert c.due()


def test_a_small_snapshot_is_due_every_so_many_records_and_never_when_off(
        tmp_path: Path) -> None:
    ends = {DELAYED_STREAM: 1_099, TIMER_STREAM: 500}
    assert not _compactor(tmp_path, ends, every=100, records=10).due()
    ends[DELAYED_STREAM] += 1
    assert _compactor(tmp_path, ends, every=100, records=10).due()
    ends[DELAYED_STREAM] += 1_000_000
    assert not _compactor(tmp_path, ends, every=0, records=10).due()


def test_a_finished_adoption_makes_a_snapshot_due_until_it_is_folded_in(
        tmp_path: Path) -> None:
    def rows() -> Iterator[list[PendingRecord]]:
        yield []
    ends = {DELAYED_STREAM: 1_000, TIMER_STREAM: 500}
    fold = Fold("d1", ["a"], rows)
    assert _compactor(tmp_path, ends, every=100, records=10, folds=[fold]).due()
    c = _compactor(tmp_path, ends, every=100, records=10, folds=[fold])
    c.pointer.folded.append("d1")
    assert not c.due()


def test_a_snapshot_is_due_every_so_long_once_enough_records_came(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """With durable-ack the streams are small objects, about one per commit, and a
    takeover read 572 timer records of a broker's two minutes in 2 s: by records alone
    (100,000) a snapshot came hours apart."""
    ends = {DELAYED_STREAM: 1_000, TIMER_STREAM: 500}
    c = _compactor(tmp_path, ends, every=100_000, records=400, every_s=60.0,
                   clock=manual_clock)
    ends[TIMER_STREAM] += max(BY_TIME_RECORDS, 200) - 1
    manual_clock.advance(60_000)
    assert not c.due()  # a minute, but one record short
    ends[DELAYED_STREAM] += 1
    assert c.due()
    assert not _compactor(tmp_path, ends, every=100_000, records=400, every_s=0.0,
                          clock=manual_clock).due()  # by records only
