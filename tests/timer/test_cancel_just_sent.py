"""A Cancel or Reschedule right after the Send of its message, before the store's
dispatcher handed the record to the timer (real broker in one process, RocksDB, a manual
clock).  Seen in CI (``tests/chronomq/test_takeover.py``, a Cancel sent right after the
Send's OK answered NOT_FOUND): the timer found nothing, the store's lookup waited for
the dispatcher and found the record pending, and the answer was NOT_FOUND all the same.
Now the timer looks again once the lookup says the message is pending."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from testkit.wait import wait_until
from timer.model import TimerOutcome

HOUR_MS = 3_600_000


def _waiting_for_dispatch() -> bool:
    """Some thread waits in the store's lookup for the dispatcher."""
    for frame in sys._current_frames().values():
        f: Any = frame
        while f is not None:
            if f.f_code.co_name == "wait_dispatched":
                return True
            f = f.f_back
    return False


@pytest.mark.parametrize("change", ["cancel", "reschedule"])
def test_a_change_right_after_the_send_finds_the_message(
        tmp_path: Path, manual_clock: ManualClock, change: str) -> None:
    b = Broker(BrokerConfig(store=StoreConfig(str(tmp_path / "data"))), manual_clock)
    b.open()
    b.start(timer_thread=False)
    try:
        # Given a delayed message sent (OK: in the CommitLog) that the store's dispatcher
        # has not handed to the timer yet
        b.create_topic(Topic("t", 1))
        assert b.store.dispatcher is not None
        b.store.dispatcher.stop()  # (it dispatches on this thread from now on)
        now = manual_clock.now_ms()
        due, flags = b.sender.resolve_deliver_at(now + HOUR_MS, 0, now)
        b.sender.stored(b.sender.submit([Draft("m", "t", "", "", b"x", b"", now, due, flags,
                                               0)], now))
        # When it is cancelled (or moved) while the dispatcher catches up
        call: Callable[[], Any] = (lambda: b.timer.cancel("m")) if change == "cancel" \
            else (lambda: b.timer.reschedule("m", due + HOUR_MS))
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(call)
            wait_until(_waiting_for_dispatch, 10, "the change waiting for the dispatcher")
            b.store.dispatcher.catch_up()
            outcome = answer.result(10).outcome
        # Then it is found
        expected = TimerOutcome.CANCELLED if change == "cancel" else TimerOutcome.RESCHEDULED
        assert outcome is expected
    finally:
        b.stop()
