"""FlatFile: one append-only byte stream on the tier (a queue's tiered CommitLog or its
tiered ConsumeQueue), stored as segments of immutable objects.

Positions are logical offsets in the stream.  The stream is a list of segments, each
named by the position it starts at; a segment is a sequence of objects, each one upload
batch, named by the position it starts at::

    <prefix>/<segment base:020d>/<object start:020d>

S3 has no append, so an upload never rewrites an object: one batch = one PUT (request
count: one PUT per batch per stream, plus one metadata PUT per commit; see
``FlatFileMeta``).

Two positions: ``append_position`` (bytes accepted into the buffer) and
``commit_position`` (bytes durable in the tier and listed in the metadata).  ``commit``
uploads the buffer as one object.  When that upload fails or times out, the segment is
sealed at its committed length and the buffer goes, unchanged, to a new segment starting
at the commit position (switch-segment): a late success of the failed upload lands in the
sealed segment beyond its sealed length, where no read looks, so nothing is lost and
nothing is read twice.  Appends never wait for the tier.

The metadata (segments, their objects, lengths and times) is the truth for reads; it is
persisted by the owner after each commit (``to_json``/``from_json``).  Writes (append,
commit, expire) come from one owner thread; reads may come from any thread: metadata
changes and the read plan are taken under a lock, uploads and object reads run outside it.

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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field

from tiered.errors import TierError, TierNotFound, TierUnavailable
from tiered.provider import Provider

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Segment:
    base: int  # stream position of its first byte
    length: int = 0  # committed bytes
    sealed: bool = False
    objects: list[int] = field(default_factory=list)  # start positions, ascending
    first_at_ms: int = 0  # store time of the first and last data committed (0: none)
    last_at_ms: int = 0

    @property
    def end(self) -> int:
        return self.base + self.length


@dataclass(slots=True)
class FlatFileMeta:
    start: int = 0  # first readable position (retention moves it forward)
    segments: list[Segment] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"version": 1, "start": self.start,
                           "segments": [asdict(s) for s in self.segments]})

    @staticmethod
    def from_json(text: str) -> FlatFileMeta:
        raw = json.loads(text)
        if raw.get("version") != 1:
            raise TierError(f"unknown FlatFile metadata version {raw.get('version')!r}")
        return FlatFileMeta(raw["start"], [Segment(**s) for s in raw["segments"]])


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

    def commit(self) -> bool:
        """Upload the buffer as one object.  True once it is durable (or there was
        nothing to upload); False when the upload failed or timed out, in which case the
        segment was switched and the buffer is kept for the next ``commit``."""
        if not self._buffer:
            return True
        seg = self.meta.segments[-1]
        if seg.sealed or seg.length >= self.segment_bytes or (
                self.segment_ms and seg.first_at_ms
                and self._buffer_last_ms - seg.first_at_ms >= self.segment_ms):
            with self._lock:
                seg.sealed = True
                seg = self._new_segment()
        data = b"".join(self._buffer)
        path = self.object_path(seg.base, seg.end)
        try:
            self._upload(path, data)
        except TierError:
            with self._lock:
                seg.sealed = True  # at its committed length; a late success is never read
                self._new_segment()
            self.switches += 1
            return False
        with self._lock:
            seg.objects.append(seg.end)
            seg.length += len(data)
            if not seg.first_at_ms:
                seg.first_at_ms = self._buffer_first_ms
            seg.last_at_ms = max(seg.last_at_ms, self._buffer_last_ms)
        self._buffer, self._buffered = [], 0
        return True

    def _upload(self, path: str, data: bytes) -> None:
        if self._uploader is None:
            self._provider.write(path, data)
            return
        fut: Future[None] = self._uploader.submit(self._provider.write, path, data)
        try:
            fut.result(self.upload_timeout_s)
        except FutureTimeout as exc:
            raise TierUnavailable(f"upload of {path} took longer than "
                                  f"{self.upload_timeout_s} s") from exc

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
        for path, offset, take in self._plan(position, length):
            chunk = self._provider.read(path, offset, take)
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
        for path, offset, take in self._plan(position, length):
            try:
                chunk = self._provider.read(path, offset, take)
            except TierNotFound:  # listed in the metadata, gone from the tier
                chunk = b""
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
                obj_end = seg.objects[k + 1] if k + 1 < len(seg.objects) else seg.end
                take = min(end, obj_end) - pos
                plan.append((self.object_path(seg.base, obj_start), pos - obj_start, take))
                pos += take
            return plan

    # ------------------------------------------------------------------ retention

    def expire_before(self, position: int) -> list[str]:
        """Drop whole segments that end at or before ``position`` from the metadata;
        returns their object paths, for the caller to delete once it has persisted the
        metadata (a crash in between leaves orphans, never a listed object that is gone).
        The owner thread calls it (it may seal the last segment)."""
        doomed: list[str] = []
        with self._lock:
            last = self.meta.segments[-1]
            if last.length and last.end <= position:  # all of it goes: seal, start anew
                last.sealed = True
                self._new_segment()
            while len(self.meta.segments) > 1 and self.meta.segments[0].end <= position:
                seg = self.meta.segments.pop(0)
                self.meta.start = self.meta.segments[0].base
                doomed += [self.object_path(seg.base, start) for start in seg.objects]
        return doomed

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

    def to_json(self) -> str:
        with self._lock:
            return self.meta.to_json()
