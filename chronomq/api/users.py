"""The user RPCs of ``chronomq.v1.Broker`` (``AddUser``, ``GrantPermission``,
``RevokePermission``, ``ListUsers``, ``RemoveUser``, ``WhoAmI``) over the broker's users
(``access.directory``).

Who may call them is decided where every RPC's rights are, before they run
(``chronomq.api.permissions``: admin on ``*``; WhoAmI anyone known); here each change is
made, answered and written to the audit log (``chronomq.audit``: who changed which user).
Composed into the gRPC service beside ``BrokerServicer`` (``chronomq.api.handlers``).
Thread-safe: the directory serialises the changes.
"""

from __future__ import annotations

import logging

import grpc

from access.model import User, parse_action, parse_pattern, permission, rocketmq_secret
from access.principals import Authenticator, Principal
from chronomq.api.handlers import bearer_token
from chronomq.v1 import broker_pb2 as pb
from store.errors import FailedPrecondition

audit = logging.getLogger("chronomq.audit")


def user_pb(u: User) -> pb.User:
    return pb.User(name=u.name, created_ms=u.created_ms, permissions=[
        pb.Permission(effect=str(p.effect), action=str(p.action), pattern=p.pattern)
        for p in u.permissions])


class UserServicer:
    """The user RPCs, by their names in the service (``add_service`` finds them here)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator
        self._users = authenticator.directory

    def _caller(self, context: grpc.ServicerContext) -> Principal | None:
        return self._auth.principal(bearer_token(context.invocation_metadata() or ()))

    def _log(self, context: grpc.ServicerContext, what: str) -> None:
        caller = self._caller(context)
        audit.info("%s by=%r peer=%s", what, caller.name if caller else "?", context.peer())

    def AddUser(self, request: pb.AddUserRequest,
                context: grpc.ServicerContext) -> pb.AddUserResponse:
        if not self._auth.required:
            raise FailedPrecondition(
                "this broker needs no credentials (no server.auth_token, no user): set "
                "server.auth_token and add users with it, or nobody could manage them "
                "once the first user makes credentials required")
        user, token = self._users.add(request.name)
        self._log(context, f"user added user={user.name!r}")
        return pb.AddUserResponse(user=user_pb(user), token=token,
                                  rocketmq_access_key=user.name,
                                  rocketmq_secret_key=rocketmq_secret(token))

    def GrantPermission(self, request: pb.GrantPermissionRequest,
                        context: grpc.ServicerContext) -> pb.UserResponse:
        p = request.permission
        grant = permission(p.effect or "allow", p.action, p.pattern)
        user = self._users.grant(request.user, grant)
        self._log(context, f"permission granted user={user.name!r} permission={grant}")
        return pb.UserResponse(user=user_pb(user))

    def RevokePermission(self, request: pb.RevokePermissionRequest,
                         context: grpc.ServicerContext) -> pb.UserResponse:
        action, pattern = parse_action(request.action), parse_pattern(request.pattern)
        user = self._users.revoke(request.user, action, pattern)
        self._log(context, f"permission revoked user={user.name!r} action={action} "
                           f"pattern={pattern}")
        return pb.UserResponse(user=user_pb(user))

    def ListUsers(self, request: pb.ListUsersRequest,
                  context: grpc.ServicerContext) -> pb.ListUsersResponse:
        return pb.ListUsersResponse(users=[user_pb(u) for u in self._users.users()])

    def RemoveUser(self, request: pb.RemoveUserRequest,
                   context: grpc.ServicerContext) -> pb.RemoveUserResponse:
        self._users.remove(request.name)
        self._log(context, f"user removed user={request.name!r}")
        return pb.RemoveUserResponse(removed=True)

    def WhoAmI(self, request: pb.WhoAmIRequest,
               context: grpc.ServicerContext) -> pb.WhoAmIResponse:
        caller = self._caller(context)
        if caller is None:  # (the handler refused it before: removed meanwhile)
            raise FailedPrecondition("the credentials name no user any more")
        if caller.user is None:
            return pb.WhoAmIResponse(user=pb.User(name=caller.name), all_topics=True)
        return pb.WhoAmIResponse(user=user_pb(caller.user))
