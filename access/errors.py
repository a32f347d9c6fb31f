"""Errors of users and permissions, under the project's one tree (``store.errors``)."""

from __future__ import annotations

from store.errors import ChronomqError, FailedPrecondition, Unavailable
from tiered.errors import TierUnavailable


class AccessError(ChronomqError):
    """Raised for any error of users and permissions (the base of this package)."""


class AccessDenied(AccessError):
    """Raised when a known user may not do what a call asks: its ``action`` on its
    ``resource`` (the gRPC front answers PERMISSION_DENIED with the message)."""

    def __init__(self, user: str, action: str, resource: str, message: str) -> None:
        super().__init__(message)
        self.user = user
        self.action = action
        self.resource = resource


class Unauthenticated(AccessError):
    """Raised when a call's credentials name nobody (none, a wrong one, a removed
    user's) on a broker that requires them (the gRPC front answers UNAUTHENTICATED, the
    RocketMQ front UNAUTHORIZED)."""


class UsersUnavailable(AccessError, Unavailable):
    """Raised when the users cannot be read or written where they live (the bucket or
    the data directory); the last users known stay in force."""


class TierUsersUnavailable(UsersUnavailable, TierUnavailable):
    """Raised when the tier fails a read or write of the users' object (a tier error
    too: a start's requests of the tier are retried on it)."""


class DamagedUsers(AccessError, FailedPrecondition):
    """Raised when the users' document does not decode (a damaged or foreign object);
    the last users known stay in force."""
