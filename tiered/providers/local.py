"""A Provider over a local directory (the default tier).  Objects are files under
``root``; a write goes to a temporary file that is fsynced and renamed into place.
Thread-safe."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from tiered.errors import TierError, TierNotFound, check_path


@contextmanager
def _wrapped(path: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError as exc:
        raise TierNotFound(f"{path} does not exist in the tier") from exc
    except OSError as exc:
        raise TierError(f"local tier failed on {path}: {exc}") from exc


def _durable_temp(full: str, data: bytes) -> str:
    """``data`` in a fsynced temporary file beside ``full`` (listing skips it)."""
    tmp = f"{full}.tmp.{os.getpid()}.{threading.get_ident()}"
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


class LocalProvider:
    name = "local"

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

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
        return True

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        data = self.read(path)
        return data, hashlib.sha256(data).hexdigest()

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        """Compare and replace under an exclusive ``flock`` of a lock file beside the
        object (processes on this machine share the directory), then an atomic
        rename."""
        full = self._full(path)
        with _wrapped(path):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fd = os.open(f"{full}.tmp.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    with open(full, "rb") as f:
                        now = hashlib.sha256(f.read()).hexdigest()
                except FileNotFoundError:
                    now = ""
                if now != version:
                    return None
                os.replace(_durable_temp(full, data), full)
                return hashlib.sha256(data).hexdigest()
            finally:
                os.close(fd)

    def delete(self, path: str) -> None:
        with _wrapped(path), suppress(FileNotFoundError):
            os.unlink(self._full(path))

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
