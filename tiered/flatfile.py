"""FlatFile: one append-only byte stream on the tier (a queue's tiered CommitLog or its
tiered ConsumeQueue), stored as segments of immutable objects.

Positions are logical offsets in the stream.  The stream is a list of segments, each
named by the position it starts at; a segment is a sequence of objects, each one upload
batch, named by the position it starts at::

    <prefix>/<segment base:020d>/<object start:020d>
    <prefix>/<segment base:020d>/<object start:020d>-<object end:020d>   (a fold)

S3 has no append, so an upload never rewrites an object: one batch = one PUT (request
count: one PUT per batch per stream, plus one metadata PUT per commit; see
``FlatFileMeta``).  Small objects are folded later into one (``tiered.fold``): a fold
holds the same bytes under a name of its own, so the metadata lists one object where it
listed many, and no write ever replaces an object a reader may be reading.

Two positions: ``append_position`` (bytes accepted into the buffer) and
``commit_position`` (bytes durable in the tier and listed in the metadata).  A commit
uploads the buffer as one object, in steps so that an owner can upload many FlatFiles
at once and wait for them together: ``begin_commit`` (reserve the object in the last
segment; no I/O), ``start_upload`` (the PUT, on the uploader pool), ``await_uploads``
(``tiered.uploads``), ``finish_commit``; ``commit`` does all of them for one FlatFile.
When the upload fails or times out, the segment is sealed at its committed length and
the buffer goes, unchanged, to a new segment starting at the commit position
(switch-segment): a late success of the failed upload lands in the sealed segment beyond
its sealed length, where no read looks, so nothing is lost and nothing is read twice.  An
upload that never got a thread before its time-out is cancelled: nothing was written,
nothing switches.  A segment switched while empty leaves the next one at the same base,
so the next object has the very path of the failed one: that upload is not started (it
waits for a later commit) while the failed one may still land, so a late write never
lands over a newer one.  Appends never wait for the tier.

The metadata (segments, their objects, lengths and times) is the truth for reads; it is
persisted by the owner after each commit (``to_json``/``from_json``).  Appends and commits
come from one owner thread; retention (``expire_before``) may come from another: it never
seals the segment an upload is reserved in, so a commit's object always lands in the
segment it was reserved in, which is still listed.  Reads may come from any thread:
metadata changes and the read plan are taken under a lock; uploads and object reads run
outside it.

Damage: an object shorter than the metadata says (cut by a faulty copy or disk), or
missing, is damage, not an outage.  ``read`` refuses it (``TierError`` naming the object
and the byte where its data ends); ``read_available`` returns the bytes that are there,
logs the damage at ERROR (once per object and byte) and counts the object
(``damaged_objects``), so a reader can use what survived and skip the rest.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider
from tiered.uploads import Upload, await_uploads

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Segment:
    base: int  # stream position of its first byte
    length: int = 0  # committed bytes
    sealed: bool = False
    objects: list[int] = field(default_factory=list)  # start positions, ascending
    first_at_ms: int = 0  # store time of the first and last data committed (0: none)
    last_at_ms: int = 0
    folds: dict[int, int] = field(default_factory=dict)  # object start -> fold level (>= 1)

    @property
    def end(self) -> int:
        return self.base + self.length

    def object_end(self, k: int) -> int:
        """Where the ``k``-th object's bytes end (the next one's start, or the segment's
        end)."""
        return self.objects[k + 1] if k + 1 < len(self.objects) else self.end

    def path(self, prefix: str, k: int) -> str:
        """The tier path of the ``k``-th object: its start, and its end too for a fold."""
        start = self.objects[k]
        if start in self.folds:
            return fold_path(prefix, self.base, start, self.object_end(k))
        return f"{prefix}/{self.base:020d}/{start:020d}"

    def paths(self, prefix: str) -> list[str]:
        """The tier paths of its objects, in order."""
        return [self.path(prefix, k) for k in range(len(self.objects))]

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if self.folds:  # (absent when none: a metadata without folds reads as before)
            out["folds"] = sorted([start, level] for start, level in self.folds.items())
        else:
            del out["folds"]
        return out

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Segment:
        folds = raw.pop("folds", None) or []
        seg = Segment(**raw)
        seg.folds = {int(start): int(level) for start, level in folds}
        return seg


def fold_path(prefix: str, base: int, start: int, end: int) -> str:
    """Where the fold of segment ``base``'s bytes ``[start, end)`` lives."""
    return f"{prefix}/{base:020d}/{start:020d}-{end:020d}"


