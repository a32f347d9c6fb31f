"""Fixtures of the tests that run broker processes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.process import ServerProcess


@pytest.fixture
def no_process_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every broker process a test started is gone after it, even when it failed early
    (paused ones are resumed first)."""
    started: list[ServerProcess] = []
    init = ServerProcess.__init__

    def track(self: ServerProcess, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        started.append(self)
    monkeypatch.setattr(ServerProcess, "__init__", track)
    yield
    for p in started:
        if p.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(p.proc.pid, signal.SIGCONT)
            p.kill9()
