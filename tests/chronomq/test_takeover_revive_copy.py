"""A departed broker's last revive: its invisible time over, a leased message got a copy
on the group's retry topic and the state stream a record marking the lease done, in two
CommitLog writes, and the broker died before both were in the tier.  They go up in
different queues, so the mark may be there without the copy.  Real brokers in one
process, a real local-directory tier and RocksDB, a manual clock.

Seen in the failover chaos run (bench/RESULTS.md, issue 51): a message popped and never
acked did not come back to its group after its owner was killed 10-20 ms after reviving
it: the state stream's metadata copy in the tier held the mark, the retry queue's did
not list the copy.  A successor reading the mark settles the lease as revived and never
revives it again; the copy it would serve was never uploaded.  The state stream's
metadata copy now waits for every other queue up to its records (``tiered.dispatcher``,
``JOURNAL_STREAMS``), as the timer stream's does.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import chronomq.broker
from store.clock import ManualClock
from store.message import Message, draft_of
from store.names import RETRY_PREFIX, STATE_STREAM
from store.topics import Topic
from tests.chronomq.test_duplicate_durability import Faulty
from tests.chronomq.test_takeover_at_most_once import _broker
from tests.chronomq.test_takeover_last_moments import _metas
from tiered.dispatcher import RETRY_MAX_MS
from tiered.providers.local import LocalProvider

INVISIBLE_S = 10
UPLOAD_WAIT_S = 20  # the tier's own thread commits (and fails) on its own time


def _past_back_off(clock: ManualClock) -> bool:
    """Move the clock past a failed commit's back-off (the tier's thread tries again)."""
    clock.advance(RETRY_MAX_MS)
    return True


def _wait(what: str, done: object) -> None:
    deadline = time.monotonic() + UPLOAD_WAIT_S
    while time.monotonic() < deadline:
        if callable(done) and done():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_a_revive_mark_never_reaches_the_tier_before_its_retry_copy(
        tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given A, its tier refusing every write of a retry topic's queues, the rest going
    # in; group g popped five messages of t for 10 s and acked none
    faulty = Faulty(LocalProvider(str(tmp_path / "tier")))
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: faulty)
    a = _broker(tmp_path, "a", manual_clock)
    alive = [a]
    try:
        a.create_topic(Topic("t", 1))
        sent = [i.message_id for i in a.sender.send(
            [draft_of(Message("", "t", f"m{i}".encode())) for i in range(5)]).result(10)]
        popped = a.pop.pop("t", "g", 5, INVISIBLE_S)
        assert sorted(p.message.message_id for p in popped) == sorted(sent)
        tiered = a.tiered
        assert tiered is not None
        state = tiered.queue(STATE_STREAM, 0)
        assert state is not None
        tiered.wait_durable(a.store.commitlog.confirmed_offset, UPLOAD_WAIT_S)
        before = _metas(a, STATE_STREAM)
        committed = state.committed_queue_offset
        failed = tiered.statistics().failed_uploads
        faulty.refuse = RETRY_PREFIX

        # When their invisible time passes, A revives them (a copy each on the retry
        # topic, which cannot reach the tier; the state stream's mark, which can), and A
        # dies
        manual_clock.advance(INVISIBLE_S * 1000 + 1)
        assert a.pop.revive_due() == 5
        _wait("the retry copies refused, the marks uploaded",
              lambda: _past_back_off(manual_clock)
              and tiered.statistics().failed_uploads > failed
              and state.committed_queue_offset > committed)

        # Then the state stream's copy in the tier still ends before the marks
        assert _metas(a, STATE_STREAM) == before
        a.stop()
        alive.remove(a)
        shutil.rmtree(tmp_path / "a")
        faulty.refuse = ""

        # and B, taking A over, gives each message to g again once its lease ran out
        b = _broker(tmp_path, "b", manual_clock)
        alive.append(b)
        assert b.takeover("a", force=True).done
        manual_clock.advance(INVISIBLE_S * 1000 + 1)
        got: list[str] = []
        for _ in range(3):
            b.pop.revive_due()
            got += [p.message.message_id for p in b.pop.pop("t", "g", 32, 60)]
            manual_clock.advance(1000)
        assert sorted(got) == sorted(sent), got
    finally:
        faulty.refuse = ""  # so that stopping drains
        for broker in alive:
            broker.stop()
