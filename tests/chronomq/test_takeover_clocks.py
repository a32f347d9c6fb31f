"""A takeover makes no decision on another machine's wall clock (finding 5 of issue 51):
real brokers in one process, a real local-directory tier and RocksDB, two wall clocks
apart by a fixed skew that move together (``SkewedClock`` over one ``ManualClock``).

- The successor 30 s ahead: the leases it adopts keep their remaining time, counted from
  the adoption (was: judged by the departed broker's deadlines on its own clock, they
  ended 30 s early: revived, their handles refused as expired).
- A chain (A, then B 30 s ahead, then C 20 s behind): the handles A gave settle their
  leases at C (each takeover's shift composed: ``pop.leaseclock``), and the leases end
  no earlier than A gave them.
- The departed broker 90 s ahead (more than the minute of slack there was): a message it
  delivered just before it was lost (the copy in the tier, the timer stream's record
  not) is not scheduled again (was: not looked for, as due after the successor's clock
  plus the slack, and delivered a second time).

The same invariants from outside, one broker process under Debian's ``faketime``:
``test_clock_skew_processes.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.broker import Broker
from store.clock import ManualClock
from store.message import Message, draft_of
from store.names import TIMER_STREAM
from store.topics import Topic
from tests.chronomq.test_journal_snapshots import _broker
from tests.chronomq.test_takeover_adoption import _open, _run
from tests.chronomq.test_takeover_adoption import brokers as brokers
from tests.chronomq.test_takeover_last_moments import _gone, _metas, _with_one_delivered
from tests.chronomq.test_timer_compaction import _caught_up, _tick
from tests.tiered.test_tiered_pop import _pop_all

SECOND_MS = 1_000
INVISIBLE_S = 60


class SkewedClock(ManualClock):
    """A wall clock ``skew_ms`` off ``base``'s that moves with it (its monotonic clock
    is ``base``'s: only wall clocks differ between machines).  Thread-safe."""

    def __init__(self, base: ManualClock, skew_ms: int) -> None:
        super().__init__(base.now_ms() + skew_ms)
        self._base, self._skew_ms = base, skew_ms

    def now_ms(self) -> int:
        return self._base.now_ms() + self._skew_ms

    def monotonic_ms(self) -> float:
        return self._base.monotonic_ms()

    def advance(self, delta_ms: int) -> int:
        return self._base.advance(delta_ms) + self._skew_ms

    def set(self, at_ms: int) -> None:
        self._base.set(at_ms - self._skew_ms)


