"""``wait_until``, the one way tests wait: for a condition, never for a span of time, and a
wait that runs out fails naming what it waited for (a loop that fell through on its
deadline left the failure to some later, unrelated-looking assertion)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from testkit.wait import wait_until


def test_returns_the_first_true_answer_as_soon_as_it_comes() -> None:
    answers: Iterator[object] = iter([0, [], None, "ready", "later"])
    assert wait_until(lambda: next(answers), 5, "an answer", poll_s=0.001) == "ready"


def test_waits_for_another_thread() -> None:
    done = threading.Event()
    timer = threading.Timer(0.05, done.set)
    timer.start()
    t0 = time.monotonic()
    assert wait_until(done.is_set, 5, "the timer thread") is True
    assert time.monotonic() - t0 < 4  # ended by the condition, not by the time-out
    timer.join()


def test_a_timeout_names_what_and_the_last_value_shown() -> None:
    count = [0]

    def never() -> bool:
        count[0] += 1
        return False

    with pytest.raises(AssertionError) as info:
        wait_until(never, 0.05, "3 writes held", show=lambda: f"{count[0]} held")
    message = str(info.value)
    assert "waiting for 3 writes held" in message and "0.05 s" in message
    assert f"last seen: '{count[0]} held'" in message and count[0] > 1


def test_without_show_the_timeout_names_the_conditions_last_answer() -> None:
    with pytest.raises(AssertionError, match=r"waiting for lines \(last seen: \[\]\)"):
        wait_until(lambda: [], 0.02, "lines")


def test_the_condition_runs_once_more_at_the_deadline() -> None:
    calls = [0]

    def second_call() -> bool:
        calls[0] += 1
        return calls[0] == 2

    # the poll interval is longer than the time-out: the one sleep ends at the deadline
    t0 = time.monotonic()
    assert wait_until(second_call, 0.05, "a second call", poll_s=10) is True
    assert time.monotonic() - t0 < 1


def test_an_error_in_the_condition_is_not_swallowed() -> None:
    def broken() -> bool:
        raise KeyError("tier.lag_bytes")

    with pytest.raises(KeyError, match=r"tier\.lag_bytes"):
        wait_until(broken, 5, "a stat")
