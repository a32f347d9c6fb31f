"""The storage Provider protocol: the small driver every tier backend implements.

Objects are immutable once written (S3 has no append): a writer that grows a file writes
it as a sequence of objects (see ``tiered.segment`` when it lands).  Reads are ranged.
Every method raises ``TierNotFound``/``TierUnavailable``/``TierError``, never a foreign
exception; the conditional writes (``create``, ``swap``, ``delete_if``) also
``TierOutcomeUnknown`` (a ``TierUnavailable``) when the write may have been applied
unseen.  Implementations are thread-safe.
"""

from __future__ import annotations

from typing import Protocol


class Provider(Protocol):
    name: str

    def exists(self, path: str) -> bool:
        """Does the object exist?"""
        ...

    def size(self, path: str) -> int:
        """The object's size in bytes (``TierNotFound`` if missing)."""
        ...

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        """``length`` bytes from ``offset`` (-1: to the end); short at the end of the
        object; ``TierNotFound`` if missing."""
        ...

    def write(self, path: str, data: bytes) -> None:
        """Create or replace the object atomically (readers see old or new, not a mix)."""
        ...

    def create(self, path: str, data: bytes) -> bool:
        """Write the object only if none exists at ``path`` (atomically: of two writers
        racing, exactly one gets True); False if one exists.  What coordinates brokers
        sharing a tier (``cluster.ownership``).  ``TierOutcomeUnknown`` when this write
        may have been applied without an answer saying so (S3: a lost response, and the
        retry found the object, perhaps this very one): read it back and compare."""
        ...

    def delete(self, path: str) -> None:
        """Remove the object; removing a missing object is not an error."""
        ...

    def delete_many(self, paths: list[str]) -> None:
        """Remove the objects, as few requests as the backend allows (S3: DeleteObjects,
        1,000 keys a request); missing ones are not an error.  ``TierError`` when one
        could not be removed (the others may have been)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Paths starting with ``prefix``, sorted."""
        ...

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        """The paths starting with ``prefix`` (and sorting after ``start_after``, if
        given), each with its version as ``read_versioned`` gives it, in one listing
        (S3: ListObjectsV2's ETags, its ``StartAfter``).  What lets a watcher read again
        only the objects that changed (``cluster.leasewatch``).  A version is as of the
        listing: the object may have changed since."""
        ...

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        """The whole object and its version (S3: the ETag), for ``swap``;
        ``TierNotFound`` if missing."""
        ...

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        """Replace the object only if it is still at ``version`` (``""``: only if there
        is none), atomically: of two writers racing from one version, exactly one
        succeeds.  The new version, or None when the object changed (or appeared, or
        went) meanwhile.  S3's conditional PutObject (``If-Match`` / ``If-None-Match``):
        what broker leases are made of (``cluster.lease``).  ``TierOutcomeUnknown``
        when this write may have been applied without an answer saying so (S3: a lost
        response, and the retry found the object changed, perhaps by this very write):
        read it back and compare; None is only ever a write that was not applied."""
        ...

    def delete_if(self, path: str, version: str) -> bool:
        """Remove the object only if it is still at ``version`` (from ``read_versioned``
        or ``swap``), atomically: True when this call removed it, False when it changed
        or went meanwhile.  S3's conditional DeleteObject (``If-Match``): what releases a
        claim without removing one another broker made since (``cluster.ownership``).
        ``TierOutcomeUnknown`` as for ``swap`` (a lost answer, and the retry found the
        object gone, perhaps by this very delete): read it back and compare."""
        ...
