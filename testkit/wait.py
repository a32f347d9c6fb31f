"""Waiting on the real clock for something a broker in a thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, *,
               show: Callable[[], object] | None = None, poll_s: float = 0.01) -> T:
    """Call ``condition`` every ``poll_s`` (on the real clock: a broker in a thread or
    process moves on its own) until it returns a true value, and return that value.
    After ``timeout_s`` it raises ``AssertionError`` naming ``what`` was awaited and the
    last value seen: ``show()`` when given (say, a count the condition compares), else
    the condition's own last answer.  The condition runs once more at the deadline, so a
    slow last call still counts; exceptions it raises are not caught."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            last = show() if show is not None else value
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} "
                                 f"(last seen: {last!r})")
        time.sleep(min(poll_s, remaining_s))
