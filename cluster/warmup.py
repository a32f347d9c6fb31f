"""Warm-up: a takeover's reads begun before its claim, on a lease that looks lost.

After its claim a takeover replays the departed broker's journal, reads its pending
delayed records and the copies it may have delivered (``cluster.replay``,
``cluster.adoption``, ``cluster.delivered``): with durable-ack, hundreds of small tier
objects (one per commit), most of the time between the claim and the first send accepted
(bench/RESULTS.md).  The broker first in line to claim a lease (``cluster.leasewatch``:
the least loaded survivor) sees it unchanged for half a lease (its holder writes it every
third of one), half a lease before it may claim it: it reads then what the takeover will
read (``Warmups.begin``, ``warm_up``), keeping every range it read of the departed
broker's data objects (``WarmReads``, at most ``MAX_BYTES``).

Nothing read before the claim is trusted for itself: the departed broker may be alive and
writing until the claim fences it.  Before its first read in a segment directory the
warm-up lists that directory from the object read on, with the objects' versions; after
the claim (``WarmReads.serve``) each such directory is listed again, and a range is
served only when its object is listed at the same version both times (S3: the ETag, a
digest of the content): the object held those bytes before the read and after the claim
(a change to other bytes and back between the two listings would escape this; no writer
of the tier makes one).  An object written again or folded away is read from the tier, as is
everything the warm-up did not read.  A takeover that comes while its warm-up is still
reading ends it there (``WarmupOver``) and uses what it read, as of one that failed; one
without a warm-up (by hand, or by a broker second in line) reads everything itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from cluster.catalogue import departed_topics
from cluster.delivered import read_ahead
from cluster.handover import last_minute_from
from cluster.replay import replay, stream
from store.names import DELAYED_STREAM
from tiered.flatfile import readers, reading_on
from tiered.mount import MountedBroker
from tiered.provider import Provider

log = logging.getLogger(__name__)

MAX_BYTES = 64 << 20  # what one warm-up keeps at most
KEEP_S = 60.0  # a warm-up no takeover took within this long is dropped (one taken:
#                this long after its takeover)
WAIT_S = 15.0  # a warm-up waits this long for its parts beside the journal's


class WarmupOver(Exception):
    """A warm-up's read after its takeover began: the takeover reads the rest itself."""


