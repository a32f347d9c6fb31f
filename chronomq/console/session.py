"""Console sessions: who may look, and proof that an action came from the console's page.

* **Login.**  When the broker has an API token (``server.auth_token``), the console asks
  for it once on a form; a right token opens a session whose random id travels in a
  cookie that is ``HttpOnly`` (page scripts cannot read it) and ``SameSite=Strict`` (other
  sites' pages do not send it).  Without a token every visitor gets a session at once.
  Tokens are compared in constant time; the token itself is never stored in the cookie.
* **CSRF.**  Each session has its own random CSRF token, written into the page and sent
  back with every action (a form field or the ``X-CSRF-Token`` header); an action without
  the session's token is refused.  Together with SameSite=Strict, a page on another
  origin cannot act in an operator's name.

Sessions live in memory (a restart logs everyone out), expire after ``ttl_s`` idle, and
are capped in number (the oldest go first): a client cannot grow them without bound.
Thread-safe.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "chronomq_console"
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    sid: str
    csrf: str
    authenticated: bool
    seen_s: float


class Sessions:
    def __init__(self, token: str, ttl_s: float = 12 * 3600,
                 now_s: Callable[[], float] = time.monotonic) -> None:
        self._token = token.encode()
        self.ttl_s = ttl_s
        self._now_s = now_s
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def needs_login(self) -> bool:
        return bool(self._token)

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def open(self, authenticated: bool) -> Session:
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), authenticated,
                    self._now_s())
        with self._lock:
            self._sessions[s.sid] = s
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return s

    def get(self, sid: str | None) -> Session | None:
        """The live session with this id (its idle clock restarted), else None."""
        if not sid or len(sid) > 100:
            return None
        now = self._now_s()
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return None
            if now - s.seen_s > self.ttl_s:
                del self._sessions[sid]
                return None
            s.seen_s = now
            self._sessions.move_to_end(sid)
            return s

    def close(self, sid: str) -> None:
        with self._lock:
            self._sessions.pop(sid, None)

    @staticmethod
    def csrf_ok(session: Session, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), session.csrf.encode())

    @staticmethod
    def cookie(session: Session, secure: bool = False) -> str:
        extra = "; Secure" if secure else ""
        return f"{COOKIE}={session.sid}; Path=/; HttpOnly; SameSite=Strict{extra}"

    @staticmethod
    def expired_cookie() -> str:
        return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
