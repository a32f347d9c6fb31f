"""Scanning the tiered store in bulk (the Spark data source's codec, plain Python).

``plan`` turns the tier's queue metadata (``<broker>/meta/<topic>/<queue>.json``, the
copy the tiered dispatcher keeps beside the data) into slices: runs of whole log objects
of one segment, at most ``max_slice_bytes`` each, skipping segments whose store times
fall outside the wanted range.  ``decode_slice`` reads a slice's objects (one ranged read
each) and decodes their records, CRC-checked, into columns.  Slices are small picklable
values, so Spark can ship them to executors, which open their own provider.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from store.message import HEADER, RECORD_MAGIC
from tiered.errors import TierError
from tiered.flatfile import FlatFileMeta
from tiered.provider import Provider

COLUMNS = ("topic", "queue_id", "queue_offset", "message_id", "key", "tag", "born_at_ms",
           "store_at_ms", "deliver_at_ms", "properties", "body")


@dataclass(frozen=True, slots=True)
class ScanSlice:
    topic: str
    queue_id: int
    generation: int
    paths: tuple[str, ...]  # log objects, in order
    lengths: tuple[int, ...]  # committed bytes of each
    first_at_ms: int
    last_at_ms: int

    @property
    def bytes(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True, slots=True)
class Selection:
    """What a scan keeps: topics (empty: all), store time ``[start_ms, end_ms)``
    (0: open), one key (empty: any)."""

    topics: frozenset[str] = frozenset()
    start_ms: int = 0
    end_ms: int = 0
    key: str = ""

    def overlaps(self, first_ms: int, last_ms: int) -> bool:
        return not ((self.start_ms and last_ms < self.start_ms)
                    or (self.end_ms and first_ms >= self.end_ms))


def plan(provider: Provider, broker: str, selection: Selection,
         max_slice_bytes: int = 64 << 20) -> list[ScanSlice]:
    """The slices that may hold selected messages, oldest first per queue."""
    slices: list[ScanSlice] = []
    prefix = f"{broker}/meta/"
    for path in provider.list(prefix):
        topic, _, name = path[len(prefix):].rpartition("/")
        if not name.endswith(".json") or (selection.topics and topic not in selection.topics):
            continue
        try:
            raw = json.loads(provider.read(path))
            log = FlatFileMeta.from_json(raw["log"])
            generation, qid = int(raw["generation"]), int(name[:-5])
        except (ValueError, KeyError, TypeError) as exc:
            raise TierError(f"tiered queue metadata {path} is unreadable: {exc}") from exc
        base = f"{broker}/data/{topic}/{generation}/{qid}/log"
        for seg in log.segments:
            if not seg.length or not selection.overlaps(seg.first_at_ms, seg.last_at_ms):
                continue
            ends = [*seg.objects[1:], seg.end]
            run: list[tuple[str, int]] = []
            for start, end in zip(seg.objects, ends, strict=True):
                if run and sum(n for _, n in run) + end - start > max_slice_bytes:
                    slices.append(_slice(topic, qid, generation, run, seg.first_at_ms,
                                         seg.last_at_ms))
                    run = []
                run.append((f"{base}/{seg.base:020d}/{start:020d}", end - start))
            if run:
                slices.append(_slice(topic, qid, generation, run, seg.first_at_ms,
                                     seg.last_at_ms))
    return slices


def _slice(topic: str, qid: int, generation: int, run: list[tuple[str, int]],
           first_ms: int, last_ms: int) -> ScanSlice:
    return ScanSlice(topic, qid, generation, tuple(p for p, _ in run),
                     tuple(n for _, n in run), first_ms, last_ms)


def decode_slice(provider: Provider, s: ScanSlice,
                 selection: Selection = Selection()) -> Iterator[dict[str, list[Any]]]:
    """The selected records of the slice as columns (``COLUMNS``), one batch per
    object.  Every record's magic, size and CRC are checked; a damaged one raises
    ``TierError`` naming the object and position."""
    for path, length in zip(s.paths, s.lengths, strict=True):
        data = provider.read(path, 0, length)
        if len(data) != length:
            raise TierError(f"object {path} is shorter than its metadata says")
        rows = _decode_rows(data, path, selection)
        if rows:
            cols = [list(c) for c in zip(*rows, strict=True)]
            yield dict(zip(COLUMNS, [[s.topic] * len(rows), *cols], strict=True))


def _decode_rows(data: bytes, path: str, selection: Selection) -> list[tuple[Any, ...]]:
    """Rows of ``COLUMNS[1:]``; the hot loop, kept flat on purpose."""
    start, end, want_key = selection.start_ms, selection.end_ms, selection.key
    unpack, crc32, hsize, magic_ok = HEADER.unpack_from, zlib.crc32, HEADER.size, RECORD_MAGIC
    view = memoryview(data)
    length = len(data)
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    pos = 0
    while pos < length:
        if length - pos < hsize:
            raise TierError(f"object {path}: bad record at byte {pos}: truncated header")
        (magic, total, crc, _, qid, qo, born, store, deliver, _, id_len, topic_len, key_len,
         tag_len, props_len, body_len) = unpack(data, pos)
        rec_end = pos + total
        if magic != magic_ok or total < hsize or rec_end > length \
                or crc32(view[pos + 12 : rec_end]) != crc:
            raise TierError(f"object {path}: bad record at byte {pos}: bad magic, size "
                            "or CRC")
        if (start and store < start) or (end and store >= end):
            pos = rec_end
            continue
        p = pos + hsize
        mid = data[p : p + id_len].decode("ascii")
        p += id_len + topic_len
        key = data[p : p + key_len].decode()
        if want_key and key != want_key:
            pos = rec_end
            continue
        p += key_len
        tag = data[p : p + tag_len].decode()
        p += tag_len
        props = _properties(data, p, p + props_len) if props_len else []
        p += props_len
        append((qid, qo, mid, key, tag, born, store, deliver, props, data[p : p + body_len]))
        pos = rec_end
    return rows


def _properties(data: bytes, pos: int, end: int) -> list[tuple[str, str]]:
    """``store.message.encode_properties`` read back as (key, value) pairs."""
    out = []
    while pos < end:
        klen = int.from_bytes(data[pos : pos + 2], "big")
        k = data[pos + 2 : pos + 2 + klen].decode()
        pos += 2 + klen
        vlen = int.from_bytes(data[pos : pos + 4], "big")
        out.append((k, data[pos + 4 : pos + 4 + vlen].decode()))
        pos += 4 + vlen
    if pos != end:
        raise TierError("properties overrun their length")
    return out
