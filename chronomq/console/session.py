"""Console sessions: who is looking, and proof that an action came from the console's page.

* **Login.**  When the broker requires credentials (``server.auth_token`` set or a user
  exists: ``Authenticator.required``), the console asks for a token once on a form: a
  user's token logs that user in, ``server.auth_token`` the admin.  A session's random id
  travels in a cookie that is ``HttpOnly`` (page scripts cannot read it) and
  ``SameSite=Strict`` (other sites' pages do not send it); the token itself is never
  stored, in the cookie or here.  While no credentials are required every visitor gets
  an anonymous session at once (allowed everything, as the API is then).
* **Who, at every request** (``principal``).  A session keeps the name it logged in as
  (and a user's token digest) and is resolved again at each request: a user removed, or
  removed and added again with a new token, ends its sessions at once; a permission
  granted or revoked is in force at the next request; an anonymous session ends as soon
  as credentials are required.
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

from access.principals import ADMIN, ANONYMOUS, Authenticator, Principal

COOKIE = "chronomq_console"
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    sid: str
    csrf: str
    who: str  # the principal's name at login
    token_sha256: bytes  # a user's token digest at login (b"": the admin, anonymous)
    seen_s: float


class Sessions:
    def __init__(self, authenticator: Authenticator, ttl_s: float = 12 * 3600,
                 now_s: Callable[[], float] = time.monotonic) -> None:
        self._auth = authenticator
        self.ttl_s = ttl_s
        self._now_s = now_s
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def needs_login(self) -> bool:
        return self._auth.required

    def login(self, token: str) -> Session | None:
        """A session for whoever ``token`` names (anyone while no credentials are
        required); None: it names nobody."""
        principal = self._auth.principal(token)
        if principal is None:
            return None
        return self._open(principal)

    def open_anonymous(self) -> Session | None:
        """A session at once, while no credentials are required (else None)."""
        return None if self.needs_login else self._open(ANONYMOUS)

    def _open(self, principal: Principal) -> Session:
        digest = principal.user.token_sha256 if principal.user is not None else b""
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), principal.name,
                    digest, self._now_s())
        with self._lock:
            self._sessions[s.sid] = s
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return s

    def principal(self, session: Session) -> Principal | None:
        """Who ``session`` is now (see the module doc); None: it has ended (closed)."""
        if session.who == ANONYMOUS.name:
            found = None if self.needs_login else ANONYMOUS
        elif session.who == ADMIN.name:
            found = ADMIN
        else:
            user = self._auth.directory.user(session.who)
            found = None if user is None or not hmac.compare_digest(
                user.token_sha256, session.token_sha256) else Principal(user.name, user)
        if found is None:
            self.close(session.sid)
        return found

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
