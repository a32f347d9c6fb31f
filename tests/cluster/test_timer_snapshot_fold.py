"""A timer snapshot that folds a finished adoption in while the streams stand still
(``TimerCompactor.step``), on a real local-directory tier: the new snapshot's objects
never replace or delete those the current pointer names, whether the fold succeeds or
fails half-way (a takeover of this broker reads the current pointer meanwhile)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.timersnapshot import (
    Fold,
    PendingRecord,
    Pointer,
    TimerCompactor,
    read_part,
    read_pointer,
)
from store.names import DELAYED_STREAM, TIMER_STREAM
from tiered.errors import TierError
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.timerflatfile import adopted_offset

HOUR_MS = 3_600_000


def _rows(origin: str, n: int) -> Callable[[], Iterator[list[PendingRecord]]]:
    def rows() -> Iterator[list[PendingRecord]]:
        yield [PendingRecord(adopted_offset(origin, i), HOUR_MS + i, f"{origin}-{i}".encode())
               for i in range(n)]
    return rows


def _broken_rows() -> Iterator[list[PendingRecord]]:
    yield [PendingRecord(adopted_offset("y", 0), HOUR_MS, b"y-0")]
    raise TierError("the adopted broker's tier cannot be read now")


def _held(tier: Provider, pointer: Pointer) -> list[bytes]:
    """The records the pointer's parts hold; raises when one is missing or damaged."""
    tier.read(pointer.residual)
    return [r.record for path in pointer.parts for r in read_part(tier, path)]


class _Folds:
    def __init__(self) -> None:
        self.folds: list[Fold] = []

    def __call__(self, _timer_end: int) -> list[Fold]:
        return self.folds


def _compactor(tier: Provider, folds: _Folds) -> TimerCompactor:
    ends = {DELAYED_STREAM: 0, TIMER_STREAM: 0}  # no stream moves: only folds
    return TimerCompactor(tier, "b", lambda s, qo, n: [], lambda s: ends[s], lambda: True,
                          100, folds)


def test_a_second_fold_at_the_same_stream_ends_keeps_the_first(tmp_path: Path) -> None:
    # Given a snapshot that folded in the adoption of x, the streams unchanged since
    tier = LocalProvider(str(tmp_path / "tier"))
    folds = _Folds()
    compactor = _compactor(tier, folds)
    folds.folds = [Fold("dx", ["x"], _rows("x", 3))]
    assert compactor.step()
    first = read_pointer(tier, "b")
    assert first is not None and sorted(_held(tier, first)) == [b"x-0", b"x-1", b"x-2"]
    # When the adoption of z finishes and is folded in too
    folds.folds.append(Fold("dz", ["z"], _rows("z", 2)))
    assert compactor.step()
    # Then the new snapshot holds both, and the pointer names objects that exist
    second = read_pointer(tier, "b")
    assert second is not None and second.folded == ["dx", "dz"]
    assert sorted(_held(tier, second)) == [b"x-0", b"x-1", b"x-2", b"z-0", b"z-1"]
    assert not set(second.parts) & set(first.parts), "a part was written over"
    # and the objects of the snapshot it replaced are gone
    assert sorted(tier.list("b/timer-snapshot/")) == sorted([*second.parts, second.residual])


def test_a_fold_that_fails_leaves_the_current_snapshot_whole(tmp_path: Path) -> None:
    # Given a snapshot that folded in the adoption of x
    tier = LocalProvider(str(tmp_path / "tier"))
    folds = _Folds()
    compactor = _compactor(tier, folds)
    folds.folds = [Fold("dx", ["x"], _rows("x", 3))]
    assert compactor.step()
    # When the next fold (streams unchanged) cannot read the adopted broker's tier
    folds.folds.append(Fold("dy", ["y"], _broken_rows))
    with pytest.raises(TierError, match="cannot fold the adoption dy"):
        compactor.step()
    # Then the pointer in the tier still names the first snapshot, whole
    pointer = read_pointer(tier, "b")
    assert pointer is not None and pointer.folded == ["dx"]
    assert sorted(_held(tier, pointer)) == [b"x-0", b"x-1", b"x-2"]
    # and the next step (the broken fold left out till a restart) has nothing to do
    assert not compactor.step()
