"""An in-memory Provider, for tests and tools.  Thread-safe."""

from __future__ import annotations

import hashlib
import threading

from tiered.errors import TierNotFound, check_path


class MemoryProvider:
    name = "memory"

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def exists(self, path: str) -> bool:
        return check_path(path) in self._objects

    def _get(self, path: str) -> bytes:
        try:
            return self._objects[check_path(path)]
        except KeyError:
            raise TierNotFound(f"{path} does not exist in the tier") from None

    def size(self, path: str) -> int:
        return len(self._get(path))

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        data = self._get(path)
        return data[offset:] if length < 0 else data[offset : offset + length]

    def write(self, path: str, data: bytes) -> None:
        with self._lock:
            self._objects[check_path(path)] = bytes(data)

    def create(self, path: str, data: bytes) -> bool:
        with self._lock:
            key = check_path(path)
            if key in self._objects:
                return False
            self._objects[key] = bytes(data)
            return True

    def delete(self, path: str) -> None:
        with self._lock:
            self._objects.pop(check_path(path), None)

    def delete_many(self, paths: list[str]) -> None:
        for path in paths:
            self.delete(path)

    def delete_if(self, path: str, version: str) -> bool:
        with self._lock:
            key = check_path(path)
            current = self._objects.get(key)
            if current is None or hashlib.sha256(current).hexdigest() != version:
                return False
            del self._objects[key]
            return True

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(p for p in self._objects if p.startswith(prefix))

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        with self._lock:
            return {p: hashlib.sha256(d).hexdigest()
                    for p, d in sorted(self._objects.items())
                    if p.startswith(prefix) and p > start_after}

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        with self._lock:
            data = self._get(path)
        return data, hashlib.sha256(data).hexdigest()

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        with self._lock:
            key = check_path(path)
            current = self._objects.get(key)
            now = hashlib.sha256(current).hexdigest() if current is not None else ""
            if now != version:
                return None
            self._objects[key] = bytes(data)
            return hashlib.sha256(data).hexdigest()
