"""Small local-file helpers shared by the store and the tier."""

from __future__ import annotations

import os


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: written to a temporary file, fsynced and renamed,
    so a crash leaves the old content or the new, never part of either."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(path: str) -> None:
    """fsync the directory ``path``: a file created or renamed in it stays after a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
