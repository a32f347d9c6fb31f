"""A takeover adopts the departed broker's pending delayed messages in bulk
(``cluster.adoption``): real brokers in one process, a real local-directory tier and
RocksDB, a manual clock that crosses the hours.

Broker A holds delayed messages near (due within the rocks horizon) and far (in its
TimerFlatFiles; some still parked when it dies, some rescheduled or cancelled there), then
is gone.  B takes it over: the far future stays in A's TimerFlatFile objects (B writes
only what they lack), Cancel and Reschedule by id reach the adopted messages, and every
pending message comes once, never before its time.  A crash in the middle of the step
resumes without scheduling anything twice or bringing back what was delivered or
cancelled since; a broker that adopted is taken over in turn and its successor keeps
what it adopted (read through the chain, or from the broker's own timer snapshot once
it folded the adoption in, the older broker's streams gone).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import cluster.adoption
import cluster.takeover
import timer.parking
from chronomq.broker import Broker
from cluster.adoption import manifest_of, pending
from cluster.replay import replay
from cluster.timersnapshot import read_pointer, read_residual
from store.clock import ManualClock
from store.errors import Unavailable
from store.message import FLAG_DELAYED, Draft, draft_of_record
from store.names import DELAYED_STREAM, TIMER_STREAM
from store.topics import Topic
from tests.chronomq.test_timer_compaction import (
    _broker,
    _caught_up,
    _dispatched,
    _send_delayed,
    _tick,
)
from tiered.timerflatfile import MAX_ADOPTED_QUEUE_OFFSET, is_adopted

HOUR_MS = 3_600_000
MINUTE_MS = 60_000


class Crash(Exception):
    """Stands for the process dying at a crash point."""


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    """Brokers a test opened, stopped after it (those still running)."""
    opened: list[Broker] = []
    yield opened
    for b in opened:
        with contextlib.suppress(Exception):  # stopped already
            b.stop()


def _open(root: Path, name: str, clock: ManualClock, brokers: list[Broker]) -> Broker:
    b = _broker(root, name, clock, every=200)
    brokers.append(b)
    return b


def _gone(root: Path, b: Broker, brokers: list[Broker]) -> None:
    """The broker's machine is lost: stopped, its data directory deleted."""
    _caught_up(b)
    b.stop()
    brokers.remove(b)
    shutil.rmtree(root / b.config.tier.broker_name)


def _run(b: Broker, clock: ManualClock, until_ms: int, step_ms: int = HOUR_MS // 4,
         got: Counter[str] | None = None, when: dict[str, int] | None = None,
         pop: bool = True) -> tuple[Counter[str], dict[str, int]]:
    """Move the clock to ``until_ms`` a step at a time, preloading and delivering, and pop
    and ack everything (unless not ``pop``): how often each id came, and when it first
    came."""
    got = Counter() if got is None else got
    when = {} if when is None else when
    while clock.now_ms() < until_ms:
        clock.advance(min(step_ms, until_ms - clock.now_ms()))
        b.timer.preload_due(clock.now_ms())
        _tick(b, clock)
        while pop and (batch := b.pop.pop("t", "g", 32, 60)):
            for p in batch:
                got[p.message.message_id] += 1
                when.setdefault(p.message.message_id, clock.now_ms())
            b.pop.ack_many("g", [p.receipt_handle for p in batch])
    return got, when


def _objects(b: Broker, owner: str) -> dict[str, int]:
    """Entries per TimerFlatFile object under ``owner``'s prefix in the tier."""
    return {p: len(b.tier.read(p)) for p in b.tier.list(f"{owner}/timer/")}


def _entries(b: Broker, owner: str) -> list[int]:
    """The offsets of every entry of ``owner``'s TimerFlatFile objects."""
    out: list[int] = []
    for path in b.tier.list(f"{owner}/timer/"):
        bucket = int(path.split("/")[2])
        out += [o for o, _ in b.flat_files.read_bucket(bucket, [path])]
    return out


