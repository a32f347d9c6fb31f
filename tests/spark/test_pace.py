"""The replay's rate cap, on an injected clock: requests leave as soon as the messages
before them are within the rate, never sooner, and a slow broker is not held back more."""

from __future__ import annotations

from spark.jobs import Pace


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s


def test_requests_leave_at_the_rate() -> None:
    t = FakeTime()
    pace = Pace(1000, t.clock, t.sleep)
    sent_at = []
    for _ in range(10):  # 100 messages a request, each sent at once
        pace.before(100)
        sent_at.append(round(t.now - 100.0, 6))
    # the k-th request goes when the 100 k before it are within 1,000/s
    assert sent_at == [round(k * 0.1, 6) for k in range(10)]


def test_a_slow_broker_is_not_held_back_further() -> None:
    t = FakeTime()
    pace = Pace(1000, t.clock, t.sleep)
    for _ in range(5):
        pace.before(100)
        t.now += 0.3  # each request takes 0.3 s to answer: the rate is out of reach
    assert round(t.now - 100.0, 6) == 1.5  # five requests, no sleep at all


def test_no_rate_no_wait() -> None:
    t = FakeTime()
    pace = Pace(0, t.clock, t.sleep)
    for _ in range(3):
        pace.before(500)
    assert t.now == 100.0
