"""Errors of the tier.  Foreign errors (OSError, botocore) are wrapped here."""

from __future__ import annotations

from store.errors import ChronomqError, InvalidArgument, NotFound, Unavailable


class TierError(ChronomqError):
    """Raised when the tier (local directory, S3) fails a request."""


class TierNotFound(TierError, NotFound):
    """Raised when a path does not exist in the tier."""


class TierUnavailable(TierError, Unavailable):
    """Raised when the tier cannot be reached or refuses service; retry later."""


class TierOutcomeUnknown(TierUnavailable):
    """Raised when a conditional write (``Provider.swap``, ``Provider.create``) got no
    answer that can be trusted: an attempt may have reached the tier and been applied
    (its response was lost, and the retry was refused because the object had changed,
    by that very write perhaps).  Read the object back and compare it with what was
    written; retrying the write blindly is not safe."""


class TierBadPath(TierError, InvalidArgument):
    """Raised for a path that is empty, absolute or climbs out of the tier's root."""


def check_path(path: str) -> str:
    """Tier paths are relative, ``/``-separated and never climb (``..``)."""
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
        raise TierBadPath(f"bad tier path {path!r}")
    return path