def _departed_with_far_future(root: Path, clock: ManualClock, brokers: list[Broker]
                              ) -> tuple[dict[str, int], list[str]]:
    """Broker A with pending delayed messages of every kind, then gone: their due times,
    and the ids A cancelled."""
    a = _open(root, "a", clock, brokers)
    assert a.compactor is not None
    a.create_topic(Topic("t", 2))
    start = clock.now_ms()
    due: dict[str, int] = {}

    def send(ids: list[str], at_ms: int) -> None:
        _send_delayed(a, ids, at_ms)
        due.update(dict.fromkeys(ids, at_ms))
    send([f"near-{i}" for i in range(20)], start + 90 * MINUTE_MS)
    send([f"far5-{i}" for i in range(30)], start + 5 * HOUR_MS)
    send([f"far30-{i}" for i in range(30)], start + 30 * HOUR_MS)
    _dispatched(a)
    assert a.timer.write_parked(force=True) == 60  # into A's TimerFlatFiles
    _caught_up(a)
    assert a.compactor.step(force=True)  # a timer snapshot holds these
    send([f"tail6-{i}" for i in range(10)], start + 6 * HOUR_MS)  # the stream past it
    _dispatched(a)
    assert a.timer.write_parked(force=True) == 10
    for i in range(3):  # out of a TimerFlatFile object, into another hour
        assert a.timer.reschedule(f"far5-{i}", start + 9 * HOUR_MS, "t").changed == 1
        due[f"far5-{i}"] = start + 9 * HOUR_MS
    cancelled = ["far30-0", "far30-1"]
    for mid in cancelled:
        assert a.timer.cancel(mid, "t").changed == 1
        del due[mid]
    send([f"parked7-{i}" for i in range(5)], start + 7 * HOUR_MS)  # never written by A
    _dispatched(a)
    assert a.timer.statistics().parked_unwritten == 5
    _gone(root, a, brokers)
    return due, cancelled


