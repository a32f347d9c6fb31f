"""A fault-injecting wrapper around a real Provider (failures, slow and late writes)."""

from __future__ import annotations

import threading

from tiered.errors import TierUnavailable
from tiered.provider import Provider


class FaultyProvider:
    """Wraps a real provider.  The next ``failures`` writes raise, and those to paths
    containing ``refuse`` while it is set.  After ``hold()`` a
    write blocks until ``release()`` and then succeeds: a late success; ``pass_new()``
    lets new writes through while those already held stay held.  ``held`` counts the
    writes blocked now, ``writes`` those that reached the inner provider."""

    def __init__(self, inner: Provider, failures: int = 0) -> None:
        self.inner, self.failures, self.name = inner, failures, "faulty"
        self._lock = threading.Lock()
        self._gate: threading.Event | None = None  # what a write starting now waits for
        self._gates: list[threading.Event] = []
        self.writes = 0
        self.reads = 0  # ranged reads that reached the inner provider
        self.held = 0
        self.refuse = ""  # while set: every write to a path containing it raises

    def hold(self) -> None:
        with self._lock:
            self._gate = threading.Event()
            self._gates.append(self._gate)

    def pass_new(self) -> None:
        with self._lock:
            self._gate = None

    def release(self) -> None:
        with self._lock:
            for gate in self._gates:
                gate.set()
            self._gates, self._gate = [], None

    def write(self, path: str, data: bytes) -> None:
        with self._lock:
            if self.failures > 0:
                self.failures -= 1
                raise TierUnavailable("injected failure")
            if self.refuse and self.refuse in path:
                raise TierUnavailable(f"injected failure for {path}")
            gate = self._gate
            self.held += gate is not None
        if gate is not None:
            try:
                gate.wait(30)
            finally:
                with self._lock:
                    self.held -= 1
        self.inner.write(path, data)
        with self._lock:
            self.writes += 1

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        self.reads += 1
        return self.inner.read(path, offset, length)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def delete_many(self, paths: list[str]) -> None:
        self.inner.delete_many(paths)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        return self.inner.list_versions(prefix, start_after)
