"""Lease clocks (``pop.leaseclock``): the kept shift's codec round-trips, and a moved
deadline keeps the time the lease had left, never less, never before the adoption."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pop.checkpoint import HELD, PopCheckpoint, decode_checkpoint, encode_checkpoint
from pop.leaseclock import (
    LeaseClock,
    decode_shift,
    encode_shift,
    move_checkpoint,
    moved,
    shift_key,
    shifts_in,
)

MS = st.integers(1_600_000_000_000, 1_900_000_000_000)
SHIFT = st.integers(-10**12, 10**12)


@given(SHIFT)
def test_a_shift_round_trips(shift_ms: int) -> None:
    assert decode_shift(encode_shift(shift_ms)) == shift_ms


@pytest.mark.parametrize("raw", [b"", b"\x02" + bytes(8), b"\x01" + bytes(7)])
def test_a_shift_this_release_did_not_write_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_shift(raw)


def test_shifts_are_read_by_broker_and_unreadable_ones_left_out() -> None:
    items = [(shift_key("a"), encode_shift(-5)), (shift_key("ab"), encode_shift(7)),
             (shift_key("bad"), b"\x09"), (b"Rsschedule", b"{}")]
    assert shifts_in(items) == {"a": -5, "ab": 7}


def test_a_chain_composes_the_shifts() -> None:
    clock = LeaseClock("b", 1_000, {"a": 30_000, "z": -10_000})
    assert clock.shifts(-40_000) == {"a": -10_000, "z": -50_000, "b": -40_000}


@given(deadline=MS, departed_ms=MS, here_ms=MS)
def test_a_moved_deadline_keeps_the_time_left(deadline: int, departed_ms: int,
                                              here_ms: int) -> None:
    shift = here_ms - departed_ms
    got = moved(deadline, shift, here_ms)
    assert got >= here_ms  # never before the adoption
    assert got - here_ms == max(0, deadline - departed_ms)  # the time it had left


@given(expire=MS, over=st.lists(MS, max_size=3), shift=SHIFT, here=MS, pop_at=MS)
def test_a_checkpoint_moves_every_deadline_but_held_ones(expire: int, over: list[int],
                                                         shift: int, here: int,
                                                         pop_at: int) -> None:
    overrides = {i: e for i, e in enumerate(over)} | {len(over): HELD}
    ck = PopCheckpoint(40, pop_at, expire, len(overrides) + 1, bytearray(1), overrides)
    got = decode_checkpoint(40, move_checkpoint(40, encode_checkpoint(ck), shift, here))
    assert got.pop_at_ms == pop_at + shift  # when it was leased: moved back, exact
    assert got.expire_at_ms == moved(expire, shift, here)
    assert got.overrides == {i: moved(e, shift, here) for i, e in overrides.items()}
    assert got.overrides[len(over)] == HELD
