"""Scanning the tiered store in bulk (the Spark data source's codec, plain Python).

``plan`` turns the tier's queue metadata (``<broker>/meta/<topic>/<queue>.json``, the
copy the tiered dispatcher keeps beside the data) into slices: runs of whole log objects
of one segment, at most ``max_slice_bytes`` each, skipping segments whose store times
fall outside the wanted range; ``tier_prefixes`` finds the prefixes holding such
metadata (the brokers in the tier).  ``decode_slice`` reads a slice's objects (one ranged
read each) and decodes their records, CRC-checked, into columns.  Slices are small
picklable values, so Spark can ship them to executors, which open their own provider.

Damage never stops a scan; it is reported through ``on_damage`` (default: logged at
ERROR), one ``Damage`` per object, and the scan goes on with what is intact:

- a record that fails its check (magic, size, CRC) costs that record only: the scan
  resyncs at the next position holding a record that passes its check (a magic, then a
  matching CRC);
- a record that passes its CRC but whose fields do not parse (lengths that overrun it,
  strings that are not UTF-8, properties that overrun) costs that record only;
- an object shorter than the metadata says gives every whole record before the cut;
- an object listed but missing or unreadable is skipped;
- a queue metadata copy that does not parse skips that queue (its layout is unknown).

A tier that cannot be reached (``TierUnavailable``) is an outage, not damage: it raises.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store.message import HEADER, HEADER_PREFIX, RECORD_MAGIC, RecordError, check_record
from tiered.carried import LEASES, carried, lease_path, meta_prefix, read_meta
from tiered.errors import TierError, TierNotFound, TierUnavailable
from tiered.flatfile import FlatFileMeta
from tiered.provider import Provider

SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("message_id", pa.string()), ("key", pa.string()), ("tag", pa.string()),
    ("born_at_ms", pa.int64()), ("store_at_ms", pa.int64()), ("deliver_at_ms", pa.int64()),
    ("properties", pa.map_(pa.string(), pa.string())), ("body", pa.binary()),
])
COLUMNS = tuple(SCHEMA.names)
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "big")
_MAX_PROBLEMS = 3  # problems spelled out per damaged object; the rest are counted

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Damage:
    """A tier object the scan could not read in full: its path and what was wrong (the
    bytes skipped and why)."""

    path: str
    reason: str


OnDamage = Callable[[Damage], None]


def log_damage(damage: Damage) -> None:
    log.error("damaged tier object %s: %s", damage.path, damage.reason)


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
         max_slice_bytes: int = 64 << 20,
         on_damage: OnDamage = log_damage) -> list[ScanSlice]:
    """The slices that may hold selected messages, oldest first per queue.  A queue whose
    metadata copy does not parse is reported and left out."""
    slices: list[ScanSlice] = []
    prefix = meta_prefix(broker)
    try:
        lease = carried(provider, broker)  # first: see ``tiered.carried``
    except TierUnavailable:
        raise
    except TierError as exc:
        on_damage(Damage(lease_path(broker), f"{exc}: the metadata it carries is not "
                                             "scanned (only the queues' copies)"))
        lease = {}
    for path in sorted(set(provider.list(prefix)) | set(lease)):
        topic, _, name = path[len(prefix):].rpartition("/")
        if not name.endswith(".json") or (selection.topics and topic not in selection.topics):
            continue
        try:
            meta = read_meta(provider, path, lease)
            if meta is None:
                continue  # deleted since the listing (its topic was)
            raw = json.loads(meta)
            log = FlatFileMeta.from_json(raw["log"])
            generation, qid = int(raw["generation"]), int(name[:-5])
        except TierNotFound:
            continue  # deleted since the listing (its topic was)
        except TierUnavailable:
            raise
        except (TierError, ValueError, KeyError, TypeError, AttributeError) as exc:
            on_damage(Damage(path, f"the tiered queue metadata is unreadable ({exc}): the "
                                   "queue's records are not scanned"))
            continue
        base = f"{broker}/data/{topic}/{generation}/{qid}/log"
        for seg in log.segments:
            if not seg.length or not selection.overlaps(seg.first_at_ms, seg.last_at_ms):
                continue
            run: list[tuple[str, int]] = []
            for k, start in enumerate(seg.objects):
                size = seg.object_end(k) - start
                if run and sum(n for _, n in run) + size > max_slice_bytes:
                    slices.append(_slice(topic, qid, generation, run, seg.first_at_ms,
                                         seg.last_at_ms))
                    run = []
                run.append((seg.path(base, k), size))
            if run:
                slices.append(_slice(topic, qid, generation, run, seg.first_at_ms,
                                     seg.last_at_ms))
    return slices


def tier_prefixes(provider: Provider, start: str = "") -> list[str]:
    """The tier prefixes, among the paths that begin with ``start``, holding tiered queue
    metadata (``<prefix>/meta/<topic>/<queue>.json``, what ``plan`` reads): the brokers
    (their incarnations) whose uploads the tier holds, sorted.  It lists every object
    under ``start`` (on S3, a request per 1,000), and the leases of brokers named so
    that carry queue metadata whose copy is not in yet (``tiered.carried``)."""
    found: set[str] = set()
    for path in provider.list(start):
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "meta" and parts[3].endswith(".json"):
            found.add(parts[0])
    for path in provider.list(LEASES + start):
        broker = path[len(LEASES):].removesuffix(".json")
        if broker in found or not path.endswith(".json") or "/" in broker:
            continue
        try:
            if carried(provider, broker):
                found.add(broker)
        except TierNotFound:
            continue
        except TierUnavailable:
            raise
        except TierError as exc:
            log.warning("%s", exc)
    return sorted(found)


def _slice(topic: str, qid: int, generation: int, run: list[tuple[str, int]],
           first_ms: int, last_ms: int) -> ScanSlice:
    return ScanSlice(topic, qid, generation, tuple(p for p, _ in run),
                     tuple(n for _, n in run), first_ms, last_ms)


def decode_slice(provider: Provider, s: ScanSlice, selection: Selection = Selection(),
                 on_damage: OnDamage = log_damage) -> Iterator[pa.RecordBatch]:
    """The selected records of the slice as Arrow record batches (``SCHEMA``), one per
    object.  Every record's magic, size and CRC are checked; damage is reported through
    ``on_damage`` (one ``Damage`` per object) and skipped."""
    for path, length in zip(s.paths, s.lengths, strict=True):
        try:
            data = provider.read(path, 0, length)
        except TierNotFound:
            on_damage(Damage(path, f"it is missing although the metadata lists it "
                                   f"({length} bytes): its records are skipped"))
            continue
        except TierUnavailable:
            raise
        except TierError as exc:
            on_damage(Damage(path, f"it is unreadable ({exc}): its records are skipped"))
            continue
        problems = [] if len(data) == length else [
            f"its data ends at byte {len(data)} but the metadata says {length}"]
        batch = _decode(data, s.topic, selection, problems)
        _report(path, problems, on_damage)
        if batch.num_rows:
            yield batch


def decode_object(data: bytes, topic: str, path: str = "",
                  selection: Selection = Selection(),
                  on_damage: OnDamage = log_damage) -> pa.RecordBatch:
    """One log object's records (whole records, back to back) as a record batch; the
    damaged ones are reported (one ``Damage`` for the object) and left out."""
    problems: list[str] = []
    batch = _decode(data, topic, selection, problems)
    _report(path, problems, on_damage)
    return batch


def _report(path: str, problems: list[str], on_damage: OnDamage) -> None:
    if problems:
        more = len(problems) - _MAX_PROBLEMS
        on_damage(Damage(path, "; ".join(problems[:_MAX_PROBLEMS])
                         + (f"; and {more} more bad stretch(es)" if more > 0 else "")))


def _decode(data: bytes, topic: str, selection: Selection,
            problems: list[str]) -> pa.RecordBatch:
    """The intact records of ``data``; what is damaged goes to ``problems``.  The fields
    are decoded column-wise for all records at once; should a record that passed its
    CRC still not parse, the records are decoded one by one to leave out only it."""
    starts = _record_starts(data, problems)
    found: list[str] = []
    try:
        batch = _columns(data, starts, topic, selection, found)
        problems += found
        return batch
    except (TierError, pa.ArrowInvalid):
        pass
    parts = []
    for at in starts:
        try:
            parts.append(_columns(data, [at], topic, selection, problems))
        except (TierError, pa.ArrowInvalid) as exc:
            problems.append(f"record at byte {at} passed its CRC but does not parse: {exc}")
    return pa.concat_batches(parts) if parts else pa.RecordBatch.from_pylist([], SCHEMA)


def _record_starts(data: bytes, problems: list[str]) -> list[int]:
    """Where each intact record starts, checking magic, size and CRC (the only
    per-record Python; the fields are then read column-wise with numpy).  After a bad
    record, the scan goes on at the next record that passes its check."""
    view = memoryview(data)
    length, hsize, crc32, magic_ok = len(data), HEADER.size, zlib.crc32, RECORD_MAGIC
    prefix = HEADER_PREFIX.unpack_from
    starts: list[int] = []
    append = starts.append
    pos = 0
    while pos < length:
        if length - pos >= hsize:
            magic, total, crc = prefix(data, pos)
            end = pos + total
            if magic == magic_ok and total >= hsize and end <= length \
                    and crc32(view[pos + 12 : end]) == crc:
                append(pos)
                pos = end
                continue
        nxt = _resync(data, pos, problems)
        if nxt < 0:
            break
        pos = nxt
    return starts


def _resync(data: bytes, pos: int, problems: list[str]) -> int:
    """Note the bad record at ``pos``; the next position holding a record that passes
    its check, or -1."""
    try:
        check_record(data, pos)
        why = "bad record"  # not reached: the caller found it bad
    except RecordError as exc:
        why = str(exc)
    nxt = data.find(_MAGIC_BYTES, pos + 1)
    while nxt >= 0:
        try:
            check_record(data, nxt)
            break
        except RecordError:
            nxt = data.find(_MAGIC_BYTES, nxt + 1)
    skipped = (nxt if nxt >= 0 else len(data)) - pos
    problems.append(f"bad record at byte {pos} ({why}): {skipped} bytes skipped"
                    + (" to the next valid record" if nxt >= 0 else ", to the end"))
    return nxt


def _columns(data: bytes, record_starts: list[int], topic: str, selection: Selection,
             problems: list[str]) -> pa.RecordBatch:
    """The records starting at ``record_starts`` (each passed its CRC) as columns;
    records whose field lengths do not add up to their size go to ``problems``."""
    starts = np.asarray(record_starts, dtype=np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    n = len(starts)
    h = raw[starts[:, None] + np.arange(HEADER.size)].view(_HEADER_DTYPE).reshape(n)
    id_len = h["id_len"].astype(np.int64)
    key_len = h["key_len"].astype(np.int64)
    tag_len = h["tag_len"].astype(np.int64)
    props_len = h["props_len"].astype(np.int64)
    body_len = h["body_len"].astype(np.int64)
    fits = (HEADER.size + id_len + h["topic_len"] + key_len + tag_len + props_len
            + body_len) == h["total"]
    keep = fits.copy()
    for at in starts[~fits]:
        problems.append(f"record at byte {at} passed its CRC but its fields overrun it")
    store = h["store"].astype(np.int64)
    if selection.start_ms:
        keep &= store >= selection.start_ms
    if selection.end_ms:
        keep &= store < selection.end_ms
    id_at = starts + HEADER.size
    key_at = id_at + id_len + h["topic_len"]
    tag_at = key_at + key_len
    props_at = tag_at + tag_len
    body_at = props_at + props_len
    if not keep.all():  # before any gather: a record that does not fit is never read
        idx = np.flatnonzero(keep)
        h, store = h[idx], store[idx]
        id_at, id_len, key_at, key_len = id_at[idx], id_len[idx], key_at[idx], key_len[idx]
        tag_at, tag_len = tag_at[idx], tag_len[idx]
        props_at, props_len = props_at[idx], props_len[idx]
        body_at, body_len = body_at[idx], body_len[idx]
    keys = _gather(raw, key_at, key_len, pa.string())
    if selection.key:
        wanted = np.asarray(pc.equal(keys, selection.key).fill_null(False))
        if not wanted.all():
            idx = np.flatnonzero(wanted)
            h, store, keys = h[idx], store[idx], keys.take(pa.array(idx))
            id_at, id_len, tag_at, tag_len = id_at[idx], id_len[idx], tag_at[idx], tag_len[idx]
            props_at, props_len = props_at[idx], props_len[idx]
            body_at, body_len = body_at[idx], body_len[idx]
    m = len(store)
    props = _properties(raw, props_at, props_len)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * m, pa.string()) if m else pa.array([], pa.string()),
        pa.array(h["queue_id"].astype(np.int32)),
        pa.array(h["queue_offset"].astype(np.int64)),
        _gather(raw, id_at, id_len, pa.string()),
        keys,
        _gather(raw, tag_at, tag_len, pa.string()),
        pa.array(h["born"].astype(np.int64)),
        pa.array(store),
        pa.array(h["deliver"].astype(np.int64)),
        pa.array(props, pa.map_(pa.string(), pa.string())),
        _gather(raw, body_at, body_len, pa.binary()),
    ], schema=SCHEMA)


def _gather(raw: np.ndarray, at: np.ndarray, lengths: np.ndarray,
            kind: pa.DataType) -> pa.Array:
    """The byte ranges ``raw[at[i] : at[i] + lengths[i]]`` as one Arrow array (a
    vectorised gather into a contiguous value buffer)."""
    n = len(at)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        index = np.repeat(at - offsets[:-1], lengths) + np.arange(total)
        values = raw[index].tobytes()
    else:
        values = b""
    arr = pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets.tobytes()),
                                          pa.py_buffer(values)])
    if kind == pa.string():
        arr.validate(full=True)  # UTF-8 checked, as a decode would
    return arr


_HEADER_DTYPE = np.dtype([
    ("magic", ">u4"), ("total", ">u4"), ("crc", ">u4"), ("flags", ">u2"),
    ("queue_id", ">u2"), ("queue_offset", ">u8"), ("born", ">u8"), ("store", ">u8"),
    ("deliver", ">u8"), ("attempt", ">u4"), ("id_len", "u1"), ("topic_len", ">u2"),
    ("key_len", ">u2"), ("tag_len", ">u2"), ("props_len", ">u4"), ("body_len", ">u4"),
])
assert _HEADER_DTYPE.itemsize == HEADER.size


def _properties(raw: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Each row's encoded properties (``store.message.encode_properties``: u16 key length,
    key, u32 value length, value, repeated) as a map array, parsed a property at a time
    across all rows at once."""
    n = len(at)
    pos, end = at.copy(), at + lengths
    rows, key_at, key_len, val_at, val_len = [], [], [], [], []
    active = np.flatnonzero(pos < end)
    while len(active):
        p = pos[active]
        if np.any(p + 6 > end[active]):
            raise TierError("properties overrun their length")
        klen = (raw[p].astype(np.int64) << 8) | raw[p + 1]
        v = p + 2 + klen
        if np.any(v + 4 > end[active]):
            raise TierError("properties overrun their length")
        vlen = ((raw[v].astype(np.int64) << 24) | (raw[v + 1].astype(np.int64) << 16)
                | (raw[v + 2].astype(np.int64) << 8) | raw[v + 3])
        rows.append(active)
        key_at.append(p + 2)
        key_len.append(klen)
        val_at.append(v + 4)
        val_len.append(vlen)
        pos[active] = v + 4 + vlen
        if np.any(pos[active] > end[active]):
            raise TierError("properties overrun their length")
        active = active[pos[active] < end[active]]
    counts = np.zeros(n + 1, dtype=np.int32)
    if rows:
        row = np.concatenate(rows)
        order = np.argsort(row, kind="stable")  # row-major, properties in stored order
        np.cumsum(np.bincount(row, minlength=n), out=counts[1:])
        keys = _gather(raw, np.concatenate(key_at)[order], np.concatenate(key_len)[order],
                       pa.string())
        values = _gather(raw, np.concatenate(val_at)[order], np.concatenate(val_len)[order],
                         pa.string())
    else:
        keys = values = pa.array([], pa.string())
    return pa.MapArray.from_arrays(pa.array(counts), keys, values)
