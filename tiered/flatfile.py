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
"""

from __future__ import annotations

import bisect
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field

from tiered.errors import TierError, TierUnavailable
from tiered.provider import Provider


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
        position; ``TierError`` for a position before the start."""
        out: list[bytes] = []
        for path, offset, take in self._plan(position, length):
            chunk = self._provider.read(path, offset, take)
            if len(chunk) != take:
                raise TierError(f"object {path} is shorter than its metadata says")
            out.append(chunk)
        return b"".join(out)

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
