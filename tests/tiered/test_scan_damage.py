"""Damaged tier objects in the bulk scan (``tiered.scan``, no Spark): a record that fails
its check costs only that record (the scan resyncs at the next valid record), a cut
object gives every record before the cut, a missing, unreadable or garbage object is
skipped, a damaged queue metadata copy skips that queue; each is reported once per
object (name and reason) and the scan goes on.  An outage still raises.  Real local and
S3 providers (a closed port for the outage)."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from store.clock import ManualClock
from store.message import Message, encode_record
from tests.tiered.test_scan import _tiered
from tiered.errors import TierUnavailable
from tiered.providers.local import LocalProvider
from tiered.providers.s3 import S3Provider, S3Settings
from tiered.scan import Damage, ScanSlice, Selection, decode_object, decode_slice, plan


def _scan(provider: Any, broker: str = "b0") -> tuple[list[dict[str, Any]], list[Damage]]:
    """Every row the scan delivers, and the damage it reported."""
    damaged: list[Damage] = []
    rows = [r for s in plan(provider, broker, Selection(), on_damage=damaged.append)
            for b in decode_slice(provider, s, on_damage=damaged.append)
            for r in b.to_pylist()]
    return rows, damaged


def _objects(provider: LocalProvider, topic: str = "a") -> list[tuple[str, int]]:
    return [(p, n) for s in plan(provider, "b0", Selection(frozenset({topic})))
            for p, n in zip(s.paths, s.lengths, strict=True)]


def _records(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record of an intact object."""
    out, pos = [], 0
    while pos < len(data):
        total = struct.unpack_from(">I", data, pos + 4)[0]
        out.append((pos, pos + total))
        pos += total
    return out


def test_a_flipped_byte_costs_only_its_record(tmp_path: Path,
                                              manual_clock: ManualClock) -> None:
    # Given a tier of 61 records and one object of five with its third record damaged
    _, provider, _ = _tiered(tmp_path, manual_clock)
    before, _ = _scan(provider)
    path, _ = _objects(provider)[5]
    file = tmp_path / "tier" / path
    data = bytearray(file.read_bytes())
    start, end = _records(bytes(data))[2]
    lost = decode_object(bytes(data[start:end]), "a").to_pylist()[0]["message_id"]
    data[start + 100] ^= 0x5A
    file.write_bytes(bytes(data))
    # When the whole tier is scanned
    rows, damaged = _scan(provider)
    # Then only that record is missing, and the object is reported once, with the byte
    assert len(before) == 61
    assert sorted(r["message_id"] for r in rows) == sorted(
        r["message_id"] for r in before if r["message_id"] != lost)
    assert [d.path for d in damaged] == [path]
    assert f"bad record at byte {start}" in damaged[0].reason
    assert "CRC mismatch" in damaged[0].reason


