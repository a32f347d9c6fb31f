"""The users a broker knows: read from their ``Backend``, kept fresh, and changed only by
conditional writes.

- **Reading.**  ``load`` reads the document once at start (a failure there fails the
  start: the broker does not serve with users it could not read).  ``refresh``, called
  every ``REFRESH_S`` by the server, reads it again and installs it when its version
  changed, so a change made at another broker of the fleet is in force here within about
  a second.  A refresh that fails (the bucket cannot be read, the document is damaged)
  keeps the users known before and logs once until it works again: access is never
  opened by a failure.
- **Changing.**  ``add``, ``grant``, ``revoke`` and ``remove`` read the document and its
  version, apply the change to what they read (never to the copy in memory), and write
  it back only if it is still at that version (If-Match); a writer that lost the race
  reads again and re-applies, up to ``MAX_ATTEMPTS`` times.  Once written, the new users
  are installed here at once: the change is in force on this broker when the call
  answers.
- **Authenticating.**  ``by_token`` finds a user by the SHA-256 of a token (a lookup by
  the hash of a guess tells nothing of a real token) and compares the digests in
  constant time.

Thread-safe: one lock orders the refreshes and the changes (so a refresh that read
before a change never installs its older users after it); the users are replaced whole
(``_Known``) and read without the lock.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from access.backends import Backend
from access.codec import decode, encode
from access.errors import AccessError
from access.model import (
    MAX_USERS,
    Action,
    Permission,
    User,
    check_user_name,
    new_user,
    token_sha256,
)
from store.errors import AlreadyExists, NotFound, Unavailable

log = logging.getLogger(__name__)

REFRESH_S = 1.0
MAX_ATTEMPTS = 20


@dataclass(frozen=True, slots=True)
class _Known:
    users: dict[str, User]
    by_digest: dict[bytes, User]
    version: str


def _known(users: dict[str, User], version: str) -> _Known:
    return _Known(users, {u.token_sha256: u for u in users.values()}, version)


@dataclass(frozen=True, slots=True)
class DirectoryStats:
    users: int
    refreshes: int  # reads that found a new version
    refresh_failures: int  # reads that failed (the last users known stayed)


class UserDirectory:
    """The users of one broker (or of the fleet sharing its bucket)."""

    def __init__(self, backend: Backend, now_ms: Callable[[], int]) -> None:
        self._backend = backend
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._known = _known({}, "")
        self._failing = ""  # the error of the refreshes failing now (logged once)
        self._refreshes = 0
        self._failures = 0

    @property
    def where(self) -> str:
        return self._backend.where

    # ---------------------------------------------------------------- reading

    def load(self) -> None:
        """Read the users now (at start); raises what stops the read."""
        with self._lock:
            data, version = self._backend.read()
            self._known = _known(decode(data) if data is not None else {}, version)

    def refresh(self) -> None:
        """Read the users again; install them if they changed.  A failure keeps the users
        known (logged once until a refresh works again)."""
        with self._lock:
            try:
                data, version = self._backend.read()
                if version != self._known.version:
                    self._known = _known(decode(data) if data is not None else {}, version)
                    self._refreshes += 1
            except AccessError as exc:
                self._failures += 1
                if str(exc) != self._failing:
                    log.warning("the users could not be read again (%s); the %d users known "
                                "before stay in force", exc, len(self._known.users))
                self._failing = str(exc)
                return
            if self._failing:
                log.info("the users are read again (%s)", self._backend.where)
                self._failing = ""

    def users(self) -> list[User]:
        """Every user known, by name."""
        known = self._known
        return [known.users[n] for n in sorted(known.users)]

    def user(self, name: str) -> User | None:
        return self._known.users.get(name)

    def __bool__(self) -> bool:
        """Whether any user is known (then credentials are required)."""
        return bool(self._known.users)

    def by_token(self, token: str) -> User | None:
        """The user whose token this is, or None."""
        digest = token_sha256(token)
        if digest is None:
            return None
        user = self._known.by_digest.get(digest)
        if user is None or not hmac.compare_digest(user.token_sha256, digest):
            return None
        return user

    def statistics(self) -> DirectoryStats:
        return DirectoryStats(len(self._known.users), self._refreshes, self._failures)

    # ---------------------------------------------------------------- changing

    def add(self, name: str) -> tuple[User, str]:
        """A new user without permissions, and its token (never stored: shown once)."""
        check_user_name(name)
        made: list[tuple[User, str]] = []

        def apply(users: dict[str, User]) -> dict[str, User]:
            if name in users:
                raise AlreadyExists(f"user {name!r} exists (remove it first to give it a "
                                    "new token)")
            if len(users) >= MAX_USERS:
                raise AlreadyExists(f"there are {MAX_USERS} users, the most there may be")
            made[:] = [new_user(name, self._now_ms())]
            return {**users, name: made[0][0]}
        self._change(apply)
        return made[0]

    def grant(self, name: str, permission: Permission) -> User:
        """Give ``name`` ``permission`` (replacing its permission of the same action and
        pattern, of either effect)."""
        return self._change_user(name, lambda u: u.granted(permission))

    def revoke(self, name: str, action: Action, pattern: str) -> User:
        """Take ``name``'s permission on ``(action, pattern)`` away (allow or deny)."""
        def apply(u: User) -> User:
            changed = u.revoked(action, pattern)
            if changed is None:
                raise NotFound(f"user {name!r} has no permission to {action} on "
                               f"{pattern!r}")
            return changed
        return self._change_user(name, apply)

    def remove(self, name: str) -> None:
        check_user_name(name)

        def apply(users: dict[str, User]) -> dict[str, User]:
            if name not in users:
                raise NotFound(f"user {name!r} does not exist")
            return {n: u for n, u in users.items() if n != name}
        self._change(apply)

    def _change_user(self, name: str, change: Callable[[User], User]) -> User:
        check_user_name(name)

        def apply(users: dict[str, User]) -> dict[str, User]:
            if name not in users:
                raise NotFound(f"user {name!r} does not exist")
            return {**users, name: change(users[name])}
        return self._change(apply)[name]

    def _change(self, apply: Callable[[dict[str, User]], dict[str, User]]
                ) -> dict[str, User]:
        """Read, apply, write if unchanged meanwhile; again on a lost race."""
        with self._lock:
            for _ in range(MAX_ATTEMPTS):
                data, version = self._backend.read()
                users = apply(decode(data) if data is not None else {})
                written = self._backend.write(encode(users.values()), version)
                if written is not None:
                    self._known = _known(users, written)
                    return users
            raise Unavailable(f"the users ({self._backend.where}) kept changing under "
                              f"{MAX_ATTEMPTS} attempts to change them: try again")
