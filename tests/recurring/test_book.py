"""ScheduleBook over an in-memory store: a schedule updated in place keeps its tick state
and never repeats a tick; a name deleted and created again is a new schedule (its
generation, in its ticks' ids) and a step racing the delete leaves the new one alone;
everything read back from the store after each change is what the book held."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recurring.book import TOMBSTONE_KEEP_MS, ScheduleBook, ScheduleState
from recurring.engine import ScheduleEngine
from recurring.model import (
    MAX_GENERATION,
    MAX_JITTER_MS,
    MAX_NAME_BYTES,
    ScheduleSpec,
    jitter_offset_ms,
    tick_id,
    trigger_id,
)
from store.clock import ManualClock
from store.errors import InvalidArgument, NotFound
from store.message import MAX_ID_BYTES, Draft

S = 1_800_000_000_000  # a whole minute
SEC, MIN = 1_000, 60_000


class DictStore:
    """The book's durable store: a dict, written whole at each call."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.data.items())

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        for k in deletes:
            self.data.pop(k, None)
        self.data.update(puts)


def _spec(name: str = "s", **kw: object) -> ScheduleSpec:
    spec = ScheduleSpec(**{"name": name, "topic": "t", "body": b"x", "every_s": 60,
                           **kw})  # type: ignore[arg-type]
    spec.validate()
    return spec


class Env:
    """A book and its engine on a manual clock; what the engine sent, by id."""

    def __init__(self) -> None:
        self.store = DictStore()
        self.book = ScheduleBook(self.store, 100)
        self.clock = ManualClock(S)
        self.sent: dict[str, bytes] = {}
        self.during_send: list[object] = []  # called inside the next send, then dropped
        self.engine = ScheduleEngine(self.book, self._send, self.clock)

    def _send(self, drafts: list[Draft]) -> list[str]:
        for d in drafts:
            assert d.message_id not in self.sent, f"{d.message_id} sent twice"
            self.sent[d.message_id] = d.body
        while self.during_send:
            self.during_send.pop(0)()  # type: ignore[operator]
        return [""] * len(drafts)

    def step(self, ms: int) -> int:
        return self.engine.fire_due(self.clock.advance(ms))

    def reloaded(self) -> ScheduleBook:
        """The book a restart reads from the store."""
        return ScheduleBook(self.store, 100)


def _same(a: ScheduleState, b: ScheduleState) -> None:
    assert (a.spec, a.next_ms, a.paused, a.fired, a.generation) == \
        (b.spec, b.next_ms, b.paused, b.fired, b.generation)


def test_an_update_changes_the_rule_and_keeps_the_ticks_sent() -> None:
    env = Env()
    env.book.create(_spec(), S)
    env.step(MIN)
    env.step(MIN)
    assert sorted(env.sent) == [f"s@{S + MIN}", f"s@{S + 2 * MIN}"]
    # When the rule becomes every 30 s with another body, half a minute after a tick
    env.clock.advance(10 * SEC)
    state, changed = env.book.update(_spec(every_s=30, body=b"new"), env.clock.now_ms())
    # Then the ticks sent stay, the next one follows the new rule from now
    assert changed and state.fired == 2 and state.generation == 0
    assert state.next_ms == S + 2 * MIN + 30 * SEC
    env.step(20 * SEC)
    env.step(30 * SEC)
    assert env.sent == {f"s@{S + MIN}": b"x", f"s@{S + 2 * MIN}": b"x",
                        f"s@{S + 2 * MIN + 30 * SEC}": b"new", f"s@{S + 3 * MIN}": b"new"}
    _same(env.reloaded().get("s"), env.book.get("s"))
    # the same settings again: nothing written, nothing changed
    assert env.book.update(_spec(every_s=30, body=b"new"), env.clock.now_ms())[1] is False


def test_an_update_never_repeats_a_tick_sent_ahead() -> None:
    env = Env()
    env.book.create(_spec(), S)
    # Given the tick of S + 1 min sent a second ahead
    assert env.step(MIN - SEC) == 1
    # When the rule becomes every 30 s half a second later (S + 1 min is one of its ticks)
    state, _ = env.book.update(_spec(every_s=30), env.clock.now_ms() + 500)
    # Then its first tick is after the one sent
    assert state.next_ms == S + MIN + 30 * SEC
    env.step(MIN)
    assert sorted(env.sent) == [f"s@{S + MIN}", f"s@{S + MIN + 30 * SEC}",
                                f"s@{S + 2 * MIN}"]


def test_an_update_racing_a_step_is_kept_and_the_step_counts() -> None:
    env = Env()
    env.book.create(_spec(), S)
    # Given an update to every 7 minutes while the step's tick is being sent
    env.during_send.append(lambda: env.book.update(_spec(every_s=420, body=b"new"),
                                                   env.clock.now_ms()))
    assert env.step(MIN) == 1
    # Then the tick counts, and the next one is the new rule's first after the one sent
    state = env.book.get("s")
    assert state.fired == 1 and state.spec.every_s == 420
    assert state.next_ms is not None and state.next_ms > S + MIN
    assert state.next_ms % (420 * SEC) == 0 and state.next_ms - (S + MIN) <= 420 * SEC
    _same(env.reloaded().get("s"), state)