def test_any_single_flipped_byte_costs_exactly_the_record_holding_it(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    _, provider, _ = _tiered(tmp_path, manual_clock)
    path, n = _objects(provider)[0]
    data = provider.read(path, 0, n)
    ids = [r["message_id"] for r in decode_object(data, "a").to_pylist()]
    bounds = _records(data)
    for pos in range(len(data)):
        hit = next(i for i, (s, e) in enumerate(bounds) if s <= pos < e)
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        damaged: list[Damage] = []
        got = decode_object(bytes(flipped), "a", path, on_damage=damaged.append)
        assert got.column("message_id").to_pylist() == ids[:hit] + ids[hit + 1:], pos
        assert [d.path for d in damaged] == [path], pos


def test_a_cut_object_gives_every_record_before_the_cut(tmp_path: Path,
                                                        manual_clock: ManualClock) -> None:
    # every length the object can be cut to, read through the provider and the plan
    _, provider, _ = _tiered(tmp_path, manual_clock)
    s = plan(provider, "b0", Selection(frozenset({"a"})))[0]
    path, n = s.paths[0], s.lengths[0]
    file = tmp_path / "tier" / path
    data = file.read_bytes()
    ids = [r["message_id"] for r in decode_object(data, "a").to_pylist()]
    ends = [e for _, e in _records(data)]
    for cut in range(n + 1):
        file.write_bytes(data[:cut])
        damaged: list[Damage] = []
        rows = [r for b in decode_slice(provider, s, on_damage=damaged.append)
                for r in b.to_pylist()]
        whole = sum(1 for e in ends if e <= cut)
        assert [r["message_id"] for r in rows if r["message_id"] in ids] == ids[:whole], cut
        assert len(rows) == len(ids) * len(s.paths) - len(ids) + whole, cut
        if cut == n:
            assert damaged == []
        else:
            assert [d.path for d in damaged] == [path], cut
            assert f"its data ends at byte {cut} but the metadata says {n}" in \
                damaged[0].reason


def test_missing_unreadable_and_garbage_objects_are_skipped(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given three damaged objects of topic a: gone, a directory (unreadable), random bytes
    _, provider, _ = _tiered(tmp_path, manual_clock)
    before, _ = _scan(provider)
    objects = _objects(provider)
    lost: set[str] = set()
    for path, n in (objects[1], objects[4], objects[7]):
        lost |= {r["message_id"] for r in decode_object(provider.read(path, 0, n), "a")
                 .to_pylist()}
    gone, unreadable, garbage = objects[1][0], objects[4][0], objects[7][0]
    os.unlink(tmp_path / "tier" / gone)
    os.unlink(tmp_path / "tier" / unreadable)
    os.mkdir(tmp_path / "tier" / unreadable)
    (tmp_path / "tier" / garbage).write_bytes(random.Random(7).randbytes(objects[7][1]))
    # When scanned
    rows, damaged = _scan(provider)
    # Then every other record is there, and the three are reported with their reasons
    assert len(lost) == 15
    assert sorted(r["message_id"] for r in rows) == sorted(
        r["message_id"] for r in before if r["message_id"] not in lost)
    why = {d.path: d.reason for d in damaged}
    assert sorted(why) == sorted([gone, unreadable, garbage])
    assert "missing" in why[gone]
    assert "unreadable" in why[unreadable]
    assert "bad record at byte 0" in why[garbage]


def test_a_damaged_queue_metadata_copy_skips_that_queue_only(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    _, provider, _ = _tiered(tmp_path, manual_clock)
    meta = "b0/meta/b/0.json"
    (tmp_path / "tier" / meta).write_text('{"generation": 0, "log": {"segm')
    rows, damaged = _scan(provider)
    assert len(rows) == 60 and {r["topic"] for r in rows} == {"a"}
    assert [d.path for d in damaged] == [meta]
    assert "queue metadata" in damaged[0].reason
    # a copy that is valid JSON but not metadata is damage too
    (tmp_path / "tier" / meta).write_text(json.dumps({"generation": "x"}))
    assert [d.path for d in _scan(provider)[1]] == [meta]


def _crc_valid(record: bytearray) -> bytes:
    """``record`` with its CRC recomputed (damage that the CRC cannot see)."""
    struct.pack_into(">I", record, 8, zlib.crc32(record[12:]))
    return bytes(record)


def test_records_with_a_valid_crc_but_bad_fields_are_dropped() -> None:
    # records that pass magic, size and CRC but whose fields do not parse: lengths
    # that overrun the record, a key that is not UTF-8, properties that overrun
    good = [encode_record(Message(f"id{i}", "t", b"body", key="k", properties={"p": "v"},
                                  queue_offset=i)) for i in range(4)]
    overrun = bytearray(good[0])
    struct.pack_into(">I", overrun, 63, 10_000)  # body_len
    not_utf8 = bytearray(encode_record(Message("idx", "t", b"body", key="kk")))
    key_at = 67 + 3 + 1
    not_utf8[key_at : key_at + 2] = b"\xff\xfe"
    bad_props = bytearray(encode_record(Message("idy", "t", b"body", properties={"a": "b"})))
    props_at = 67 + 3 + 1
    struct.pack_into(">H", bad_props, props_at, 200)  # the key length runs past
    data = b"".join([good[0], _crc_valid(overrun), good[1], _crc_valid(not_utf8), good[2],
                     _crc_valid(bad_props), good[3]])
    damaged: list[Damage] = []
    got = decode_object(data, "t", "obj", on_damage=damaged.append)
    assert got.column("message_id").to_pylist() == ["id0", "id1", "id2", "id3"]
    assert [r["properties"] for r in got.to_pylist()] == [[("p", "v")]] * 4
    assert [d.path for d in damaged] == ["obj"]
    starts = [sum(len(x) for x in (good[0], overrun, good[1], not_utf8, good[2])[:i])
              for i in (1, 3, 5)]
    for at in starts:
        assert f"record at byte {at}" in damaged[0].reason


def test_an_outage_is_not_damage(tmp_path: Path) -> None:
    # a tier that cannot be reached raises: the job fails and can be run again, rather
    # than report every object as damaged
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = S3Provider(S3Settings(bucket="b", endpoint_url=f"http://127.0.0.1:{port}",
                                     access_key_id="k", secret_access_key="s",
                                     max_attempts=1, connect_timeout_s=1))
    s = ScanSlice("a", 0, 0, ("b0/data/a/0/0/log/0/0",), (100,), 0, 1)
    damaged: list[Damage] = []
    with pytest.raises(TierUnavailable):
        list(decode_slice(provider, s, on_damage=damaged.append))
    assert damaged == []