def test_the_far_future_is_adopted_in_place_and_answers_to_its_ids(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A gone with 93 pending delayed messages, most of them far in its TimerFlatFiles
    due, cancelled_at_a = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    a_objects = _objects(_open(tmp_path, "b", manual_clock, brokers), "a")
    b = brokers[-1]

    # When B takes A over
    result = b.takeover("a", force=True)

    # Then every pending message is scheduled, the far future left where it was: B wrote
    # TimerFlatFile entries only for what A's objects lacked (still parked at A, or moved
    # by A to another hour), and nothing into its CommitLog
    assert result.done and result.pending == len(due) == 93
    assert _objects(b, "a") == a_objects
    written = _entries(b, "b")
    assert len(written) == 8 and all(is_adopted(o) for o in written)
    assert b.store.queue_bounds("%SYS%delayed", 0)[1] == 0

    # and Cancel and Reschedule by id reach adopted messages, near and far
    assert b.timer.cancel("far5-10", "t").changed == 1  # in A's object
    assert b.timer.cancel("parked7-0", "t").changed == 1  # in B's own object
    assert b.timer.reschedule("far30-5", start + 3 * HOUR_MS, "t").changed == 1
    assert b.timer.reschedule("near-0", start + 12 * HOUR_MS, "t").changed == 1
    assert b.timer.pending_due("far30-6") == start + 30 * HOUR_MS
    due.update({"far30-5": start + 3 * HOUR_MS, "near-0": start + 12 * HOUR_MS})
    for mid in ("far5-10", "parked7-0"):
        del due[mid]

    # When time runs past every due time
    got, when = _run(b, manual_clock, start + 31 * HOUR_MS)

    # Then each pending message came once, none before its time, none cancelled
    assert set(got) == set(due), (sorted(set(due) - set(got)), sorted(set(got) - set(due)))
    assert max(got.values()) == 1
    early = {m: (when[m] - due[m]) for m in due if when[m] < due[m]}
    assert not early, early
    late = {m: (when[m] - due[m]) for m in due if when[m] - due[m] > HOUR_MS // 4}
    assert not late, late
    assert not set(got) & {*cancelled_at_a, "far5-10", "parked7-0"}
    # and every TimerFlatFile object, A's adopted ones too, is gone once preloaded
    assert _objects(b, "a") == {} and _objects(b, "b") == {}


@pytest.mark.parametrize(("label", "nth"), [("timer.after_add", 3),
                                            ("timer.after_flat_write", 1)])
def test_a_takeover_cut_in_its_timer_step_resumes_without_twice_or_resurrection(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],
        monkeypatch: pytest.MonkeyPatch, label: str, nth: int) -> None:
    due, _ = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    b = _open(tmp_path, "b", manual_clock, brokers)
    # Given B's timer step in batches of 10, dying at a crash point of its Nth batch
    monkeypatch.setattr(cluster.adoption, "BATCH", 10)
    passes = Counter[str]()
    real = timer.parking.crashpoint

    def crash_at(name: str) -> None:
        passes[name] += 1
        if name == label and passes[name] == nth:
            raise Crash(name)
        real(name)
    monkeypatch.setattr(timer.parking, "crashpoint", crash_at)
    with pytest.raises(Crash):
        b.takeover("a", force=True)
    monkeypatch.setattr(timer.parking, "crashpoint", real)
    b.stop()
    brokers.remove(b)
    b = _open(tmp_path, "b", manual_clock, brokers)  # restarted on its data directory
    scheduled = b.timer.parking.adopted("a")
    assert 0 < scheduled < len(due) or label == "timer.after_flat_write"
    # When, before the takeover resumes, what was scheduled is delivered (the timer
    # runs) while the taken topic answers no client: no Pop, no Cancel (issue 51, 3)
    _run(b, manual_clock, start + 100 * MINUTE_MS, step_ms=5 * MINUTE_MS, pop=False)
    with pytest.raises(Unavailable):
        b.pop.pop("t", "g", 32, 60)
    with pytest.raises(Unavailable):
        b.timer.cancel("far5-5", "t")
    with pytest.raises(Unavailable):  # a debounce's replace would replace nothing yet
        b.sender.submit([Draft("far5-5", "t", "", "", b"newer", b"", manual_clock.now_ms(),
                               start + 31 * HOUR_MS)], manual_clock.now_ms(), dedupe=False)
    result = b.takeover("a", force=True)

    # Then the resumed step schedules the rest: every message once, the cancelled ones
    # (now that the topic answers) never
    assert result.done and result.pending == len(due)
    cancelled = [m for m in ("far5-5", "far30-2") if b.timer.cancel(m, "t").changed]
    assert cancelled == ["far5-5", "far30-2"]
    got, when = _run(b, manual_clock, start + 31 * HOUR_MS)
    assert set(got) == set(due) - set(cancelled)
    assert max(got.values()) == 1, [m for m, n in got.items() if n > 1]
    assert all(when[m] >= due[m] for m in got)


@pytest.mark.parametrize("fold", [False, True], ids=["chain-read", "folded"])
def test_a_broker_that_adopted_is_taken_over_and_its_successor_keeps_what_it_adopted(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker], fold: bool) -> None:
    due, _ = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    b = _open(tmp_path, "b", manual_clock, brokers)
    assert b.takeover("a", force=True).pending == len(due)
    # Given B delivered the near ones, cancelled and moved adopted ones, took sends of
    # its own
    got, when = _run(b, manual_clock, start + 2 * HOUR_MS)
    assert set(got) == {m for m in due if m.startswith("near-")}
    assert b.timer.cancel("far30-3", "t").changed == 1
    assert b.timer.reschedule("far30-4", start + 8 * HOUR_MS, "t").changed == 1
    assert b.timer.reschedule("far5-4", start + 40 * HOUR_MS, "t").changed == 1
    _send_delayed(b, ["own-0", "own-1"], start + 20 * HOUR_MS)
    due.update({"far30-4": start + 8 * HOUR_MS, "far5-4": start + 40 * HOUR_MS,
                "own-0": start + 20 * HOUR_MS, "own-1": start + 20 * HOUR_MS})
    del due["far30-3"]
    left = {m for m in due if m not in got}
    _dispatched(b)
    b.timer.write_parked(force=True)
    if fold:  # and its timer snapshot folded what it adopted in
        _caught_up(b)
        assert b.compactor is not None and b.compactor.step(force=True)
        pointer = read_pointer(b.tier, "b")
        assert pointer is not None and len(pointer.folded) == 1
        assert pointer.folded_brokers == ["a"]
        assert pointer.records == len(left)  # A's pending ones and B's own, nothing done
        done, moved = read_residual(b.tier, pointer.residual)
        assert not any(is_adopted(o) for o in (*done, *moved))  # applied to the parts
        assert not b.compactor.step(force=True)  # folded once
    # and then B was lost too
    _gone(tmp_path, b, brokers)
    if fold:  # and A's delayed and timer streams are gone (its TimerFlatFiles stay)
        for stream in (DELAYED_STREAM, TIMER_STREAM):
            for prefix in (f"a/meta/{stream}/", f"a/data/{stream}/"):
                for path in b.tier.list(prefix):
                    b.tier.delete(path)

    # When C takes B over
    c = _open(tmp_path, "c", manual_clock, brokers)
    result = c.takeover("b", force=True)

    # Then C schedules what B held, A's adopted messages included (folded: from B's
    # snapshot alone), and writes TimerFlatFile entries only for the two B moved: A's and
    # B's objects hold every other far one; each comes once, none early
    assert result.pending == len(left)
    assert len(_entries(c, "c")) == 2
    _run(c, manual_clock, start + 41 * HOUR_MS, got=got, when=when)
    assert set(got) == set(due)
    assert max(got.values()) == 1
    assert all(when[m] >= due[m] for m in due)


