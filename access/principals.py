"""Who a call's credentials name (a ``Principal``), and when credentials are required.

**When authentication is required** (``Authenticator.required``): as soon as
``server.auth_token`` is set or one user exists (in the data directory's or the
bucket's users).  Until then a broker is open, as before users existed: every call is
the ``ANONYMOUS`` principal, which may do everything.  Removing the last user (without an
``auth_token``) opens it again.

**The principals**:

- ``server.auth_token`` names the ``ADMIN_TOKEN`` principal: every action on every topic
  (what the single token could always do), whatever the users say;
- a user's token names that user, with its permissions (``access.model.decide``);
- anything else (no token, a wrong one, one of a user removed meanwhile) names nobody:
  ``principal`` returns None, and the front answers UNAUTHENTICATED.

A front asks ``principal`` once per call (a stream: once, at its start) and then
``Principal.may`` / ``Principal.check`` per resource.  ``unrestricted`` lets it skip
the per-topic work for a principal allowed an action everywhere (the admin token, an
open broker, a user allowed on ``*`` and denied nowhere).  Thread-safe.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from access.directory import UserDirectory
from access.model import ALL, Action, User, decide, denial

# the names of principals that are not users: a user name never holds "." or spaces
ADMIN_TOKEN_NAME = "server.auth_token"
ANONYMOUS_NAME = "anonymous (no credentials required)"


@dataclass(frozen=True, slots=True)
class Principal:
    """The subject of a call: a user, or (``user`` None) one allowed everything."""

    name: str
    user: User | None = None

    def may(self, action: Action, topic: str) -> bool:
        return self.user is None or decide(self.user, action, topic)

    def unrestricted(self, action: Action) -> bool:
        """Allowed ``action`` on every topic (no per-topic check needed)."""
        return self.may(action, ALL)

    def check(self, needs: Iterable[tuple[Action, str]]) -> None:
        """Raise ``AccessDenied`` for the first ``(action, topic)`` it may not do."""
        if self.user is None:
            return
        for action, topic in needs:
            if not decide(self.user, action, topic):
                raise denial(self.name, action, topic)


ADMIN = Principal(ADMIN_TOKEN_NAME)
ANONYMOUS = Principal(ANONYMOUS_NAME)


class Authenticator:
    """Credentials -> principal for one broker: its ``server.auth_token`` and its users."""

    def __init__(self, directory: UserDirectory, admin_token: str = "") -> None:
        self.directory = directory
        self._admin = admin_token.encode()

    @property
    def required(self) -> bool:
        return bool(self._admin) or bool(self.directory)

    def principal(self, token: str | None) -> Principal | None:
        """Who ``token`` (a bearer token, None: no credentials) names; None: nobody (the
        call is refused as unauthenticated)."""
        if not self.required:
            return ANONYMOUS
        if token is None:
            return None
        if self._admin and hmac.compare_digest(token.encode("utf-8", "surrogatepass"),
                                               self._admin):
            return ADMIN
        user = self.directory.by_token(token)
        return None if user is None else Principal(user.name, user)

    def rocketmq_user(self, access_key: str) -> tuple[Principal, str] | None:
        """The principal a RocketMQ access key names (a user's name) and the secret key
        its clients' signatures are made with (``access.model.rocketmq_secret``); None:
        no such user.  (The front's own ``rocketmq.access_key`` is its admin, as the
        ``auth_token`` is the API's.)"""
        user = self.directory.user(access_key)
        return None if user is None else (Principal(user.name, user), user.rocketmq_secret)
