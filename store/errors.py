"""The project's error tree.

``ChronomqError`` is the root of every error the project raises on purpose; each package
has its own base below it.  Only the gRPC layer turns these into status codes.
"""

from __future__ import annotations


class ChronomqError(Exception):
    """Raised for any error chronomq raises on purpose (the root of the tree)."""


class InvalidArgument(ChronomqError):
    """Raised when a caller passes a value that can never be accepted (bad input)."""


class NotFound(ChronomqError):
    """Raised when a named thing (topic, message, checkpoint) does not exist."""


class AlreadyExists(ChronomqError):
    """Raised when creating a thing that exists with different settings."""


class FailedPrecondition(ChronomqError):
    """Raised when a request is valid but the state it needs is gone (e.g. an expired lease)."""


class Unavailable(ChronomqError):
    """Raised when the service is stopping or a dependency cannot be reached; retry later."""


class ResourceExhausted(ChronomqError):
    """Raised when a send is refused for want of space (the data volume is above its
    watermark, or a write found it full); retry once space is freed."""


class StoreError(ChronomqError):
    """Raised for failures of the local store (I/O, corruption)."""


class StorageIOError(StoreError):
    """Raised when reading or writing a local file fails (wraps OSError)."""


class DamagedRecord(StorageIOError):
    """Raised when a record read from the CommitLog fails its magic/CRC check, cannot be
    decoded, or is not the size its location says; ``path`` is its segment file and
    ``offset`` its CommitLog offset.  Only that record is lost: skip it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"damaged record in {path} at commitlog offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class TopicNotFound(NotFound, InvalidArgument):
    """Raised when a message names a topic that does not exist and auto-creation is off."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist (create it first: chronomq topic create)")
        self.topic = topic
