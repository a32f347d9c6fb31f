"""DiskGuard: the data volume's watermarks, so that a filling disk refuses sends cleanly
instead of failing writes half-way.

The volume's use is read with ``os.statvfs`` on the data dir (2 us) on every send check
and by the broker's disk job every second (``probe_interval_ms`` can space readings out).  Its
``used_ratio`` is the share of the volume in use, not counting the guard's own reserve
file.  Two watermarks, as in RocketMQ's ``diskMaxUsedSpaceRatio``:

- at or above ``clean_ratio`` retention should run at once, not at its next interval
  (``should_clean``; the broker runs it: it deletes what is past the retention settings,
  never younger data);
- a client send that would take the use to or past ``max_used_ratio`` is refused
  (``check_send`` raises ``ResourceExhausted`` naming the volume and its use).  Only
  client sends: the broker's own appends (timer deliveries, retries, dead letters: they
  move messages consumers are draining), Pop, Ack and Stats go on, on the space above
  the watermark.  Sends resume
  by themselves once the use is below the watermark again.

The reserve file ``<data_dir>/disk-reserve`` (``reserve_bytes``, at most 5 % of the
volume) is set aside with ``posix_fallocate`` while there is room.  When free space falls
below its size (someone else filled the volume, or a watermark is set too high) it is
deleted, so that RocksDB's writes, a clean shutdown and a restart have room; it is put
back once free space is over twice its size.  ``release_if_short`` runs at start, before
anything opens.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from store.clock import Clock
from store.errors import InvalidArgument, ResourceExhausted

log = logging.getLogger(__name__)

RESERVE_FILE = "disk-reserve"
RESERVE_SHARE = 0.05  # the reserve file takes at most this share of the volume
Probe = Callable[[str], tuple[int, int]]  # path -> (volume bytes, bytes free to us)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it wraps) is a write that found the volume full."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def unless_full(step: Callable[[], object], what: str) -> None:
    """Run a shutdown ``step``; if the volume is too full for it to write, log that and
    go on (what was answered OK is durable already; the next start replays from the
    older checkpoints)."""
    try:
        step()
    except Exception as exc:
        if not is_no_space(exc):
            raise
        log.error("%s could not write on the full volume (%s); the next start replays "
                  "from the last checkpoint", what, exc)


def statvfs_probe(path: str) -> tuple[int, int]:
    """``(volume bytes, bytes free to us)`` as ``df`` counts them: blocks reserved for
    root are neither, so a volume whose free space is all reserved reads 100 % used."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    return (used + st.f_bavail) * st.f_frsize, st.f_bavail * st.f_frsize


@dataclass(frozen=True, slots=True)
class DiskStats:
    total_bytes: int
    used_bytes: int  # not counting the reserve file
    free_bytes: int
    used_ratio: float
    clean_ratio: float
    max_used_ratio: float
    refusing_sends: bool
    refused_sends: int  # since start
    reserve_bytes: int  # the reserve file's size now (0: released or never made)
    reserve_releases: int  # since start


class DiskGuard:
    def __init__(self, data_dir: str, clock: Clock, max_used_ratio: float = 0.90,
                 clean_ratio: float = 0.80, reserve_bytes: int = 64 << 20,
                 probe_interval_ms: int = 0, probe: Probe = statvfs_probe) -> None:
        if not 0 < clean_ratio <= max_used_ratio <= 1:
            raise InvalidArgument("need 0 < store.disk_clean_ratio <= "
                                  "store.disk_max_used_ratio <= 1")
        self._dir = data_dir
        self._clock = clock
        self.max_used_ratio, self.clean_ratio = max_used_ratio, clean_ratio
        self._reserve_goal = max(0, reserve_bytes)
        self._interval_ms = probe_interval_ms
        self._probe = probe
        self._reserve_path = os.path.join(data_dir, RESERVE_FILE)
        self._lock = threading.Lock()
        self._probed_at = float("-inf")
        self._total = self._free = 0
        self._refused = self._releases = 0
        self._reserve = self._reserve_size()

    # ------------------------------------------------------------------ probing

    def _reserve_size(self) -> int:
        try:
            return os.stat(self._reserve_path).st_size
        except FileNotFoundError:
            return 0

    def _wanted_reserve(self) -> int:
        return min(self._reserve_goal, int(self._total * RESERVE_SHARE))

    def refresh(self, force: bool = False) -> DiskStats:
        """Read the volume's use now (or reuse a reading under ``probe_interval_ms``
        old), releasing or restoring the reserve file as the free space says."""
        with self._lock:
            now = self._clock.monotonic_ms()
            if force or now - self._probed_at >= self._interval_ms:
                self._probed_at = now
                self._total, self._free = self._probe(self._dir)
                self._manage_reserve()
            return self._stats()

    def _manage_reserve(self) -> None:
        wanted = self._wanted_reserve()
        if self._reserve and self._free < max(self._reserve, wanted):
            self._release("free space is short")
        elif not self._reserve and wanted and self._free > 2 * wanted:
            try:
                fd = os.open(self._reserve_path, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    os.posix_fallocate(fd, 0, wanted)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("could not set aside the disk reserve %s: %s",
                            self._reserve_path, exc)
                self._unlink_reserve()
                return
            self._reserve = wanted
            self._free -= wanted

    def _release(self, why: str) -> None:
        size = self._reserve
        self._unlink_reserve()
        self._free += size
        self._releases += 1
        log.warning("released the %d-byte disk reserve %s (%s): the volume is nearly "
                    "full; free space on it", size, self._reserve_path, why)

    def _unlink_reserve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._reserve_path)
        self._reserve = 0

    def release_if_short(self) -> None:
        """At start, before anything opens: give the reserve back if free space is short."""
        with self._lock:
            self._total, self._free = self._probe(self._dir)
            self._probed_at = self._clock.monotonic_ms()
            if self._reserve and self._free < 2 * max(self._reserve, self._wanted_reserve()):
                self._release("starting on a nearly full volume")

    def _used_ratio(self) -> float:
        if self._total <= 0:
            return 0.0
        return max(0, self._total - self._free - self._reserve) / self._total

    def _stats(self) -> DiskStats:
        ratio = self._used_ratio()
        return DiskStats(self._total, max(0, self._total - self._free - self._reserve),
                         self._free, ratio, self.clean_ratio, self.max_used_ratio,
                         ratio >= self.max_used_ratio, self._refused, self._reserve,
                         self._releases)

    # ------------------------------------------------------------------ decisions

    def check_send(self, nbytes: int = 0) -> None:
        """Raise ``ResourceExhausted`` if ``nbytes`` more would take the volume to or past
        the watermark."""
        s = self.refresh()
        if s.refusing_sends or (s.used_bytes + nbytes) >= s.max_used_ratio * s.total_bytes:
            with self._lock:
                self._refused += 1
            raise ResourceExhausted(
                f"the data volume of {self._dir} is {s.used_ratio:.1%} used, at or above "
                f"store.disk_max_used_ratio ({s.max_used_ratio:.0%}): sends are refused "
                f"until retention or the operator frees space (consumers go on)")

    def should_clean(self) -> bool:
        """Whether the volume is at or above the clean watermark (run retention now)."""
        return self.refresh().used_ratio >= self.clean_ratio
