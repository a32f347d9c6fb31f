"""The failover chaos's checks can fail (``testkit.checker.check``, its load rules in
``testkit/promises.py``): each is fed a ledger with the fault it names, and the same
ledger without it."""

from __future__ import annotations

from testkit.checker import check
from testkit.ledger import (
    AckOk,
    ClockAhead,
    Delivery,
    Entry,
    Probe,
    ReplaceOk,
    ScheduleEnd,
    ScheduleMade,
    SendAttempt,
    SendOk,
    Skip,
    TopicDeleted,
    TopicSeen,
)
from testkit.promises import check_load, missing_ticks, plain

T0 = 1_700_000_000_000


def _got(mid: str, token: str, at_ms: int, lease: str, topic: str = "t0") -> Delivery:
    return Delivery(lease, mid, "g", topic, token, True, at_ms - 5, at_ms, 6, 1)


def _ticks(*missing: int, twice: bool = False, catch_up_at: int = 0) -> list[Entry]:
    """Ticks 0..9 of ``sch-t0`` (every second from T0), delivered and acked at their due
    time, but for ``missing``; ``twice``: tick 3 again after its ack; ``catch_up_at``:
    the tick after the missing ones arrived this late (ms after T0)."""
    out: list[Entry] = [ScheduleMade("sch-t0", "t0", 1000, T0, 100, T0 - 2000)]
    for n in range(10):
        if n in missing:
            continue
        at = T0 + n * 1000
        if catch_up_at and n == max(missing) + 1:
            at = T0 + catch_up_at
        out += [_got(f"sch-t0@{T0 + n * 1000}", "tick-t0", at, f"l{n}"),
                AckOk(f"l{n}", f"sch-t0@{T0 + n * 1000}", "g", at + 10)]
    if twice:
        out.append(_got(f"sch-t0@{T0 + 3000}", "tick-t0", T0 + 3500, "again"))
    out.append(ScheduleEnd("sch-t0", T0 + 9000 + 5000))
    return out


def _kinds(entries: list[Entry]) -> list[str]:
    return [v.split(" ", 1)[0] for v in check_load(entries)]


def test_every_tick_delivered_once_passes() -> None:
    assert _kinds(_ticks()) == []


def test_a_tick_missing_is_named() -> None:
    assert _kinds(_ticks(4)) == ["TICK_MISSING"]
    assert missing_ticks(_ticks(4, 5)) == {"sch-t0": [T0 + 4000, T0 + 5000]}


def test_a_tick_dropped_within_the_misfire_bound_is_excused() -> None:
    # the tick after the gap arrived 100 ticks (the bound) after the first missing one
    assert _kinds(_ticks(4, catch_up_at=4000 + 100_000)) == []
    assert _kinds(_ticks(4, catch_up_at=4000 + 60_000)) == ["TICK_MISSING"]


def test_a_tick_delivered_after_its_ack_is_named() -> None:
    assert _kinds(_ticks(twice=True)) == ["TICK_TWICE"]


def _debounce(*, stale: bool = False, last_lost: bool = False,
              old_acked_last: bool = False) -> list[Entry]:
    """deb-t0-0: #1 OK, #2 replaces it OK (replaced 1), #2 fires and is acked."""
    out: list[Entry] = [
        SendAttempt("deb-t0-0#1", "t0", T0 + 3000), ReplaceOk("deb-t0-0#1", "deb-t0-0", 0,
                                                              T0, T0 + 20),
        SendAttempt("deb-t0-0#2", "t0", T0 + 1000 + 3000),
        ReplaceOk("deb-t0-0#2", "deb-t0-0", 1, T0 + 1000, T0 + 1020)]
    if not last_lost:
        out += [_got("deb-t0-0", "deb-t0-0#2", T0 + 4100, "a"),
                AckOk("a", "deb-t0-0", "g", T0 + 4110)]
    if stale:
        out.append(_got("deb-t0-0", "deb-t0-0#1", T0 + 3100, "b"))
    if old_acked_last:
        out += [_got("deb-t0-0", "deb-t0-0#1", T0 + 5000, "c"),
                AckOk("c", "deb-t0-0", "g", T0 + 5010)]
    return out


