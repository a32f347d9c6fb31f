"""The timing wheel: cascades across levels, never fires early, jumps hours at once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from timer.wheel import TimingWheel


def test_fires_exactly_at_due_time_across_levels() -> None:
    w = TimingWheel(tick_ms=1, slots=8, levels=3, start_ms=1000)  # spans 8, 64, 512 ms
    dues = {"a": 1003, "b": 1010, "c": 1100, "d": 1511, "e": 5000}  # e: overflow
    for k, d in dues.items():
        assert w.add(k, d)
    fired: dict[str, int] = {}
    for now in range(1000, 5002):
        for key, due in w.advance(now):
            assert due <= now  # never early
            fired[str(key)] = now
    assert fired == dues  # and never late: each fired at the first advance past its due


def test_already_due_entries_are_refused() -> None:
    w = TimingWheel(start_ms=1000)
    assert not w.add("x", 1000)
    assert not w.add("y", 10)
    assert len(w) == 0


def test_remove_and_re_add() -> None:
    w = TimingWheel(start_ms=0)
    w.add("a", 50)
    w.add("b", 50)
    assert w.remove("a") and not w.remove("a")
    w.add("b", 70)  # re-adding moves it
    assert w.advance(60) == []
    assert w.advance(70) == [("b", 70)]
    assert len(w) == 0 and w.next_expiry_ms() is None


def test_a_jump_of_hours_fires_everything_due_in_one_call() -> None:
    w = TimingWheel(tick_ms=1, slots=64, levels=3, start_ms=0)
    for i in range(1000):
        w.add(i, 3_600_000 * (i % 5) + i + 1)
    due_now = {i for i in range(1000) if 3_600_000 * (i % 5) + i + 1 <= 7_200_000}
    assert {k for k, _ in w.advance(7_200_000)} == due_now
    assert len(w) == 1000 - len(due_now)


@settings(max_examples=80)
@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=60),
       st.integers(1, 5), st.integers(2, 16), st.integers(1, 4),
       st.lists(st.integers(1, 50_000), min_size=1, max_size=10),
       st.one_of(st.none(), st.integers(1, 5)))
def test_never_early_never_lost(dues: list[int], tick: int, slots: int, levels: int,
                                steps: list[int], limit: int | None) -> None:
    # Given entries at arbitrary times on an arbitrary wheel shape
    w = TimingWheel(tick_ms=tick, slots=slots, levels=levels, start_ms=0)
    expected = {i: d for i, d in enumerate(dues) if w.add(i, d)}
    # When time moves in uneven steps, sometimes landing exactly on the next expiry
    now, fired, n = 0, {}, 0
    while len(fired) < len(expected):
        nxt = w.next_expiry_ms()
        assert nxt is not None, "entries remain but the wheel reports none"
        step = steps[n % len(steps)]
        if nxt > now:  # (with a limit, entries may still be due at 'now')
            now = max(now + 1, nxt if n % 2 else now + step)
        n += 1
        batch = w.advance(now, limit)
        assert limit is None or len(batch) <= limit
        for key, due in batch:
            # Then nothing fires early or twice
            assert due <= now and key not in fired
            fired[key] = due
    # and nothing is lost
    assert fired == expected and len(w) == 0


def test_adding_and_removing_keys_piles_up_no_stale_heap_entries() -> None:
    # Given a wheel with 10 ms ticks (the POP revive wheel's shape)
    w: TimingWheel[int] = TimingWheel(tick_ms=10, slots=64, levels=4, start_ms=0)
    # When 100,000 leases are scheduled 12 hours ahead and each is acked (removed) at once
    for i in range(100_000):
        w.add(i, 12 * 3_600_000 + i)
        w.remove(i)
    # Then the wheel keeps no trace of them: one heap entry per bucket id at most
    assert len(w) == 0 and len(w._heap) <= 64 * 4
    assert w.next_expiry_ms() is None and not w._heap
    # and a key added afterwards still fires on time
    w.add("late", 13 * 3_600_000)  # type: ignore[arg-type]
    assert w.advance(13 * 3_600_000 - 1) == []
    assert w.advance(13 * 3_600_000) == [("late", 13 * 3_600_000)]


@settings(max_examples=80)
@given(st.lists(st.sampled_from([700, 4_095, 4_096, 70_000, 70_001]), min_size=1,
                max_size=80),
       st.lists(st.integers(0, 79), max_size=10),
       st.lists(st.integers(1, 30_000), min_size=1, max_size=10),
       st.one_of(st.none(), st.integers(1, 7)))
def test_shared_due_times_cascade_whole_never_early_never_lost(
        dues: list[int], removed: list[int], steps: list[int], limit: int | None) -> None:
    # Given many entries sharing a few due times (a hot instant), some removed later
    w = TimingWheel(tick_ms=1, slots=64, levels=4, start_ms=0)
    expected = {i: d for i, d in enumerate(dues) if w.add(i, d)}
    now, fired, n = 0, {}, 0
    while len(fired) < len(expected):
        if n == 2:  # after the first cascades: a removed key never fires
            for key in removed:
                if key in expected and key not in fired:
                    assert w.remove(key)
                    del expected[key]
        nxt = w.next_expiry_ms()
        if nxt is None:
            break
        if nxt > now:
            now = max(now + 1, nxt if n % 2 else now + steps[n % len(steps)])
        n += 1
        for key, due in w.advance(now, limit):
            assert due <= now and key not in fired
            fired[key] = due
    assert fired == expected and len(w) == 0


def test_a_hot_instant_fires_in_slices_and_a_key_can_leave_it() -> None:
    # Given 50,000 entries due at one millisecond, a minute ahead (a high level)
    w: TimingWheel[int] = TimingWheel(tick_ms=1, slots=64, levels=4, start_ms=0)
    for i in range(50_000):
        w.add(i, 60_000)
    # When the wheel comes within a tick of it, the whole instant has moved down
    assert w.advance(59_999) == []
    assert w.remove(7) and 7 not in w
    # Then it fires in slices, at its time, every key once
    fired: list[int] = []
    while batch := w.advance(60_000, 4_000):
        assert len(batch) <= 4_000 and all(due == 60_000 for _, due in batch)
        fired += [k for k, _ in batch]
    assert sorted(fired) == [i for i in range(50_000) if i != 7] and len(w) == 0


def test_buckets_of_one_instant_merge_from_two_levels_and_a_key_can_leave_either() -> None:
    # Given one instant reached from two levels: 3 keys added far ahead (level 2), then
    # 1 and 5 keys added once it is near (level 1)
    for near in (1, 5):
        w: TimingWheel[str] = TimingWheel(tick_ms=1, slots=64, levels=4, start_ms=0)
        for k in ("a", "b", "c"):
            w.add(k, 4_100)
        w.advance(100)
        for i in range(near):
            w.add(f"n{i}", 4_100)
        # When both buckets have cascaded into one bottom bucket (the smaller into the
        # larger) and a key of each leaves
        assert w.advance(4_099) == []
        assert w.remove("a") and w.remove("n0") and not w.remove("a")
        # Then the instant fires without them, each other key once
        assert sorted(k for k, _ in w.advance(4_100)) == \
            sorted(["b", "c"] + [f"n{i}" for i in range(1, near)])
        assert len(w) == 0


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "advance"]),
                          st.integers(0, 30),
                          st.sampled_from([1, 5, 63, 64, 700, 4_096, 4_100, 70_000]),
                          st.one_of(st.none(), st.integers(1, 9))),
                min_size=1, max_size=150))
def test_any_mix_of_adds_removes_and_advances_matches_a_plain_dictionary(
        ops: list[tuple[str, int, int, int | None]]) -> None:
    # Given a wheel and a plain dictionary of what it should hold, through any mix of
    # adds (at a few shared instants, reached from any level: buckets move whole and
    # merge), removes and advances in slices
    w: TimingWheel[int] = TimingWheel(tick_ms=1, slots=64, levels=4, start_ms=0)
    model: dict[int, int] = {}
    now = 0
    for op, key, at, limit in ops:
        if op == "add":
            due = at * 17 % 5 * 4_096 + 4  # 4, 4_100, 8_196, 12_292 or 16_388
            model.pop(key, None)
            if w.add(key, due):  # held (an advance stopped by its limit may leave the
                model[key] = due  # wheel's time behind ``now``: then one due by now too)
            else:  # refused as due already: the caller fires it
                assert due <= now
        elif op == "remove":
            assert w.remove(key) == (key in model)
            model.pop(key, None)
        else:
            now += at
            for k, due in w.advance(now, limit):
                # Then nothing fires early, and only what it holds, at its due time
                assert due <= now and model.pop(k) == due
        assert len(w) == len(model) and all(k in w for k in model)
    # and nothing is lost
    rest = w.advance(now + 1_000_000)
    assert dict(rest) == model and len(w) == 0
