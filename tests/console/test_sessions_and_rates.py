"""Console sessions (expiry, the cap, tokens) and the overview's rates, with injected
clocks."""

from __future__ import annotations

from chronomq.console import session as session_module
from chronomq.console.rates import RateSampler
from chronomq.console.session import Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_expires_after_its_idle_time_and_each_visit_renews_it() -> None:
    clock = Clock()
    sessions = Sessions("t0ken", ttl_s=60, now_s=clock)
    s = sessions.open(authenticated=True)
    clock.now += 59
    assert sessions.get(s.sid) is s  # renewed at 1059
    clock.now += 59
    assert sessions.get(s.sid) is s
    clock.now += 61
    assert sessions.get(s.sid) is None
    assert sessions.get(None) is None and sessions.get("x" * 101) is None


def test_tokens_and_csrf_are_checked_exactly() -> None:
    sessions = Sessions("t0ken", now_s=Clock())
    assert sessions.needs_login and sessions.token_ok("t0ken")
    assert not sessions.token_ok("t0ke") and not sessions.token_ok("")
    s = sessions.open(authenticated=True)
    assert Sessions.csrf_ok(s, s.csrf) and not Sessions.csrf_ok(s, "") and \
        not Sessions.csrf_ok(s, s.csrf[:-1])
    assert s.sid not in Sessions.cookie(s).split("; ", 1)[1]
    assert not Sessions("", now_s=Clock()).needs_login


def test_sessions_are_capped_oldest_first(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(session_module, "MAX_SESSIONS", 3)
    sessions = Sessions("", now_s=Clock())
    opened = [sessions.open(authenticated=True) for _ in range(5)]
    assert [sessions.get(s.sid) is not None for s in opened] == [False, False, True, True,
                                                                True]


def test_rates_per_second_between_samples() -> None:
    clock = Clock()
    sampler = RateSampler(lambda: {}, clock, keep=3)
    for sent, acked in ((0, 0), (500, 100), (1500, 100), (1500, 400)):
        sampler.sample({"rpc.sent": sent, "rocketmq.sent": sent / 5, "pop.acked": acked})
        clock.now += 5
    s = sampler.series()  # the ring keeps 3 samples: 2 intervals
    assert s["t"] == [1010.0, 1015.0]
    assert s["sent"] == [240.0, 0.0]  # (1800 - 600) / 5, then nothing
    assert s["acked"] == [0.0, 60.0]
    sampler.sample({"rpc.sent": 0})  # a restart resets the counters: 0, never negative
    assert sampler.series()["sent"][-1] == 0.0
