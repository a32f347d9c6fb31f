"""Whether a start must walk every ConsumeQueue for entries past the recovered CommitLog
end (``ConsumeQueueTable.clear_beyond``), and making such a walk survive a crash in the
middle of it.  With tens of thousands of queues the walk takes seconds, so a start skips
it when no entry can point past the end.

A dispatcher sees a batch only once the CommitLog confirmed it: fsynced with
``flush=sync``, written with ``flush=async``.  Written data outlives a kill -9 (it is in
the page cache) and fsynced data outlives a power cut, so an entry can point past the
recovered end only if

* recovery cut the log (``end < end_before``: a torn tail, or a cut made from outside);
* data the CommitLog's checkpoint says was fsynced is gone;
* the ConsumeQueue's checkpoint is past the end (it covered records that are gone);
* with ``flush=async``, the OS went down since the last start (a power cut leaves no
  other trace), told by the kernel's boot id;
* a walk began and did not finish.

Files in ``<data>/checkpoint/``::

    consumequeue.walk   the log end a walk began at (written and fsynced first, deleted
                        when it is done): at a start it means walk again, as recovery has
                        already cut the torn tail that asked for it
    boot-id             /proc/sys/kernel/random/boot_id at the last start that finished
                        its checks

Not thread-safe (start-up only).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from store.files import fsync_dir, write_atomic

BOOT_ID = "/proc/sys/kernel/random/boot_id"


class TailCheck:
    """The walk decision and its marker files in ``checkpoint_dir``."""

    def __init__(self, checkpoint_dir: str) -> None:
        self._dir = checkpoint_dir
        self._marker = os.path.join(checkpoint_dir, "consumequeue.walk")
        self._boot_path = os.path.join(checkpoint_dir, "boot-id")
        self._boot = _read(BOOT_ID)

    def reason(self, end: int, end_before: int, fsynced: int | None, cq_position: int,
               flush_sync: bool) -> str:
        """Why entries may point past ``end`` (empty: they cannot; see the module
        docstring).  ``end_before``: where the newest segment ended before recovery;
        ``fsynced``: what the CommitLog's checkpoint said before recovery."""
        if os.path.exists(self._marker):
            return "an earlier start stopped before it had checked every queue"
        if end < end_before:
            return f"recovery cut the log from {end_before} to {end}"
        if fsynced is not None and end < fsynced:
            return f"the log ends at {end} but its checkpoint says {fsynced} was fsynced"
        if cq_position > end:
            return f"the consume-queue checkpoint {cq_position} is past the log end {end}"
        if not flush_sync and not self.same_boot():
            return "flush=async and the OS restarted since the last start"
        return ""

    def same_boot(self) -> bool:
        """The OS has not restarted since the last start that finished its checks."""
        return bool(self._boot) and _read(self._boot_path) == self._boot

    @contextmanager
    def walking(self, end: int) -> Iterator[None]:
        """Mark a walk as begun (durably) for the block; unmarked when it ends normally."""
        write_atomic(self._marker, f"{end}\n".encode())
        fsync_dir(self._dir)
        yield
        os.unlink(self._marker)  # if this is lost, the next start walks once more

    def done(self) -> None:
        """The checks of this start are complete: remember the boot they ran in."""
        if self._boot and not self.same_boot():
            write_atomic(self._boot_path, f"{self._boot}\n".encode())


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""