@dataclass(slots=True)
class FlatFileMeta:
    start: int = 0  # first readable position (retention moves it forward)
    segments: list[Segment] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"version": 1, "start": self.start,
                           "segments": [s.to_dict() for s in self.segments]})

    @staticmethod
    def from_json(text: str) -> FlatFileMeta:
        raw = json.loads(text)
        if raw.get("version") != 1:
            raise TierError(f"unknown FlatFile metadata version {raw.get('version')!r}")
        return FlatFileMeta(raw["start"], [Segment.from_dict(s) for s in raw["segments"]])


class FlatFile:
    def __init__(self, provider: Provider, prefix: str, meta: FlatFileMeta | None = None,
                 segment_bytes: int = 1 << 30, upload_timeout_s: float = 30.0,
                 uploader: ThreadPoolExecutor | None = None, segment_ms: int = 0) -> None:
        self._provider = provider
        self.prefix = prefix.rstrip("/")
        self.meta = meta or FlatFileMeta()
        if not self.meta.segments:
            self.meta.segments.append(Segment(self.meta.start))
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms  # also start a new segment after this much time (0: no)
        self.upload_timeout_s = upload_timeout_s
        self._uploader = uploader
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._buffer_first_ms = 0
        self._buffer_last_ms = 0
        self.switches = 0  # segments sealed because an upload failed
        self._lock = threading.Lock()  # metadata changes vs. read plans
        self._uploading: Segment | None = None  # where the reserved upload goes
        self._late: list[Upload] = []  # timed out, maybe still running (owner thread)
        self._damaged: dict[str, set[int]] = {}  # damaged object -> bytes reported

    # ------------------------------------------------------------------ positions

    @property
    def commit_position(self) -> int:
        return self.meta.segments[-1].end

    @property
    def append_position(self) -> int:
        return self.commit_position + self._buffered

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    @property
    def start_position(self) -> int:
        return self.meta.start

    # ------------------------------------------------------------------ writes

    def append(self, data: bytes, at_ms: int = 0, last_at_ms: int = 0) -> int:
        """Buffer ``data`` (stored at ``at_ms``, or from ``at_ms`` to ``last_at_ms``);
        returns the stream position it will have."""
        pos = self.append_position
        if not self._buffer:
            self._buffer_first_ms = at_ms
        self._buffer.append(data)
        self._buffered += len(data)
        self._buffer_last_ms = last_at_ms or at_ms
        return pos

    @property
    def uploading(self) -> bool:
        """An upload is reserved (``begin_commit``) and not finished yet."""
        return self._uploading is not None

    def commit(self) -> bool:
        """Upload the buffer as one object.  True once it is durable (or there was
        nothing to upload); False when the upload failed or timed out, in which case the
        segment was switched and the buffer is kept for the next ``commit``."""
        up = self.begin_commit()
        if up is None:
            return True
        self.start_upload(up)
        await_uploads([up], self.upload_timeout_s)
        return self.finish_commit(up) is True

    def begin_commit(self) -> Upload | None:
        """Reserve the buffer's object at the end of the last segment (a new one when that
        one is sealed, full or spans ``segment_ms``); None when nothing is buffered.  No
        I/O: the caller starts the upload, awaits it, and calls ``finish_commit``, with
        no ``append`` in between."""
        if not self._buffer:
            return None
        data = b"".join(self._buffer)
        with self._lock:
            seg = self.meta.segments[-1]
            if seg.sealed or seg.length >= self.segment_bytes or (
                    self.segment_ms and seg.first_at_ms
                    and self._buffer_last_ms - seg.first_at_ms >= self.segment_ms):
                seg.sealed = True
                seg = self._new_segment()
            self._uploading = seg
            return Upload(self.object_path(seg.base, seg.end), data)

    def start_upload(self, up: Upload) -> None:
        """Start the reserved upload ``up`` (on the uploader pool, if there is one), unless
        a timed-out write of the same path may still land (then it stays not started)."""
        self._late = [u for u in self._late if u.future is not None and not u.future.done()]
        if all(u.path != up.path for u in self._late):
            up.start(self._provider, self._uploader)

    def finish_commit(self, up: Upload, accept: bool = True) -> bool | None:
        """Apply the outcome of the reserved upload ``up``: list it (True), or switch
        segment (False: it failed, timed out, or is durable but ``accept`` is False
        because what it depends on is not), or change nothing (None: it never started)."""
        ok = up.outcome()
        if ok and not accept:
            ok = False
        with self._lock:  # the same section frees the segment for retention
            seg, self._uploading = self._uploading, None
            if seg is None or ok is None:
                return None
            if ok:
                seg.objects.append(seg.end)
                seg.length += len(up.data)
                if not seg.first_at_ms:
                    seg.first_at_ms = self._buffer_first_ms
                seg.last_at_ms = max(seg.last_at_ms, self._buffer_last_ms)
            else:
                seg.sealed = True  # at its committed length; a late success is never read
                self._new_segment()
        if ok:
            self._buffer, self._buffered = [], 0
        else:
            self.switches += 1
            if up.future is not None and not up.future.done():
                self._late.append(up)
        return ok

    def _new_segment(self) -> Segment:
        seg = Segment(self.commit_position)
        self.meta.segments.append(seg)
        return seg

    def object_path(self, segment_base: int, start: int) -> str:
        return f"{self.prefix}/{segment_base:020d}/{start:020d}"

    # ------------------------------------------------------------------ reads

    def read(self, position: int, length: int) -> bytes:
        """Committed bytes ``[position, position + length)``, short at the commit
        position; ``TierError`` for a position before the start or a damaged object."""
        out: list[bytes] = []
        plan = self._plan(position, length)
        for (path, offset, take), chunk in zip(plan, _fetch(self._provider, plan, False),
                                               strict=True):
            if len(chunk) != take:
                raise TierError(f"object {path} is shorter than its metadata says: its data "
                                f"ends at byte {offset + len(chunk)}, {offset + take} expected")
            out.append(chunk)
        return b"".join(out)

    def read_available(self, position: int, length: int) -> list[tuple[int, bytes]]:
        """Like ``read``, but a short or missing object gives what it still holds: the
        result is ``(stream position, bytes)`` pieces in order, with a hole wherever
        data is missing.  Each damage is logged at ERROR once, each object counted once;
        ``TierUnavailable`` (an outage, not damage) still raises."""
        runs: list[tuple[int, list[bytes]]] = []  # contiguous runs of chunks
        pos = run_end = position
        plan = self._plan(position, length)
        for (path, offset, take), chunk in zip(plan, _fetch(self._provider, plan, True),
                                               strict=True):
            if len(chunk) != take:
                self._report_short(path, offset + len(chunk) if chunk else None,
                                   offset + take)
            if chunk:
                if runs and run_end == pos:
                    runs[-1][1].append(chunk)
                else:
                    runs.append((pos, [chunk]))
                run_end = pos + len(chunk)
            pos += take
        return [(start, b"".join(chunks)) for start, chunks in runs]

    def locate(self, position: int) -> tuple[str, int]:
        """The object holding stream ``position`` and the byte offset inside it."""
        plan = self._plan(position, 1)
        if not plan:
            raise TierError(f"position {position} of {self.prefix} is not committed")
        path, offset, _ = plan[0]
        return path, offset

    def report_damage(self, position: int, reason: str) -> str:
        """Record damage a reader found in the bytes at ``position`` (a record that
        fails its check): logged at ERROR with the object and byte (once), the object
        counted once.  Returns the ``path at byte N`` description."""
        try:
            path, offset = self.locate(position)
        except TierError:  # expired meanwhile
            return f"{self.prefix} at stream position {position}"
        where = f"{path} at byte {offset}"
        if self._first_damage(path, offset):
            log.error("damaged tier object %s: %s", where, reason)
        return where

    def _report_short(self, path: str, have: int | None, want: int) -> None:
        """Report an object that ends at byte ``have`` (None: somewhere before the read;
        asked for) although the metadata says it holds ``want`` bytes or more."""
        if have is None:
            try:
                have = self._provider.size(path)
            except TierNotFound:
                have = -1
        if not self._first_damage(path, have):
            return
        if have < 0:
            log.error("damaged tier object %s: it is missing although the metadata lists "
                      "it (at least %d bytes); its data is skipped", path, want)
        else:
            log.error("damaged tier object %s: its data ends at byte %d but the metadata "
                      "says it holds at least %d bytes; what follows is skipped", path,
                      have, want)

    def _first_damage(self, path: str, offset: int) -> bool:
        """Note damage at byte ``offset`` of ``path``; False if it was noted before."""
        with self._lock:
            seen = self._damaged.setdefault(path, set())
            if offset in seen:
                return False
            seen.add(offset)
            return True

    @property
    def damaged_objects(self) -> int:
        """Objects found short, missing or holding a bad record (since start)."""
        with self._lock:
            return len(self._damaged)

    def _plan(self, position: int, length: int) -> list[tuple[str, int, int]]:
        """The object reads (path, offset in object, length) that cover the range."""
        with self._lock:
            if position < self.meta.start:
                raise TierError(f"position {position} of {self.prefix} is before its start "
                                f"{self.meta.start} (expired)")
            end = min(position + length, self.commit_position)
            plan: list[tuple[str, int, int]] = []
            pos = position
            segs = self.meta.segments
            i = max(0, bisect.bisect_right([s.base for s in segs], pos) - 1)
            while pos < end and i < len(segs):
                seg = segs[i]
                if pos >= seg.end:
                    i += 1
                    continue
                k = bisect.bisect_right(seg.objects, pos) - 1
                obj_start = seg.objects[k]
                take = min(end, seg.object_end(k)) - pos
                plan.append((seg.path(self.prefix, k), pos - obj_start, take))
                pos += take
            return plan

    # ------------------------------------------------------------------ retention

    def expire_before(self, position: int) -> list[str]:
        """Drop whole segments that end at or before ``position`` from the metadata;
        returns their object paths, for the caller to delete once it has persisted the
        metadata (a crash in between leaves orphans, never a listed object that is gone).
        Any thread: the last segment is sealed (all of it goes) only while no upload is
        reserved in it; else it stays until a later pass."""
        doomed: list[str] = []
        with self._lock:
            last = self.meta.segments[-1]
            if last.length and last.end <= position and self._uploading is None:
                last.sealed = True
                self._new_segment()
            while len(self.meta.segments) > 1 and self.meta.segments[0].end <= position:
                seg = self.meta.segments.pop(0)
                self.meta.start = self.meta.segments[0].base
                doomed += seg.paths(self.prefix)
        return doomed

    def segments_ending_by(self, position: int) -> int:
        """The stream position that ends the leading run of segments wholly below
        ``position`` (for retention by position; see ``expire_before``)."""
        with self._lock:
            end = self.meta.start
            for seg in self.meta.segments:
                if seg.end > position:
                    break
                end = seg.end
            return end

    def segments_before(self, at_ms: int) -> int:
        """The stream position that ends the leading run of segments whose data is all
        older than ``at_ms`` (for retention by time; see ``expire_before``)."""
        with self._lock:
            position = self.meta.start
            for seg in self.meta.segments:
                if seg.length and seg.last_at_ms >= at_ms:
                    break
                position = seg.end
            return position

    # ------------------------------------------------------------------ folds

    def segments(self) -> list[Segment]:
        """A copy of the segments, as listed now (``tiered.fold`` plans with it)."""
        with self._lock:
            return [replace(s, objects=list(s.objects), folds=dict(s.folds))
                    for s in self.meta.segments]

    def fold(self, base: int, starts: list[int], end: int, level: int) -> list[str] | None:
        """List one fold object (written by the caller) in place of the consecutive
        objects ``starts`` of segment ``base``, which end at ``end``; returns the paths
        they had, for the caller to delete once no reader can be directed to them.  None,
        changing nothing, when they are no longer listed so (expired meanwhile).  Any
        thread: a fold never touches the object an upload is reserved for."""
        with self._lock:
            seg = next((s for s in self.meta.segments if s.base == base), None)
            if seg is None or not starts:
                return None
            k = bisect.bisect_left(seg.objects, starts[0])
            j = k + len(starts)
            if seg.objects[k:j] != starts or seg.object_end(j - 1) != end:
                return None
            old = [seg.path(self.prefix, i) for i in range(k, j)]
            for start in starts:
                seg.folds.pop(start, None)
            del seg.objects[k + 1 : j]
            seg.folds[starts[0]] = level
            return old

    def to_json(self) -> str:
        with self._lock:
            return self.meta.to_json()


