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
from collections.abc import Iterator
from dataclasses import dataclass

from store.message import HEADER, RecordError, check_record, decode_properties
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
                 selection: Selection = Selection()) -> Iterator[dict[str, list[object]]]:
    """The selected records of the slice as columns (``COLUMNS``), one batch per
    object.  A damaged record raises ``TierError`` naming the object and position."""
    start, end, want_key = selection.start_ms, selection.end_ms, selection.key
    unpack = HEADER.unpack_from
    for path, length in zip(s.paths, s.lengths, strict=True):
        data = provider.read(path, 0, length)
        if len(data) != length:
            raise TierError(f"object {path} is shorter than its metadata says")
        cols: dict[str, list[object]] = {c: [] for c in COLUMNS}
        (c_topic, c_qid, c_qo, c_id, c_key, c_tag, c_born, c_store, c_deliver, c_props,
         c_body) = (cols[c] for c in COLUMNS)
        view = memoryview(data)
        pos = 0
        while pos < length:
            try:
                total = check_record(data, pos)
            except RecordError as exc:
                raise TierError(f"object {path}: bad record at byte {pos}: {exc}") from exc
            (_, _, _, _, qid, qo, born, store, deliver, _, id_len, topic_len, key_len,
             tag_len, props_len, body_len) = unpack(data, pos)
            rec_end = pos + total
            if (start and store < start) or (end and store >= end):
                pos = rec_end
                continue
            p = pos + HEADER.size + id_len + topic_len
            key = bytes(view[p : p + key_len]).decode()
            if want_key and key != want_key:
                pos = rec_end
                continue
            c_id.append(bytes(view[pos + HEADER.size : pos + HEADER.size + id_len]).decode())
            c_topic.append(s.topic)
            c_qid.append(qid)
            c_qo.append(qo)
            c_key.append(key)
            p += key_len
            c_tag.append(bytes(view[p : p + tag_len]).decode())
            p += tag_len
            c_props.append(list(decode_properties(view[p : p + props_len]).items())
                           if props_len else [])
            p += props_len
            c_body.append(bytes(view[p : p + body_len]))
            c_born.append(born)
            c_store.append(store)
            c_deliver.append(deliver)
            pos = rec_end
        if c_id:
            yield cols
