"""A Provider over a local directory (the default tier).  Objects are files under
``root``; a write goes to a temporary file that is fsynced and renamed (or linked) into
place, and the directory that holds the name is fsynced before the write returns, as is
the parent of every directory made for it: a rename alone lives in the page cache until
the kernel writes the directory back, and a power loss before that would lose the name,
and the object with it, after the tier had answered.  (A plain delete is not synced: a
name that comes back after a power loss is one retention deletes again; a conditional
one, a released claim, is.)  Thread-safe."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from store.files import fsync_dir
from tiered.errors import TierError, TierNotFound, check_path


@contextmanager
def _wrapped(path: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError as exc:
        raise TierNotFound(f"{path} does not exist in the tier") from exc
    except OSError as exc:
        raise TierError(f"local tier failed on {path}: {exc}") from exc


def _durable_dir(path: str) -> None:
    """Make ``path`` and its missing parents, each new one fsynced in its parent."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    _durable_dir(parent)
    with suppress(FileExistsError):  # made meanwhile by another writer: synced here too,
        os.mkdir(path)  # so this write never returns before the name is on disk
    fsync_dir(parent)


def _durable_temp(full: str, data: bytes) -> str:
    """``data`` in a fsynced temporary file beside ``full`` (listing skips it)."""
    tmp = f"{full}.tmp.{os.getpid()}.{threading.get_ident()}"
    _durable_dir(os.path.dirname(full))
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _version(full: str) -> str:
    """The version of the object at ``full`` (its SHA-256; "" when there is none)."""
    try:
        with open(full, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return ""


class LocalProvider:
    name = "local"

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        _durable_dir(self.root)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, *check_path(path).split("/"))

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._full(path))

    def size(self, path: str) -> int:
        with _wrapped(path):
            return os.path.getsize(self._full(path))

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        with _wrapped(path), open(self._full(path), "rb") as f:
            f.seek(offset)
            return f.read(length if length >= 0 else -1)

    def write(self, path: str, data: bytes) -> None:
        full = self._full(path)
        with _wrapped(path):
            os.replace(_durable_temp(full, data), full)
            fsync_dir(os.path.dirname(full))

    def create(self, path: str, data: bytes) -> bool:
        """A fsynced temporary file linked into place: ``link(2)`` fails if the name
        exists, so of two creators exactly one wins, and readers never see a part."""
        full = self._full(path)
        with _wrapped(path):
            tmp = _durable_temp(full, data)
            try:
                os.link(tmp, full)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            fsync_dir(os.path.dirname(full))
        return True

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        """The listing, each object hashed (a local file is cheap to read whole); an
        object removed between the listing and its read is left out."""
        versions = {}
        for path in [p for p in self.list(prefix) if p > start_after]:
            with _wrapped(path):
                version = _version(self._full(path))
            if version:
                versions[path] = version
        return versions

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        data = self.read(path)
        return data, hashlib.sha256(data).hexdigest()

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        """Compare and replace under an exclusive ``flock`` of a lock file beside the
        object (processes on this machine share the directory), then an atomic
        rename."""
        full = self._full(path)
        with _wrapped(path), self._locked(full):
            if _version(full) != version:
                return None
            os.replace(_durable_temp(full, data), full)
            fsync_dir(os.path.dirname(full))
            return hashlib.sha256(data).hexdigest()

    def delete_if(self, path: str, version: str) -> bool:
        """Compare and unlink under the lock ``swap`` takes; the directory is fsynced (a
        released claim must not come back after a power loss)."""
        full = self._full(path)
        with _wrapped(path), self._locked(full):
            if not version or _version(full) != version:
                return False
            os.unlink(full)
            fsync_dir(os.path.dirname(full))
            return True

    @staticmethod
    @contextmanager
    def _locked(full: str) -> Iterator[None]:
        """An exclusive ``flock`` of ``<object>.tmp.lock`` (listing skips it) while the
        object is compared and changed."""
        _durable_dir(os.path.dirname(full))
        fd = os.open(f"{full}.tmp.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def delete(self, path: str) -> None:
        with _wrapped(path), suppress(FileNotFoundError):
            os.unlink(self._full(path))

    def delete_many(self, paths: list[str]) -> None:
        for path in paths:
            self.delete(path)

    def list(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        # walk only the deepest directory the prefix names whole (``a/data/`` -> a/data;
        # ``owners/x`` -> owners): a listing costs what it lists, not the whole tier
        top = prefix.rpartition("/")[0]
        if top and any(p in ("", ".", "..") for p in top.split("/")):
            top = ""  # not a plain path: the whole tier, filtered below
        start = os.path.join(self.root, *top.split("/")) if top else self.root
        with _wrapped(prefix or "."):
            for dirpath, _dirs, files in os.walk(start):
                rel = os.path.relpath(dirpath, self.root)
                for name in files:
                    if ".tmp." in name:
                        continue  # a write in progress
                    path = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                    if path.startswith(prefix):
                        out.append(path)
        return sorted(out)