def test_a_name_deleted_and_created_again_is_a_new_schedule() -> None:
    env = Env()
    env.book.create(_spec(), S)
    assert env.step(MIN - SEC) == 1  # the tick of S + 1 min sent a second ahead
    # When it is deleted and created again with another body within that second
    env.book.delete("s", env.clock.now_ms())
    again, created = env.book.create(_spec(body=b"new"), env.clock.now_ms())
    # Then it is a new generation, whose first tick (the same minute) has its own id
    assert created and again.generation == 1 and again.fired == 0
    env.step(SEC)
    assert env.sent == {f"s@{S + MIN}": b"x", f"s~1@{S + MIN}": b"new"}
    # and a restart reads the same; deleted and created once more: generation 2
    _same(env.reloaded().get("s"), env.book.get("s"))
    env.book.delete("s", env.clock.now_ms())
    env.reloaded()  # (the tombstone is what a restart reads)
    assert ScheduleBook(env.store, 100).create(_spec(), env.clock.now_ms())[0].generation == 2


def test_a_delete_and_create_racing_a_step_leaves_the_new_schedule_alone() -> None:
    env = Env()
    env.book.create(_spec(), S)

    def delete_and_create() -> None:
        env.book.delete("s", env.clock.now_ms())
        env.book.create(_spec(cron="0 18 * * *", every_s=0), env.clock.now_ms())
    # Given the schedule deleted and created again with another rule during a tick's send
    env.during_send.append(delete_and_create)
    env.step(MIN)
    # Then the new one keeps its own first tick and count (not the old one's)
    state = env.book.get("s")
    assert (state.spec.cron, state.fired, state.generation) == ("0 18 * * *", 0, 1)
    assert state.next_ms == S // 86_400_000 * 86_400_000 + 18 * 3_600_000 or \
        state.next_ms == S // 86_400_000 * 86_400_000 + 42 * 3_600_000
    _same(env.reloaded().get("s"), state)


def test_a_tombstone_is_kept_a_day_then_swept() -> None:
    env = Env()
    env.book.create(_spec(), S)
    env.book.delete("s", S)
    env.book.create(_spec("other"), S)
    env.book.delete("other", S + TOMBSTONE_KEEP_MS + 1)  # the sweep goes with a delete
    assert env.book.create(_spec(), S + TOMBSTONE_KEEP_MS + 1)[0].generation == 0
    assert env.book.create(_spec("other"), S + TOMBSTONE_KEEP_MS + 1)[0].generation == 1
    assert [k for k in env.store.data if k.startswith(b"Rg")] == []


def test_update_and_delete_of_a_missing_name_and_an_update_that_never_fires() -> None:
    env = Env()
    with pytest.raises(NotFound):
        env.book.update(_spec(), S)
    with pytest.raises(NotFound):
        env.book.delete("s", S)
    env.book.create(_spec(), S)
    with pytest.raises(InvalidArgument):
        env.book.update(_spec(end_ms=S - 1), S)
    assert env.book.get("s").spec == _spec()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab.-_9", min_size=1, max_size=MAX_NAME_BYTES).filter(
    lambda n: n[0] not in ".-_"), st.integers(0, MAX_GENERATION),
    st.integers(0, 2**63 - 1))
def test_tick_ids_fit_and_never_collide_across_names_and_generations(
        name: str, generation: int, tick_ms: int) -> None:
    mid = tick_id(name, generation, tick_ms)
    assert len(mid) <= MAX_ID_BYTES
    # no other (name, generation) gives the same id for a tick: "~" is not in names
    assert mid.rsplit("@", 1)[0].split("~")[0] == name
    if generation == 0:
        assert mid == f"{name}@{tick_ms}"


def test_the_state_record_reads_back_and_old_records_are_generation_zero() -> None:
    env = Env()
    env.book.create(_spec(), S)
    raw = env.store.data[b"Rs" + b"s"]
    old = raw.replace(b', "generation": 0', b"").replace(b', "last_ms": 0', b"")
    assert b"generation" not in old and b"last_ms" not in old
    env.store.data[b"Rs" + b"s"] = old
    state = env.reloaded().get("s")
    assert (state.generation, state.last_ms) == (0, 0)
    assert state.encode() == raw


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab.-_9", min_size=1, max_size=MAX_NAME_BYTES).filter(
    lambda n: n[0] not in ".-_"), st.integers(0, MAX_GENERATION),
    st.integers(0, 2**63 - 1), st.integers(0, MAX_JITTER_MS))
def test_trigger_ids_fit_never_meet_a_tick_and_jitter_stays_in_its_window(
        name: str, generation: int, ms: int, jitter_ms: int) -> None:
    mid = trigger_id(name, generation, ms)
    assert len(mid) <= MAX_ID_BYTES and "@" not in mid and "!" not in tick_id(name, 0, ms)
    offset = jitter_offset_ms(name, generation, ms, jitter_ms)
    assert offset == jitter_offset_ms(name, generation, ms, jitter_ms)  # the same again
    assert 0 <= offset < jitter_ms or offset == jitter_ms == 0


def test_recent_ticks_and_jitter_read_back_and_old_records_have_none() -> None:
    env = Env()
    env.book.create(_spec(jitter_ms=5_000), S)
    env.engine.fire_due(S + MIN)
    env.book.triggered("s", 0, S + MIN + SEC, trigger_id("s", 0, S + MIN + SEC))
    state = env.reloaded().get("s")
    assert (state.spec.jitter_ms, state.fired) == (5_000, 2)
    assert state.recent == [(S + MIN, "s@" + str(S + MIN)),
                            (S + MIN + SEC, f"s!{S + MIN + SEC}")]
    old = Env()
    old.book.create(_spec(), S)
    raw = old.store.data[b"Rs" + b"s"]
    stripped = raw.replace(b', "recent": []', b"").replace(b', "jitter_ms": 0', b"")
    assert b"recent" not in stripped and b"jitter_ms" not in stripped
    old.store.data[b"Rs" + b"s"] = stripped
    again = old.reloaded().get("s")
    assert (again.recent, again.spec.jitter_ms) == ([], 0) and again.encode() == raw
