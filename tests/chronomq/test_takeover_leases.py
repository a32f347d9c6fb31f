"""A takeover keeps the leases it adopts (finding 4 of issue 37), on real brokers in one
process, a real local-directory tier (durable-ack) and RocksDB.

A takeover writes the departed broker's leases into this broker's lease book before it
serves the departed broker's queues (``cluster.takeover``: "positions before topics").
A lease whose invisible time had passed is due at once, so the revive thread may fire it
in between; it must then find the message "not readable here yet" and try again later,
not give the message up as removed by retention.  The test holds the takeover in that
window (B's tier pauses the write of ``b/takeovers/a.json``, which the takeover makes
between the two) and revives there.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from store.clock import ManualClock
from store.message import Message, draft_of
from store.topics import Topic
from tests.chronomq.test_journal_snapshots import _broker
from tests.tiered.test_tiered_pop import _pop_all
from tiered.providers.local import LocalProvider

SHORT_S = 10  # leases that ran out before the takeover
LONG_S = 60  # leases still held at the takeover
WINDOW_TIMEOUT_S = 30


class PausingTier(LocalProvider):
    """The local-directory tier, but the write of ``path`` waits until ``resume`` is
    set (``reached`` says it is waiting).  Thread-safe."""

    def __init__(self, root: str, path: str) -> None:
        super().__init__(root)
        self._path = path
        self.reached = threading.Event()
        self.resume = threading.Event()

    def write(self, path: str, data: bytes) -> None:
        if path == self._path:
            self.reached.set()
            assert self.resume.wait(WINDOW_TIMEOUT_S), "the test never resumed the write"
        super().write(path, data)


def test_a_revive_during_a_takeover_keeps_the_adopted_leases(
        tmp_path: Path, manual_clock: ManualClock,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given A: 40 messages; group g leases 8 for 10 s and 8 for 60 s, acks 2 of each,
    # those of the 60 s leases 20 s later (the 10 s leases ran out, unrevived; A's
    # clock read that: they have no time left at a successor, ``pop.leaseclock``), and
    # A is gone
    a = _broker(tmp_path, "a", manual_clock)
    try:
        a.create_topic(Topic("t", 2))
        sent = [i.message_id for i in a.sender.send([draft_of(Message("", "t", f"m{i}".encode()))
                                                     for i in range(40)]).result(10)]
        short = a.pop.pop("t", "g", 8, SHORT_S)
        long = a.pop.pop("t", "g", 8, LONG_S)
        assert len(short) == len(long) == 8
        a.pop.ack_many("g", [p.receipt_handle for p in short[:2]])
        manual_clock.advance(20_000)
        a.pop.ack_many("g", [p.receipt_handle for p in long[:2]])
        acked = {p.message.message_id for p in short[:2] + long[:2]}
        expired = {p.message.message_id for p in short[2:]}
        held = {p.message.message_id for p in long[2:]}
    finally:
        a.stop()
    never_popped = set(sent) - acked - expired - held

    # When B takes A over and revives while the leases are adopted but A's queues are not
    # served here yet (the takeover paused on its record in the tier, written between)
    b = _broker(tmp_path, "b", manual_clock)
    tier = PausingTier(b.config.tier_local_dir(), "b/takeovers/a.json")
    b.tier = tier
    try:
        took: list[object] = []
        runner = threading.Thread(target=lambda: took.append(b.takeover("a", force=True)),
                                  name="takeover")
        runner.start()
        try:
            assert tier.reached.wait(WINDOW_TIMEOUT_S), "the takeover never reached its write"
            window = b.store.topics.get("t") is None  # the leases are here, the topic not
            in_window = b.pop.revive_due()
        finally:
            tier.resume.set()
            runner.join(WINDOW_TIMEOUT_S)
        assert took, "the takeover did not finish"
        # nothing served yet: nothing revived, nothing given up (were the topic served
        # first, the expired leases would revive here at once)
        assert in_window == (0 if window else len(expired))

        # Then the leases that ran out come back (after the retry), then the held ones
        # after their invisible time, the rest once each; an acked one never
        manual_clock.advance(1_000)
        b.pop.revive_due()
        got = _pop_all(b, "g")
        assert not set(got) & (acked | held)
        assert sorted(got) == sorted(never_popped | expired)
        manual_clock.advance(LONG_S * 1000)
        b.pop.revive_due()
        assert sorted(_pop_all(b, "g")) == sorted(held)
        lost = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.ERROR and "cannot redeliver" in r.getMessage()]
        assert lost == []
    finally:
        b.stop()


def test_leases_of_a_topic_held_by_a_takeover_wait_to_revive(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """A takeover adopts leases (``positions``) before their pending delayed messages
    (``timers``); an adopted lease its departed broker had Nacked with a delay is settled
    only when the delayed retry copy is adopted.  Seen in the failover chaos: with a
    timers step of 15 s, the adopted lease ran out first, was revived, and the delayed
    copy fired too: the message came twice, the second time after an OK ack.  So the
    leases of a held topic do not revive (nor Nack) until the takeover releases it."""
    # Given three messages of t leased for 10 s, and t held as a takeover holds it
    b = _broker(tmp_path, "b", manual_clock)
    try:
        b.create_topic(Topic("t", 1))
        b.sender.send([draft_of(Message("", "t", f"m{i}".encode()))
                       for i in range(3)]).result(10)
        leased = b.pop.pop("t", "g", 3, SHORT_S)
        assert len(leased) == 3
        b.store.holds.hold(["t"], "broker-gone")

        # When one is Nacked while t is held, and their invisible time passes
        (refused,) = b.pop.release_many("g", [(leased[0].receipt_handle, None)])
        manual_clock.advance(SHORT_S * 1000 + 1)

        # Then the Nack is refused for now (its lease runs out instead), and none revives
        # (the leases stay open)
        assert refused is not None and "not served here yet" in str(refused)
        assert b.pop.revive_due() == 0

        # and once the takeover releases t, they revive
        b.store.holds.release(["t"])
        manual_clock.advance(1_000)  # (a revive that waited is tried again after a while)
        revived = 0
        for _ in range(10):
            revived += b.pop.revive_due()
            manual_clock.advance(1_000)
        assert revived == 3
    finally:
        b.stop()