def test_debounce_last_body_delivered_passes() -> None:
    assert _kinds(_debounce()) == []


def test_a_replaced_body_delivered_is_named() -> None:
    assert _kinds(_debounce(stale=True)) == ["DEBOUNCE_STALE"]


def test_the_last_body_lost_is_named() -> None:
    assert _kinds(_debounce(last_lost=True)) == ["DEBOUNCE_STALE"]


def test_an_older_body_acked_last_is_named() -> None:
    assert "DEBOUNCE_STALE" in _kinds(_debounce(old_acked_last=True))


def test_a_body_due_before_its_replacement_was_sent_may_come_after_it() -> None:
    # Given #1 due at T0 + 500 (it may have fired: not pending), #2 sent at T0 + 1000
    entries: list[Entry] = [
        SendAttempt("deb-t0-0#1", "t0", T0 + 500),
        ReplaceOk("deb-t0-0#1", "deb-t0-0", 0, T0, T0 + 20),
        SendAttempt("deb-t0-0#2", "t0", T0 + 4000),
        ReplaceOk("deb-t0-0#2", "deb-t0-0", 1, T0 + 1000, T0 + 1020),
        _got("deb-t0-0", "deb-t0-0#2", T0 + 4100, "a"), AckOk("a", "deb-t0-0", "g", T0 + 4110),
        _got("deb-t0-0", "deb-t0-0#1", T0 + 5000, "b"), AckOk("b", "deb-t0-0", "g", T0 + 5010)]
    # Then #1 acked last after #2 is no violation: it was delivered, not replaced
    assert _kinds(entries) == []


def test_a_debounced_body_made_due_by_a_clock_ahead_is_excused_only_then() -> None:
    # Given the last body delivered 1.5 s before its lower bound (the CI run met one)
    early: list[Entry] = [
        SendAttempt("deb-t0-1#1", "t0", T0 + 3000),
        ReplaceOk("deb-t0-1#1", "deb-t0-1", 0, T0, T0 + 20),
        _got("deb-t0-1", "deb-t0-1#1", T0 + 1500, "e"), AckOk("e", "deb-t0-1", "g", T0 + 1510)]
    assert _kinds(early) == ["EARLY"]
    # When its broker ran 30 s ahead from T0 - 1 s to T0 + 1 s: its clock made it due
    assert _kinds([*early, ClockAhead("broker-1", 30_000, T0 - 1000, T0 + 1000)]) == []
    # Then a window 1 s ahead does not excuse it
    assert _kinds([*early, ClockAhead("broker-1", 1_000, T0 - 1000, T0 + 1000)]) == ["EARLY"]


def test_a_body_of_unknown_outcome_last_leaves_the_id_unjudged() -> None:
    entries = [*_debounce(last_lost=True), SendAttempt("deb-t0-0#3", "t0", T0 + 9000)]
    assert _kinds(entries) == []


def test_debounced_and_tick_deliveries_are_not_judged_as_plain_messages() -> None:
    entries = [*_debounce(), *_ticks()]
    assert not [e for e in plain(entries) if isinstance(e, Delivery | AckOk | SendAttempt)]


def _deleted(*later: Entry) -> list[Entry]:
    return [SendAttempt("z1-0", "z1", T0), _got("z1-0", "z1-0", T0 + 50, "z"),
            AckOk("z", "z1-0", "g", T0 + 60), TopicDeleted("z1", T0 + 100, T0 + 200),
            *later]


def test_a_deleted_topic_gone_passes() -> None:
    assert _kinds(_deleted()) == []


def test_a_deleted_topic_listed_again_is_named() -> None:
    assert _kinds(_deleted(TopicSeen("z1", "listed by broker-2", T0 + 9000))) == \
        ["DELETED_BACK"]


def test_an_acked_message_of_a_deleted_topic_delivered_again_is_named() -> None:
    assert _kinds(_deleted(_got("z1-0", "z1-0", T0 + 9000, "again", "z1"))) == \
        ["DELETED_BACK"]


