"""Where the users' document lives: a file in the data directory, or one object in the
bucket a fleet of brokers shares.

Both are a ``Backend``: ``read`` gives the document's bytes (None when there is none yet)
and its version; ``write`` replaces it only if it is still at the version read (``""``:
only if there is none), atomically, and gives the new version, or None when another
writer changed it meanwhile (the caller reads again and re-applies its change).

=====================  ==========================================  ======================
backend                where                                       version
=====================  ==========================================  ======================
``FileBackend``        ``<store.data_dir>/users.json`` (written    SHA-256 of the bytes
                       to a temporary file, fsynced, renamed over
                       it, the directory fsynced)
``TierBackend``        ``access/users.json`` in the tier, beside   the tier's (S3: the
                       every broker's prefix, not under one: every  ETag); writes are
                       broker of the fleet, and a successor after   ``Provider.swap``
                       a takeover, reads the same users             (If-Match /
                                                                    If-None-Match)
=====================  ==========================================  ======================

Foreign errors are wrapped here: ``UsersUnavailable`` (the tier or the disk failed).
Thread-safe: ``FileBackend`` serialises its compare-and-write with a lock (one broker
owns a data directory); the tier's conditional writes serialise brokers.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Protocol

from access.codec import MAX_DOCUMENT_BYTES
from access.errors import TierUsersUnavailable, UsersUnavailable
from tiered.errors import TierError, TierNotFound, TierOutcomeUnknown
from tiered.provider import Provider

USERS_OBJECT = "access/users.json"
USERS_FILE = "users.json"


class Backend(Protocol):
    where: str  # for messages: the file's path or the tier object's

    def read(self) -> tuple[bytes | None, str]:
        """The document and its version; ``(None, "")`` when there is none."""
        ...

    def write(self, data: bytes, version: str) -> str | None:
        """Replace the document if still at ``version``; the new version, or None."""
        ...


class FileBackend:
    """The document as a file of one broker's data directory."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, USERS_FILE)
        self.where = self.path
        self._lock = threading.Lock()

    def read(self) -> tuple[bytes | None, str]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_DOCUMENT_BYTES + 1)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            raise UsersUnavailable(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        return data, hashlib.sha256(data).hexdigest()

    def write(self, data: bytes, version: str) -> str | None:
        with self._lock:
            if self.read()[1] != version:
                return None
            tmp = self.path + ".tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                dir_fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
            except OSError as exc:
                raise UsersUnavailable(f"cannot write {self.path}: "
                                       f"{exc.strerror or exc}") from exc
            return hashlib.sha256(data).hexdigest()


class TierBackend:
    """The document as one object of the shared tier."""

    def __init__(self, tier: Provider, path: str = USERS_OBJECT) -> None:
        self._tier = tier
        self._path = path
        self.where = f"{tier.name}:{path}"

    def read(self) -> tuple[bytes | None, str]:
        try:
            return self._tier.read_versioned(self._path)
        except TierNotFound:
            return None, ""
        except TierError as exc:
            raise TierUsersUnavailable(f"cannot read the users ({self.where}): {exc}") from exc

    def write(self, data: bytes, version: str) -> str | None:
        try:
            return self._tier.swap(self._path, data, version)
        except TierOutcomeUnknown:  # applied unseen, perhaps: what is there now?
            now, now_version = self.read()
            return now_version if now == data else None
        except TierError as exc:
            raise TierUsersUnavailable(f"cannot write the users ({self.where}): {exc}") from exc
