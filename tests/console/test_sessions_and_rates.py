"""Console sessions (expiry, the cap, tokens, who a session is at each request) and the
overview's rates, with injected clocks."""

from __future__ import annotations

from pathlib import Path

from access.backends import FileBackend
from access.directory import UserDirectory
from access.principals import ADMIN, ANONYMOUS, Authenticator
from chronomq.console import session as session_module
from chronomq.console.rates import RateSampler
from chronomq.console.session import Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authenticator(root: Path, admin_token: str = "") -> Authenticator:
    """A broker's users (in ``root``, none yet) and its ``server.auth_token``."""
    return Authenticator(UserDirectory(FileBackend(str(root)), lambda: 0), admin_token)


def test_a_session_expires_after_its_idle_time_and_each_visit_renews_it(
        tmp_path: Path) -> None:
    clock = Clock()
    sessions = Sessions(authenticator(tmp_path, "t0ken"), ttl_s=60, now_s=clock)
    s = sessions.login("t0ken")
    assert s is not None
    clock.now += 59
    assert sessions.get(s.sid) is s  # renewed at 1059
    clock.now += 59
    assert sessions.get(s.sid) is s
    clock.now += 61
    assert sessions.get(s.sid) is None
    assert sessions.get(None) is None and sessions.get("x" * 101) is None


def test_tokens_and_csrf_are_checked_exactly(tmp_path: Path) -> None:
    sessions = Sessions(authenticator(tmp_path, "t0ken"), now_s=Clock())
    assert sessions.needs_login and sessions.open_anonymous() is None
    assert sessions.login("t0ke") is None and sessions.login("") is None
    s = sessions.login("t0ken")
    assert s is not None and sessions.principal(s) is ADMIN
    assert Sessions.csrf_ok(s, s.csrf) and not Sessions.csrf_ok(s, "") and \
        not Sessions.csrf_ok(s, s.csrf[:-1])
    assert s.sid not in Sessions.cookie(s).split("; ", 1)[1]
    assert not Sessions(authenticator(tmp_path / "open"), now_s=Clock()).needs_login


def test_a_session_is_who_it_logged_in_as_until_that_user_goes(tmp_path: Path) -> None:
    """No auth_token: open (anonymous sessions) until a user exists; a user's session
    follows its permissions, and ends when it is removed, or removed and added again."""
    auth = authenticator(tmp_path)
    sessions = Sessions(auth, now_s=Clock())
    anonymous = sessions.open_anonymous()
    assert anonymous is not None and sessions.principal(anonymous) is ANONYMOUS
    user, token = auth.directory.add("shop")
    assert sessions.principal(anonymous) is None  # credentials required now: it ended
    assert sessions.get(anonymous.sid) is None and sessions.open_anonymous() is None
    s = sessions.login(token)
    assert s is not None and s.who == "shop" and token not in repr(s)
    who = sessions.principal(s)
    assert who is not None and who.user == user
    auth.directory.remove("shop")
    _, token = auth.directory.add("shop")  # the same name, a new token
    assert sessions.principal(s) is None and sessions.get(s.sid) is None
    again = sessions.login(token)
    assert again is not None and sessions.principal(again) is not None
    auth.directory.remove("shop")
    assert sessions.principal(again) is None


def test_sessions_are_capped_oldest_first(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(session_module, "MAX_SESSIONS", 3)
    sessions = Sessions(authenticator(tmp_path), now_s=Clock())
    opened = [sessions.open_anonymous() for _ in range(5)]
    assert [s is not None and sessions.get(s.sid) is not None for s in opened] == [
        False, False, True, True, True]


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