def test_early_is_excused_only_within_a_clock_ahead_window() -> None:
    early: list[Entry] = [SendAttempt("u0-1", "t0", T0 + 20_000), SendOk("u0-1", "u0-1"),
             _got("u0-1", "u0-1", T0 + 1000, "e"), AckOk("e", "u0-1", "g", T0 + 1010)]
    assert check(early, group="g").count("EARLY") == 1
    window = ClockAhead("broker-1", 30_000, T0, T0 + 5000)
    assert check([*early, window], group="g").count("EARLY") == 0
    assert check([*early, window], group="g").excused == 1
    short = ClockAhead("broker-1", 10_000, T0, T0 + 5000)
    assert check([*early, short], group="g").count("EARLY") == 1


def test_early_after_a_clock_ahead_window_is_excused_only_if_due_by_its_clock() -> None:
    # Given a broker 30 s ahead from T0 to T0 + 5 s: by its clock T0 + 20 s came in it
    window = ClockAhead("broker-1", 30_000, T0, T0 + 5000)
    made_due: list[Entry] = [SendAttempt("u0-4", "t0", T0 + 20_000), SendOk("u0-4", "u0-4"),
                             _got("u0-4", "u0-4", T0 + 9000, "f")]
    # When its successor delivers what it left due in a queue, after the window
    assert check([*made_due, window], group="g").excused == 1
    assert check([*made_due, window], group="g").count("EARLY") == 0
    # Then a due time that clock never reached (T0 + 40 s: it died at T0 + 35 s by it)
    never: list[Entry] = [SendAttempt("u0-5", "t0", T0 + 40_000), SendOk("u0-5", "u0-5"),
                          _got("u0-5", "u0-5", T0 + 30_000, "h")]
    assert check([*never, window], group="g").count("EARLY") == 1
    # nor does a delivery before the window began
    before: list[Entry] = [SendAttempt("u0-6", "t0", T0 + 1000), SendOk("u0-6", "u0-6"),
                           _got("u0-6", "u0-6", T0 - 500, "i")]
    assert check([*before, window], group="g").count("EARLY") == 1


def test_a_lease_ended_early_is_excused_only_by_a_clock_jump() -> None:
    # Given a lease of 6 s popped at T0; the message again 3 s later
    entries: list[Entry] = [SendAttempt("u0-2", "t0", T0 - 100), SendOk("u0-2", "u0-2"),
               _got("u0-2", "u0-2", T0, "a"), _got("u0-2", "u0-2", T0 + 3000, "b")]
    assert check(entries, group="g").count("LEASE_BROKEN") == 1
    # its broker restarted with its clock 30 s ahead in between: its clock ended it
    jump = ClockAhead("broker-1", 30_000, T0 + 1000, T0 + 9000)
    assert check([*entries, jump], group="g").count("LEASE_BROKEN") == 0
    # a window that began before the lease was given does not excuse it
    before = ClockAhead("broker-1", 30_000, T0 - 1000, T0 + 9000)
    assert check([*entries, before], group="g").count("LEASE_BROKEN") == 1


def test_a_skipped_delivery_never_back_is_named() -> None:
    sent: list[Entry] = [SendAttempt("u0-3", "t0", T0), SendOk("u0-3", "u0-3"),
                         _got("u0-3", "u0-3", T0 + 10, "s"), Skip("s")]
    assert [v.kind for v in check(sent, group="g").violations] == ["NOT_BACK"]
    back = [*sent, _got("u0-3", "u0-3", T0 + 7000, "t"), AckOk("t", "u0-3", "g", T0 + 7010)]
    assert check(back, group="g").ok


def test_an_ok_from_a_life_after_its_claim_is_named() -> None:
    probes: list[Entry] = [Probe("broker-2", "x-1", T0, T0 + 50),
                           Probe("broker-2--1", "x-2", T0 + 9000, T0 + 9050)]
    claims = {"broker-2": ("broker-5", T0 + 1000)}
    assert check(probes, group="g", claims=claims).ok  # the next life may answer
    late = [*probes, Probe("broker-2", "x-3", T0 + 1500, T0 + 1550)]
    report = check(late, group="g", claims=claims)
    assert [v.kind for v in report.violations] == ["OK_AFTER_TAKEOVER"]
    assert report.closest_ok_to_claim_ms == 550
