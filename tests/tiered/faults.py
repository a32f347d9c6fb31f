"""A fault-injecting wrapper around a real Provider (failures, slow and late writes)."""

from __future__ import annotations

import threading

from tiered.errors import TierUnavailable
from tiered.provider import Provider


class FaultyProvider:
    """Wraps a real provider.  The next ``failures`` writes raise; while ``stall`` is set
    (``hold()``), a write blocks until ``release()`` and then succeeds: a late success."""

    def __init__(self, inner: Provider, failures: int = 0) -> None:
        self.inner, self.failures, self.name = inner, failures, "faulty"
        self._open = threading.Event()
        self._open.set()
        self.writes = 0
        self.reads = 0  # ranged reads that reached the inner provider

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def write(self, path: str, data: bytes) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise TierUnavailable("injected failure")
        self._open.wait(30)
        self.inner.write(path, data)
        self.writes += 1

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        self.reads += 1
        return self.inner.read(path, offset, length)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)