class _Kept:
    """What a warm-up read and its two views share (``WarmReads.recorder``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.listing = threading.Lock()  # one listing at a time (a fetch's threads)
        # segment directory -> (listed after, path -> version): listed before a read
        self.listed: dict[str, tuple[str, dict[str, str]]] = {}
        self.ranges: dict[str, list[tuple[int, bytes]]] = {}  # path -> (offset, bytes)
        self.bytes = 0
        self.serving = False  # (the recorder's reads end)
        self.checking = False
        self.checked = threading.Event()  # ``serve``'s listings done
        self.served = 0  # reads answered from what was kept
        self.missed = 0  # reads of its data objects that went to the tier while serving


def _directory(path: str) -> str:
    """The segment directory of an object (what one listing covers)."""
    return path[: path.rindex("/") + 1]


class WarmReads:
    """A Provider: ``base``, answering reads of ``broker``'s data objects from what its
    ``recorder`` (the warm-up's view) kept, after ``serve`` (module docstring).  The
    recorder's reads end with ``WarmupOver`` once serving began, and its writes are
    dropped: nothing is written for a takeover before its claim.  Thread-safe."""

    def __init__(self, base: Provider, broker: str, kept: _Kept | None = None,
                 recording: bool = False) -> None:
        self.name = base.name
        self.broker = broker
        self._base = base
        self._data = f"{broker}/data/"
        self._k = kept or _Kept()
        self._recording = recording

    def recorder(self) -> WarmReads:
        """The warm-up's view: its reads are kept."""
        return WarmReads(self._base, self.broker, self._k, recording=True)

    @property
    def served(self) -> int:
        return self._k.served

    @property
    def missed(self) -> int:
        return self._k.missed

    def _versions(self, path: str) -> dict[str, str]:
        """The versions of ``path``'s segment directory from ``path`` on, listed once
        before the first read of it (again from an earlier key, when one is read); an
        object listed at two versions meanwhile gets none (it changed: not kept)."""
        group = _directory(path)
        k = self._k
        with k.listing:
            after, versions = k.listed.get(group, (path, {}))
            if path not in versions and path <= after:
                after = path[:-1]  # (sorts just before it)
                for p, v in self._base.list_versions(group, after).items():
                    versions[p] = v if versions.get(p, v) == v else ""
                k.listed[group] = (after, versions)
            return versions

    def serve(self) -> None:
        """After the claim: the recorder's reads end; each segment directory read is
        listed again, only the objects listed at the version listed before their read
        are kept, and reads are answered from them from now on.  On a thread of its
        own: a read of the data before it is done waits for it (the mount's reads of
        metadata go on meanwhile)."""
        with self._k.lock:
            self._k.checking = self._k.serving = True
        threading.Thread(target=self._check, name=f"warm-serve-{self.broker}",
                         daemon=True).start()

    def _check(self) -> None:
        k = self._k
        with k.listing:
            groups = dict(k.listed)
        now: dict[str, dict[str, str]] = {}
        try:
            with ThreadPoolExecutor(max(1, min(len(groups), 16)), "warm-serve") as pool:
                now = dict(zip(groups, pool.map(lambda g: self._base.list_versions(
                    g, groups[g][0]), groups), strict=True))
        except Exception as exc:  # nothing served: every read goes to the tier
            log.warning("takeover of %s: its warm-up not used: %s", self.broker, exc)

        def unchanged(path: str) -> bool:  # (a directory listed since: not checked)
            group = _directory(path)
            before = groups[group][1].get(path) if group in groups else None
            return bool(before) and now.get(group, {}).get(path) == before
        with k.lock:
            k.ranges = {p: r for p, r in k.ranges.items() if unchanged(p)}
        k.checked.set()

    def close(self) -> None:
        """Drop what was kept: every read goes to the tier from now on."""
        k = self._k
        with k.lock:
            k.ranges, k.bytes = {}, 0
        with k.listing:
            k.listed = {}

    def kept_bytes(self) -> int:
        return self._k.bytes

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        mine, k = path.startswith(self._data), self._k
        if self._recording:
            if k.serving:
                raise WarmupOver(f"warm-up of {self.broker}: its takeover began")
            if not mine or length < 0:
                return self._base.read(path, offset, length)
            versions = self._versions(path)
            data = self._base.read(path, offset, length)
            if versions.get(path):
                with k.lock:
                    if not k.serving and k.bytes + len(data) <= MAX_BYTES:
                        k.ranges.setdefault(path, []).append((offset, data))
                        k.bytes += len(data)
            return data
        if mine and k.checking:
            k.checked.wait()
        if mine and k.serving:
            with k.lock:
                for at, data in k.ranges.get(path, ()):
                    if length >= 0 and at <= offset and offset + length <= at + len(data):
                        k.served += 1
                        return data[offset - at : offset - at + length]
                k.missed += 1
        return self._base.read(path, offset, length)

    # the rest as the tier answers it
    def exists(self, path: str) -> bool:
        return self._base.exists(path)

    def size(self, path: str) -> int:
        return self._base.size(path)

    def write(self, path: str, data: bytes) -> None:
        if self._recording:  # (the mount's index keeping the recent ids it read)
            log.debug("warm-up of %s: %s not written before the claim", self.broker, path)
            return
        self._base.write(path, data)

    def create(self, path: str, data: bytes) -> bool:
        return self._base.create(path, data)

    def delete(self, path: str) -> None:
        self._base.delete(path)

    def delete_many(self, paths: list[str]) -> None:
        self._base.delete_many(paths)

    def list(self, prefix: str = "") -> list[str]:
        return self._base.list(prefix)

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        return self._base.list_versions(prefix, start_after)

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        return self._base.read_versioned(path)

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        return self._base.swap(path, data, version)

    def delete_if(self, path: str, version: str) -> bool:
        return self._base.delete_if(path, version)


def warm_up(reads: WarmReads, work_dir: str,
            journal_read: Callable[[], None] = lambda: None) -> None:
    """Read what a takeover of ``reads.broker`` reads first (module docstring): its
    journal and delayed stream (then ``journal_read`` is called: what the takeover waits
    for), and beside them the copies it may have delivered
    (``cluster.delivered.read_ahead``) and the ids it stored in its last minute (what a
    resend's lookup indexes, ``cluster.handover.InheritedIds``; only a send with a
    client-chosen id waits for those)."""
    reads = reads.recorder()
    mounted = MountedBroker(reads, reads.broker, work_dir, empty=True)

    def ids() -> None:
        mounted.warm(last_minute_from(mounted, departed_topics(reads, mounted)))

    beside = [threading.Thread(target=_logged, args=(part, what, reads.broker),
                               name=f"warm-{what}-{reads.broker}", daemon=True)
              for part, what in ((partial(read_ahead, mounted, "warm-delivered"),
                                  "delivered copies"), (ids, "recent ids"))]
    for t in beside:
        t.start()
    with reading_on(readers("warm-read")):  # not ahead of this broker's clients' reads
        journal = replay(reads, mounted, label="warm-up")
        pointer = journal.timer_snapshot
        for _ in stream(mounted, DELAYED_STREAM, pointer.delayed_from if pointer else 0):
            pass
    journal_read()
    for t in beside:
        t.join(WAIT_S)


def _logged(part: Callable[[], object], what: str, broker: str) -> None:
    try:
        part()
    except WarmupOver:
        log.info("warm-up of %s: its %s not all read before the claim", broker, what)
    except Exception as exc:  # the takeover reads them itself
        log.warning("warm-up of %s: its %s not read: %s", broker, what, exc)


@dataclass
class _Run:
    reads: WarmReads
    begun: float  # monotonic
    done: threading.Event = field(default_factory=threading.Event)  # what a takeover waits for
    ended: threading.Event = field(default_factory=threading.Event)  # every part
    ok: bool = False
    lead_s: float = 0.0  # begun this long before the claim's takeover took it


class Warmups:
    """The warm-ups of one broker: begun by its lease watch, taken by its takeovers."""

    def __init__(self, tier: Callable[[], Provider], work_dir: str) -> None:
        self._tier = tier  # (the broker's, once open)
        self._work_dir = work_dir  # <data dir>/mounts: one directory per warm-up in it
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._taken: dict[str, _Run] = {}

    def begin(self, departed: str) -> None:
        """Warm up for a takeover of ``departed`` on a thread of its own (a lease watch's
        call: returns at once), unless one is under way."""
        now = time.monotonic()
        with self._lock:
            for name in [n for n, r in self._runs.items() if now - r.begun > KEEP_S]:
                del self._runs[name]  # not taken: its broker was alive after all
            if departed in self._runs or departed in self._taken:
                return
            run = self._runs[departed] = _Run(WarmReads(self._tier(), departed), now)
        threading.Thread(target=self._run, args=(run,), daemon=True,
                         name=f"warm-up-{departed}").start()

    def _run(self, run: _Run) -> None:
        work = os.path.join(self._work_dir, f"{run.reads.broker}.warm")
        def journal_read() -> None:
            run.ok = True
            run.done.set()  # a takeover waits for no more (the rest goes on beside it)
        try:
            warm_up(run.reads, work, journal_read)
            log.info("warm-up for a takeover of %s: %.1f MiB read in %.1f s",
                     run.reads.broker, run.reads.kept_bytes() / (1 << 20),
                     time.monotonic() - run.begun)
        except WarmupOver:
            log.info("warm-up for a takeover of %s: %.1f MiB read in %.1f s, when the "
                     "takeover began", run.reads.broker,
                     run.reads.kept_bytes() / (1 << 20), time.monotonic() - run.begun)
        except Exception as exc:  # the takeover reads what it needs itself
            log.warning("warm-up for a takeover of %s failed: %s", run.reads.broker, exc)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            run.done.set()
            run.ended.set()

    def ended(self, departed: str, timeout_s: float) -> bool:
        """Whether the warm-up for ``departed`` (begun, perhaps taken) has read all it
        reads, waiting up to ``timeout_s``; False when there is none."""
        with self._lock:
            run = self._runs.get(departed) or self._taken.get(departed)
        return run is not None and run.ended.wait(timeout_s)

    def take(self, departed: str) -> WarmReads | None:
        """After the claim of ``departed``: its warm-up's reads, checked against the
        tier from now on (``WarmReads.serve``; a warm-up still reading stops, and what
        it read so far serves, as that of one that failed).  None when there is none,
        or it read nothing."""
        with self._lock:
            run = self._runs.pop(departed, None)
        if run is None:
            return None
        run.lead_s = time.monotonic() - run.begun
        log.info("takeover of %s: its warm-up begun %.1f s before the claim, %s, %.2f MiB "
                 "kept", departed, run.lead_s, "its journal read" if run.ok else
                 "failed" if run.done.is_set() else "still reading",
                 run.reads.kept_bytes() / (1 << 20))
        run.reads.serve()  # (ends the warm-up's reads)
        if not run.reads.kept_bytes():
            return None
        with self._lock:
            self._taken[departed] = run
        return run.reads

    def release(self, departed: str) -> None:
        """The takeover of ``departed`` has ended: what its warm-up kept is dropped
        ``KEEP_S`` later (its background reads, the recent ids, may still use it)."""
        with self._lock:
            run = self._taken.pop(departed, None)
        if run is not None:
            timer = threading.Timer(KEEP_S, self._close, args=(departed, run))
            timer.daemon = True
            timer.start()

    @staticmethod
    def _close(departed: str, run: _Run) -> None:
        log.info("takeover of %s: %d tier reads answered by its warm-up (begun %.1f s "
                 "before the claim), %d of its data read after the claim", departed,
                 run.reads.served, run.lead_s, run.reads.missed)
        run.reads.close()
