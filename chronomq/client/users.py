"""User management through a ``ChronomqClient``: ``client.users.add("billing")`` and the
rest, one method per user RPC of ``chronomq.v1.Broker``.

    with ChronomqClient("127.0.0.1:7600", token=ADMIN_TOKEN) as c:
        new = c.users.add("billing")          # new.token: shown once, keep it
        c.users.grant("billing", "consume", "billing-*")
        c.users.grant("billing", "consume", "billing-audit", deny=True)

Every call but ``whoami`` needs admin on ``*`` (the broker's ``server.auth_token`` has
it).  Permissions come back as ``(effect, action, pattern)`` triples.  A composed helper
(``ChronomqClient.users``), not a mixin; it imports nothing of the server side.
Thread-safe (the client is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chronomq.v1 import broker_pb2 as pb

if TYPE_CHECKING:
    from chronomq.client.client import ChronomqClient

Grant = tuple[str, str, str]  # (effect, action, pattern)


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    permissions: tuple[Grant, ...]
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class NewUser:
    """A user just added, with its secrets: shown this once, kept by nobody else."""

    user: UserInfo
    token: str  # for ``authorization: Bearer <token>`` (``ChronomqClient(token=...)``)
    rocketmq_access_key: str
    rocketmq_secret_key: str


def user_info(u: pb.User) -> UserInfo:
    return UserInfo(u.name, tuple((p.effect, p.action, p.pattern) for p in u.permissions),
                    u.created_ms)


class Users:
    """The user RPCs of one client."""

    def __init__(self, client: ChronomqClient) -> None:
        self._client = client

    def add(self, name: str) -> NewUser:
        """A new user without permissions (ALREADY_EXISTS if the name is taken)."""
        r = self._client.call("AddUser", pb.AddUserRequest(name=name))
        return NewUser(user_info(r.user), r.token, r.rocketmq_access_key,
                       r.rocketmq_secret_key)

    def grant(self, name: str, action: str, pattern: str, deny: bool = False) -> UserInfo:
        """Allow (``deny``: deny) ``action`` (send, consume, admin) on the topics
        ``pattern`` names (a name, a prefix ending in ``*``, or ``*``)."""
        permission = pb.Permission(effect="deny" if deny else "allow", action=action,
                                   pattern=pattern)
        r = self._client.call("GrantPermission",
                              pb.GrantPermissionRequest(user=name, permission=permission))
        return user_info(r.user)

    def revoke(self, name: str, action: str, pattern: str) -> UserInfo:
        """Remove the permission (allow or deny) on ``action`` and ``pattern``."""
        r = self._client.call("RevokePermission", pb.RevokePermissionRequest(
            user=name, action=action, pattern=pattern))
        return user_info(r.user)

    def all(self) -> list[UserInfo]:
        """Every user, by name, with its permissions."""
        r = self._client.call("ListUsers", pb.ListUsersRequest())
        return [user_info(u) for u in r.users]

    def remove(self, name: str) -> None:
        self._client.call("RemoveUser", pb.RemoveUserRequest(name=name))

    def whoami(self) -> tuple[UserInfo, bool]:
        """Who this client's token names, and whether it may do everything (the admin
        token, or a broker that needs no credentials)."""
        r = self._client.call("WhoAmI", pb.WhoAmIRequest())
        return user_info(r.user), r.all_topics
