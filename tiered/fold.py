"""TierFolding: a queue's small tier objects folded into few, so its metadata stays small.

Every commit is one object per stream (``tiered.flatfile``), and with durable-ack a commit
is often one message: a busy queue made tens of objects a second, every one listed in
its metadata (~16 B each), which every commit rewrote in full, locally and in the tier,
and which the commit record carries (``tiered.carried``: past ``CARRY_MAX_BYTES`` the
commit fell back to three rounds).  A fold reads a run of consecutive objects of one
segment and writes their bytes as one object under a name of its own
(``<start>-<end>``); the metadata then lists the fold in their place.  Positions never
change, so nothing a reader or a commit counted on moves.

Which runs (``runs``), per segment, like the levels of an LSM tree: a run of
``tier.fold_objects`` consecutive objects of the same level (a committed object is level
0, a fold of level-``l`` objects is level ``l + 1``) becomes one, cut to at most
``FOLD_BYTES``; a sealed segment's objects are folded once more, whatever their levels,
into as few as ``FOLD_BYTES`` allows.  So a segment lists at most ``fold_objects - 1``
objects per level besides its large ones, and a byte is rewritten about log_fanin(16
MiB / commit size) times (3 for 1 KiB commits at fan-in 32).

Order of durable steps: the fold object is written, then listed in the metadata, which
is saved (locally, then its copy or the commit record carries it, as any commit's);
the objects it replaced are deleted only ``tier.fold_keep_s`` later (a Spark job or a
read planned before the fold still reads them), once the metadata a reader of the tier
finds (``tiered.carried.read_meta``) names none of them, and while this broker still
holds its lease (``confirm_deletes``); a deleted topic's at once (no reader reads it
again; tier retention deletes the rest of it).  A crash before the listing leaves the fold
object as an orphan (space, never correctness); after it, the replaced ones, which the
first pass after the start finds (``_sweep``: in a listed fold's range under another
name, they are never read again) and deletes like any replaced.  Named
crash points: ``tier_fold.after_object``, ``tier_fold.after_metadata``,
``tier_fold.mid_delete``.  A pass runs after tier retention's (``run_retention``: what
expires is not folded first), on its thread; a taken-over broker folds nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from store.clock import Clock
from store.crashpoint import crashpoint
from tiered.carried import carried, meta_path, read_meta
from tiered.errors import TierError
from tiered.flatfile import FlatFile, FlatFileMeta, Segment, fold_path, reading_on
from tiered.provider import Provider
from tiered.queue import TieredQueue
from tiered.retention import QueueKey, Uploads

log = logging.getLogger(__name__)

FOLD_BYTES = 16 << 20  # the largest fold (read and written in one piece)
PASS_BYTES = 256 << 20  # what one pass reads and writes at most
FOLD_READERS = 2  # objects a pass reads at once
SWEEP_SLACK_MS = 3_600_000  # store times vs. this clock, and a segment sealed late


def runs(seg: Segment, fanin: int) -> list[tuple[int, int, int]]:
    """The folds due in ``seg``: ``(k, j, level)`` for its objects ``[k, j)`` folded into
    one of ``level``, left to right, not overlapping (see the module)."""
    sizes = [seg.object_end(k) - start for k, start in enumerate(seg.objects)]
    levels = [seg.folds.get(start, 0) for start in seg.objects]
    out: list[tuple[int, int, int]] = []
    k = 0
    while k < len(sizes):
        j, total = k, 0
        while j < len(sizes) and (seg.sealed or levels[j] == levels[k]) \
                and total + sizes[j] <= FOLD_BYTES:
            total += sizes[j]
            j += 1
        enough = j - k >= 2 if seg.sealed else j - k >= fanin
        if enough:
            out.append((k, j, 1 + max(levels[k:j])))
            k = j
        elif seg.sealed or j == len(sizes) or levels[j] != levels[k]:
            k = max(j, k + 1)  # too few alike here (or one too large): go on after them
        else:
            k += 1  # a run cut by its size: its first object stays as it is
    return out


@dataclass
class _Replaced:
    due_ms: int  # monotonic: not deleted before
    key: QueueKey
    streams: tuple[str, str]  # the queue's log and cq prefixes
    paths: list[str]


class TierFolding:
    def __init__(self, uploads: Uploads, provider: Provider, broker: str, fanin: int,
                 keep_s: float, clock: Clock, deleted: Callable[[str], bool]) -> None:
        self._uploads = uploads
        self._deleted = deleted  # topic -> deleted (its data is read by no one again)
        self._provider = provider
        self._broker = broker
        self.fanin = fanin  # 0: no folds
        self.keep_ms = int(keep_s * 1000)
        self._clock = clock
        self._lock = threading.Lock()  # one pass at a time
        self._replaced: list[_Replaced] = []
        self._swept = False  # ``_sweep`` done
        # a few readers of their own: a pass is background work, it must not take the
        # CPU (and the GIL) from the commits of a busy broker
        self._readers = ThreadPoolExecutor(FOLD_READERS, thread_name_prefix="tier-fold")
        self.folds = 0  # fold objects listed since start
        self.deleted = 0  # replaced objects deleted since start

    def run(self) -> int:
        """Fold what is due in every queue and delete what folds replaced long enough
        ago; returns the folds listed.  0 at once when folds are off, another pass is
        running or the broker was taken over."""
        if self.fanin <= 0 or self._uploads.fenced or not self._lock.acquire(blocking=False):
            return 0
        try:
            if not self._swept:
                self._sweep()
            with reading_on(self._readers):  # not queued ahead of clients' reads
                listed = self._fold()
            self._delete()
        finally:
            self._lock.release()
        return listed

    def close(self) -> None:
        """No more passes (the dispatcher stopped); a pass under way ends at its next
        read."""
        self.fanin = 0
        self._readers.shutdown(wait=False, cancel_futures=True)

    def _sweep(self) -> None:
        """Once, at the first pass: the objects a crash left after their fold was listed
        (in a listed fold's range, under another name) are due like any replaced.  Only
        in segments a fold may have touched since the keep before the start began (the
        open one, those whose data is younger than twice the keep): a listing each."""
        horizon = self._clock.now_ms() - 2 * self.keep_ms - SWEEP_SLACK_MS
        for key, q in self._uploads.queues():
            if self._deleted(q.topic):
                continue
            left: list[str] = []
            try:
                for ff in (q.log, q.cq):
                    for seg in ff.segments():
                        if seg.folds and (not seg.sealed or seg.last_at_ms >= horizon):
                            left += _left_in_folds(seg, ff.prefix, self._provider.list(
                                f"{ff.prefix}/{seg.base:020d}/"))
            except TierError as exc:  # an orphan stays: space, never correctness
                log.warning("could not look for what folds left in %s/%d: %s", *key, exc)
                continue
            if left:
                log.info("tier folds: %d objects a fold replaced before the start are due "
                         "for deletion in %s/%d", len(left), *key)
                self._keep(key, q, left)
        self._swept = True

    def _fold(self) -> int:
        budget, listed = PASS_BYTES, 0
        for key, q in self._uploads.queues():
            if self._deleted(q.topic):
                continue  # tier retention deletes all of it
            replaced: list[str] = []
            for ff in (q.log, q.cq):
                for seg in ff.segments():
                    for k, j, level in runs(seg, self.fanin):
                        start, end = seg.objects[k], seg.object_end(j - 1)
                        if end - start > budget:
                            break
                        budget -= end - start
                        replaced += self._fold_one(ff, seg, seg.objects[k:j], end, level)
            if replaced and self._uploads.save_if_current(key, q):  # else re-created
                crashpoint("tier_fold.after_metadata")
                listed += 1
                self._keep(key, q, replaced)
        if listed:
            log.info("tier folds: %d queues' small objects folded", listed)
        return listed

    def _keep(self, key: QueueKey, q: TieredQueue, paths: list[str]) -> None:
        """Note ``q``'s replaced ``paths``, deleted ``keep_s`` from now at the earliest."""
        self._replaced.append(_Replaced(int(self._clock.monotonic_ms()) + self.keep_ms, key,
                                        (q.log.prefix, q.cq.prefix), paths))

    def _fold_one(self, ff: FlatFile, seg: Segment, starts: list[int], end: int,
                  level: int) -> list[str]:
        """Write the fold of ``starts`` (to ``end``) and list it; the replaced paths."""
        path = fold_path(ff.prefix, seg.base, starts[0], end)
        try:
            data = ff.read(starts[0], end - starts[0])
            if len(data) != end - starts[0]:
                return []  # expired meanwhile
            self._provider.write(path, data)
        except (TierError, RuntimeError) as exc:  # damage, an outage, or closed: the
            log.warning("could not fold %d objects of %s at %d: %s",  # objects stay
                        len(starts), ff.prefix, starts[0], exc)
            return []
        crashpoint("tier_fold.after_object")
        replaced = ff.fold(seg.base, starts, end, level)
        if replaced is None:  # expired meanwhile: the fold is an orphan, deleted at once
            self._delete_paths([path])
            return []
        self.folds += 1
        return replaced

    def _delete(self) -> None:
        """Delete the replaced objects due, of queues whose metadata in the tier names
        none of them, while the lease is held."""
        now = self._clock.monotonic_ms()
        due = [r for r in self._replaced if r.due_ms <= now or self._deleted(r.key[0])]
        if not due:
            return
        try:
            lease = carried(self._provider, self._broker)
        except TierError as exc:
            log.warning("not deleting folded objects now: %s", exc)
            return
        ready = [r for r in due if self._deleted(r.key[0]) or self._unnamed(r, lease)]
        if not ready or not self._uploads.confirm_deletes():
            return
        for n, r in enumerate(ready):
            self._replaced.remove(r)
            self._delete_paths(r.paths)
            if n == 0:
                crashpoint("tier_fold.mid_delete")

    def _unnamed(self, r: _Replaced, lease: dict[str, bytes]) -> bool:
        """Whether the queue's metadata as a reader of the tier finds it names none of
        ``r``'s paths (a copy not in yet still names them: wait for it)."""
        topic, qid = r.key
        path = meta_path(self._broker, topic, qid)
        try:
            meta = read_meta(self._provider, path, lease)
        except TierError as exc:
            log.warning("not deleting folded objects of %s now: %s", path, exc)
            return False
        if meta is None:
            return True  # the topic was deleted: nothing names them
        named: set[str] = set()
        try:
            raw = json.loads(meta)
            for stream, prefix in zip(("log", "cq"), r.streams, strict=True):
                for seg in FlatFileMeta.from_json(raw[stream]).segments:
                    named.update(seg.paths(prefix))
        except (TierError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("not deleting folded objects of %s now: its metadata in the tier "
                        "does not read (%s)", path, exc)
            return False
        return named.isdisjoint(r.paths)

    def _delete_paths(self, paths: list[str]) -> None:
        try:
            self._provider.delete_many(paths)  # (S3: 1,000 a request)
            self.deleted += len(paths)
        except TierError as exc:  # orphans: cost space, never correctness
            log.warning("could not delete %d folded objects: %s", len(paths), exc)


def _left_in_folds(seg: Segment, prefix: str, paths: list[str]) -> list[str]:
    """The objects of ``paths`` (listed under ``seg``'s prefix) that begin inside one of
    its listed folds but are not what it lists: replaced, never read again."""
    named = set(seg.paths(prefix))
    folds = [(start, seg.object_end(k)) for k, start in enumerate(seg.objects)
             if start in seg.folds]
    left = []
    for path in paths:
        try:
            start = int(path.rsplit("/", 1)[-1].split("-", 1)[0])
        except ValueError:
            continue  # not an object of this stream
        if path not in named and any(a <= start < b for a, b in folds):
            left.append(path)
    return left
