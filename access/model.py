"""Users, their permissions, and the one decision (``decide``).

A **user** is a name, the SHA-256 of its secret token (the token is shown once, when the
user is added, and never stored: ``new_token``, ``token_sha256``), the secret key its
RocketMQ 5 clients sign with (``rocketmq_secret``, derived from the token: below) and its
permissions.

A **permission** is ``(effect, action, pattern)``:

- ``effect``: ``allow`` or ``deny``;
- ``action``: ``send`` (Send, and what changes pending messages and schedules),
  ``consume`` (Pop, Subscribe, settling leases, reading messages) or ``admin`` (creating
  and deleting topics; on ``*``: the broker itself, its users, mounts and takeovers).
  The three are independent: ``admin`` does not include ``send`` or ``consume``;
- ``pattern``: a topic name matched exactly (``orders``), a prefix ending in ``*``
  (``orders-*`` matches ``orders-eu`` and ``orders-``), or ``*`` alone (every topic).

A user holds at most one permission per ``(action, pattern)``: a grant of the other
effect replaces it, a revoke removes it.

**The decision** (``decide``): a deny that matches wins; else an allow that matches
allows; else nothing is allowed (no grant, no access).

**A topic's resource** (``resource_of``): the topics the broker makes for a consumer
group are that group's views of the topic they belong to: its retry topic
``%RETRY%<group>%<topic>`` and its dead-letter topic ``%DLQ%<group>%<topic>``
(``pop.model`` names them; group names hold no ``%``) count as ``<topic>``, through any
depth (the retry topic of a group that pops a dead-letter topic).  So a consumer group's
rights follow its topic: ``consume`` on ``orders`` lets a user pop ``orders`` with any
group and read and settle that group's retries and dead letters; groups are not
resources of their own.  A name that is neither a topic name nor such a view is matched
as given, so only ``*`` matches it (and the broker refuses it as a name anyway).

**RocketMQ secret.**  RocketMQ clients sign a date with HMAC-SHA1 under their secret key
(``chronomq.rocketmq.auth``), so the broker must hold that key itself, not a hash of it.
``rocketmq_secret(token)`` derives it from the token (HMAC-SHA256 of a fixed label under
the token, 40 hex characters): the key is stored with the user, whoever holds the token
can compute it, and the stored key does not give the token back.  The user's name is its
access key.

Everything here is immutable and pure: thread-safe.  Limits are checked before anything
is built from a value (``check_user_name``, ``parse_pattern``, ``token_sha256``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from access.errors import AccessDenied
from store.errors import InvalidArgument
from store.names import DLQ_PREFIX, RETRY_PREFIX, is_name

MAX_USER_NAME = 64
MAX_PATTERN = 128
MAX_TOKEN = 512  # longer credentials are refused before they are hashed
MAX_USERS = 10_000
MAX_PERMISSIONS = 256  # per user
TOKEN_BYTES = 32
ALL = "*"
_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PATTERN = re.compile(r"\*|[A-Za-z0-9_-]{1,127}\*?")
_ROCKETMQ_LABEL = b"chronomq rocketmq secret key v1"


class Action(StrEnum):
    SEND = "send"
    CONSUME = "consume"
    ADMIN = "admin"


class Effect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Permission:
    effect: Effect
    action: Action
    pattern: str

    def matches(self, action: Action, resource: str) -> bool:
        return self.action is action and pattern_matches(self.pattern, resource)

    def __str__(self) -> str:
        return f"{self.effect} {self.action} {self.pattern}"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    token_sha256: bytes  # 32 bytes
    rocketmq_secret: str  # 40 hex characters (``rocketmq_secret``)
    created_ms: int
    permissions: tuple[Permission, ...] = ()

    def granted(self, permission: Permission) -> User:
        """This user with ``permission`` (replacing one of the same action and pattern)."""
        kept = tuple(p for p in self.permissions
                     if (p.action, p.pattern) != (permission.action, permission.pattern))
        if len(kept) >= MAX_PERMISSIONS:
            raise InvalidArgument(f"user {self.name!r} has {MAX_PERMISSIONS} permissions, "
                                  "the most one user may hold: revoke some first")
        return replace(self, permissions=(*kept, permission))

    def revoked(self, action: Action, pattern: str) -> User | None:
        """This user without its permission on ``(action, pattern)``; None if it has none."""
        kept = tuple(p for p in self.permissions if (p.action, p.pattern) != (action, pattern))
        return None if len(kept) == len(self.permissions) else replace(self, permissions=kept)


# ---------------------------------------------------------------- the decision

def pattern_matches(pattern: str, resource: str) -> bool:
    if pattern == ALL:
        return True
    if pattern.endswith("*"):
        return resource.startswith(pattern[:-1])
    return resource == pattern


def resource_of(topic: str) -> str:
    """The topic whose rights govern ``topic``: a retry or dead-letter topic's own
    topic (see the module docstring), else ``topic`` itself."""
    inner = topic
    while inner.startswith((RETRY_PREFIX, DLQ_PREFIX)):
        rest = inner[len(RETRY_PREFIX if inner.startswith(RETRY_PREFIX) else DLQ_PREFIX):]
        group, sep, inner = rest.partition("%")
        if not sep or not is_name(group):
            return topic  # not a view the broker makes: matched as given
    return inner


def decide(user: User, action: Action, topic: str) -> bool:
    """May ``user`` do ``action`` on ``topic`` (``ALL``: on every topic at once)?  Deny
    wins; nothing is allowed unless granted."""
    resource = resource_of(topic)
    allowed = False
    for p in user.permissions:
        if p.action is action and (pattern_matches(p.pattern, resource) if resource != ALL
                                   else p.pattern == ALL or p.effect is Effect.DENY):
            if p.effect is Effect.DENY:
                return False
            allowed = True
    return allowed


def unrestricted(user: User, action: Action) -> bool:
    """``user`` may do ``action`` on every topic: allowed on ``*``, denied nowhere (what
    lets a front skip the per-topic checks)."""
    return decide(user, action, ALL)


def denial(user: str, action: Action, topic: str) -> AccessDenied:
    """The error of ``user`` refused ``action`` on ``topic``, its message naming both:
    ``user 'billing' may not send to topic 'orders'``."""
    if topic == ALL:
        what = {Action.SEND: "send to every topic (give the topic)",
                Action.CONSUME: "consume from every topic (give the topic)",
                Action.ADMIN: "administer the broker (admin on *)"}[action]
        return AccessDenied(user, action, ALL, f"user {user!r} may not {what}")
    shown = topic[:140]
    verb = {Action.SEND: "send to", Action.CONSUME: "consume from",
            Action.ADMIN: "administer"}[action]
    return AccessDenied(user, action, f"topic:{shown}",
                        f"user {user!r} may not {verb} topic {shown!r}")


def check(user: User, needs: Iterable[tuple[Action, str]]) -> None:
    """Raise the ``denial`` of the first of ``needs`` that ``user`` may not do."""
    for action, topic in needs:
        if not decide(user, action, topic):
            raise denial(user.name, action, topic)


# ---------------------------------------------------------------- validation

def check_user_name(name: str) -> str:
    if len(name) > MAX_USER_NAME or _USER_NAME.fullmatch(name) is None:
        raise InvalidArgument(f"user name {name[:80]!r} is invalid: use 1-{MAX_USER_NAME} "
                              "characters from A-Z a-z 0-9 _ -")
    return name


def parse_action(text: str) -> Action:
    if text not in Action.__members__.values():
        raise InvalidArgument(f"action {text[:40]!r} is not one of send, consume, admin")
    return Action(text)


def parse_pattern(text: str) -> str:
    if len(text) > MAX_PATTERN or _PATTERN.fullmatch(text) is None:
        raise InvalidArgument(
            f"topic pattern {text[:140]!r} is invalid: a topic name (1-127 characters from "
            "A-Z a-z 0-9 _ -), a prefix of one ending in * (orders-*), or * (every topic)")
    return text


def permission(effect: str, action: str, pattern: str) -> Permission:
    """A permission from its three words, each checked."""
    if effect not in Effect.__members__.values():
        raise InvalidArgument(f"effect {effect[:40]!r} is not allow or deny")
    return Permission(Effect(effect), parse_action(action), parse_pattern(pattern))


# ---------------------------------------------------------------- secrets

def new_token() -> str:
    """A new secret token: 32 random bytes, base64url (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_sha256(token: str) -> bytes | None:
    """What a token is stored and looked up as; None for one longer than ``MAX_TOKEN``
    (refused unhashed)."""
    if len(token) > MAX_TOKEN:
        return None
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def rocketmq_secret(token: str) -> str:
    """The secret key a user's RocketMQ clients sign with, derived from its token."""
    return hmac.new(token.encode(), _ROCKETMQ_LABEL, hashlib.sha256).hexdigest()[:40]


def new_user(name: str, now_ms: int) -> tuple[User, str]:
    """A user called ``name`` with no permission, and its token (shown once)."""
    token = new_token()
    digest = token_sha256(token)
    assert digest is not None
    return User(check_user_name(name), digest, rocketmq_secret(token), now_ms), token