def test_a_takeover_an_older_release_began_is_finished_without_appending_twice(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    due, _ = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    b = _open(tmp_path, "b", manual_clock, brokers)

    # Given a takeover an older release cut short in its timer step: it had appended the
    # first 25 of A's pending messages to B's CommitLog (its progress said 20)
    def stop_before_timers(name: str) -> None:
        if name == "takeover.after_topics":
            raise Crash(name)
    monkeypatch.setattr(cluster.takeover, "crashpoint", stop_before_timers)
    with pytest.raises(Crash):
        b.takeover("a", force=True)
    monkeypatch.undo()
    m = manifest_of(b.tier, b.takeovers._mount("a"), replay(b.tier, b.takeovers._mount("a")))
    first = [x for chunk in pending(b.tier, m, b.takeovers._mount) for x in chunk][:25]
    b.store.put_drafts([draft_of_record(record, d, FLAG_DELAYED)
                        for _, d, _, record in first]).result(10)
    state_file = tmp_path / "b" / "takeovers" / "a.json"
    state = json.loads(state_file.read_text())
    through = (first[19][2] & MAX_ADOPTED_QUEUE_OFFSET) + 1
    state.update(timers_started=True, timers_through=through, pending=20)
    state_file.write_text(json.dumps(state))
    b.stop()
    brokers.remove(b)
    b = _open(tmp_path, "b", manual_clock, brokers)

    # When the new release finishes it
    assert b.takeover("a", force=True).pending == len(due)

    # Then every message comes once, at its time
    got, when = _run(b, manual_clock, start + 31 * HOUR_MS)
    assert set(got) == set(due)
    assert max(got.values()) == 1, [m for m, n in got.items() if n > 1]
    assert all(when[m] >= due[m] for m in due)