READ_THREADS = 16  # one read of many objects fetches this many at once
_pools: dict[str, ThreadPoolExecutor] = {}  # name -> readers (``readers``)
_pools_lock = threading.Lock()
_local = threading.local()  # .pool: this thread's readers, if not the shared ones


def readers(name: str = "tier-read") -> ThreadPoolExecutor:
    """The pool of ``READ_THREADS`` object readers called ``name``, made at its first
    use: "tier-read", the shared one; another for work that must not queue ahead of it
    (``reading_on``)."""
    with _pools_lock:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = ThreadPoolExecutor(READ_THREADS, thread_name_prefix=name)
        return pool


@contextmanager
def reading_on(pool: ThreadPoolExecutor) -> Iterator[None]:
    """Reads of many objects this thread makes inside the block fetch on ``pool``, not
    on the shared readers: work in the background (a takeover's indexing of recent ids,
    ``tiered.mountindex``) does not queue ahead of reads a client waits for (the same
    takeover's replay of the journal)."""
    before = getattr(_local, "pool", None)
    _local.pool = pool
    try:
        yield
    finally:
        _local.pool = before


def _fetch(provider: Provider, plan: list[tuple[str, int, int]], missing_ok: bool
           ) -> list[bytes]:
    """The ranges of ``plan``, in order; several objects at once (a stream of many small
    upload batches is one round trip per ``READ_THREADS`` objects, not one per object).
    ``missing_ok``: an object gone from the tier reads as b"" (damage, reported by the
    caller) instead of raising."""

    def one(step: tuple[str, int, int]) -> bytes:
        try:
            return provider.read(*step)
        except TierNotFound:
            if missing_ok:
                return b""
            raise

    if len(plan) <= 1:
        return [one(step) for step in plan]
    pool: ThreadPoolExecutor | None = getattr(_local, "pool", None)
    return list((pool or readers()).map(one, plan))