def test_adopted_leases_keep_their_remaining_time_on_a_successor_ahead(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given A: 10 messages, 4 leased for 60 s; A lost 5 s later
    a = _broker(tmp_path, "a", manual_clock)
    try:
        a.create_topic(Topic("t", 1))
        sent = [i.message_id for i in a.sender.send([draft_of(Message("", "t", f"m{i}".encode()))
                                                     for i in range(10)]).result(10)]
        leased = a.pop.pop("t", "g", 4, INVISIBLE_S)
        assert len(leased) == 4
        handles = {p.message.message_id: p.receipt_handle for p in leased}
    finally:
        a.stop()
    manual_clock.advance(5 * SECOND_MS)

    # When B, its wall clock 30 s ahead of A's, takes A over
    b = _broker(tmp_path, "b", SkewedClock(manual_clock, 30 * SECOND_MS))
    try:
        assert b.takeover("a", force=True).done

        # Then 40 s on (45 s into the 60 s leases): none revived, none leased again,
        # and two are acked with the handles A gave
        manual_clock.advance(40 * SECOND_MS)
        assert b.pop.revive_due() == 0
        acked = sorted(handles)[:2]
        assert b.pop.ack_many("g", [handles[m] for m in acked]) == [None, None]
        assert sorted(_pop_all(b, "g")) == sorted(set(sent) - set(handles))

        # and once their 60 s are over, counted from the adoption, the two others come
        # back, once; the acked ones never
        manual_clock.advance((INVISIBLE_S - 40) * SECOND_MS + 1)
        b.pop.revive_due()
        manual_clock.advance(SECOND_MS)
        assert sorted(_pop_all(b, "g")) == sorted(set(handles) - set(acked))
        manual_clock.advance(2 * INVISIBLE_S * SECOND_MS)
        b.pop.revive_due()
        assert _pop_all(b, "g") == []
    finally:
        b.stop()


def test_a_delivery_by_a_departed_broker_far_ahead_is_not_delivered_again(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A, its wall clock 90 s ahead of B's: ten delayed messages delivered (the
    # copies in the tier, the timer stream's record of them not: A died before that)
    a_clock = SkewedClock(manual_clock, 90 * SECOND_MS)
    a, ids, _ = _with_one_delivered(tmp_path, a_clock, brokers)
    before = _metas(a, TIMER_STREAM)
    a_clock.advance(4 * SECOND_MS)
    _tick(a, a_clock)
    assert a.timer.statistics().delivered == 11
    _caught_up(a)
    _gone(tmp_path, a, brokers)
    for path, data in before.items():
        a.tier.write(path, data)

    # When B takes A over and its clock runs past every due time
    b = _open(tmp_path, "b", manual_clock, brokers)
    assert b.takeover("a", force=True).done
    got, _ = _run(b, manual_clock, manual_clock.now_ms() + 180 * SECOND_MS,
                  step_ms=SECOND_MS)

    # Then each message comes once: the copy A delivered, never scheduled again
    assert dict(got) == dict.fromkeys(["early", *ids], 1), got


def test_a_chain_of_takeovers_on_three_clocks_keeps_the_first_brokers_leases(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given A: 4 messages leased for 120 s; A lost 5 s later
    a = _broker(tmp_path, "a", manual_clock)
    try:
        a.create_topic(Topic("t", 1))
        a.sender.send([draft_of(Message("", "t", f"m{i}".encode())) for i in range(4)]).result(10)
        leased = a.pop.pop("t", "g", 4, 2 * INVISIBLE_S)
        handles = {p.message.message_id: p.receipt_handle for p in leased}
    finally:
        a.stop()
    manual_clock.advance(5 * SECOND_MS)
    # and B, 30 s ahead, took A over and was lost 5 s later
    b = _broker(tmp_path, "b", SkewedClock(manual_clock, 30 * SECOND_MS))
    try:
        assert b.takeover("a", force=True).done
    finally:
        b.stop()
    manual_clock.advance(5 * SECOND_MS)

    # When C, 20 s behind, takes B over
    c = _broker(tmp_path, "c", SkewedClock(manual_clock, -20 * SECOND_MS))
    try:
        assert c.takeover("b", force=True).done

        # Then 60 s after the Pop the handles A gave settle their leases at C
        manual_clock.advance(50 * SECOND_MS)
        acked = sorted(handles)[:2]
        assert c.pop.ack_many("g", [handles[m] for m in acked]) == [None, None]
        # and none of the 120 s leases ends before its time
        manual_clock.advance(55 * SECOND_MS)
        assert c.pop.revive_due() == 0
        assert _pop_all(c, "g") == []
        # and after it the two others come back, once
        manual_clock.advance(2 * INVISIBLE_S * SECOND_MS)
        c.pop.revive_due()
        manual_clock.advance(SECOND_MS)
        assert sorted(_pop_all(c, "g")) == sorted(set(handles) - set(acked))
    finally:
        c.stop()


def test_a_dead_letter_at_the_successor_of_a_broker_far_ahead_is_not_revived_later(
        tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given A, 90 s ahead of B and C: a message leased for 10 min; A lost
    a = _broker(tmp_path, "a", SkewedClock(manual_clock, 90 * SECOND_MS))
    try:
        a.create_topic(Topic("t", 1))
        a.sender.send([draft_of(Message("", "t", b"m"))]).result(10)
        (leased,) = a.pop.pop("t", "g", 1, 10 * INVISIBLE_S)
    finally:
        a.stop()
    # and B took A over, dead-lettered the message with A's handle, and was lost before
    # the mark of its lease reached the tier (the dead-letter copy did)
    b = _broker(tmp_path, "b", manual_clock)
    try:
        assert b.takeover("a", force=True).done
        manual_clock.advance(5 * SECOND_MS)
        monkeypatch.setattr(b.pop._requeuer, "_mark_done", lambda *_: None)  # never made
        assert b.pop.dead_letter_many("g", [(leased.receipt_handle, "bad")]) == [None]
    finally:
        b.stop()

    # When C takes B over and the lease's time runs out there
    c = _broker(tmp_path, "c", manual_clock)
    try:
        assert c.takeover("b", force=True).done
        got: list[str] = []
        for _ in range(3):
            manual_clock.advance(3_600_000)
            c.pop.revive_due()
            got += _pop_all(c, "g")
        # Then the message never comes to g again: C found B's dead-letter copy (read
        # from the lease's time by B's clock, not A's)
        assert got == []
    finally:
        c.stop()
