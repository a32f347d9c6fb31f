"""Export and replay over a damaged tier, in a real local[2] Spark session: a flipped
byte in one object, another object cut short, a third gone and a queue's metadata copy
garbled.  Every intact record is exported and replayed (original ids, into a live broker
on loopback); the damaged objects are named and counted in the result, in the CLI's JSON
summary and on its stderr, and the CLI exits 0.  Local-directory tier and moto's S3."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from chronomq.client import ChronomqClient
from spark.datasource import TierLocation
from spark.jobs import export, select
from store.clock import ManualClock
from tests.conftest import CREDS, RunningServer, broker_config, create_bucket
from tests.tiered.test_scan import _tiered
from tiered.providers.local import LocalProvider
from tiered.providers.s3 import S3Provider, S3Settings
from tiered.scan import Damage, Selection, decode_object, plan

SELECTION = Selection(frozenset({"a", "b"}))


def _ids(data: bytes) -> list[str]:
    return decode_object(data, "").column("message_id").to_pylist()


def _damage(tmp_path: Path, clock: ManualClock
            ) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """A tier of 61 records (60 of topic a in objects of five, one of b) with four
    objects damaged; returns the ids of the intact records, and the damaged objects'
    paths and what their report must say, by kind of damage."""
    _, provider, _ = _tiered(tmp_path, clock)
    root = tmp_path / "tier"
    objects = [p for s in plan(provider, "b0", SELECTION) for p in s.paths]
    ids = {p: _ids((root / p).read_bytes()) for p in objects}
    damaged = {"flipped": objects[2], "cut": objects[6], "gone": objects[9],
               "meta": "b0/meta/b/0.json"}
    # a flipped byte in the third record of an object: that record only
    data = bytearray((root / damaged["flipped"]).read_bytes())
    third = 2 * struct.unpack_from(">I", data, 4)[0]  # the records are of one size
    assert _ids(bytes(data[third:])) == ids[damaged["flipped"]][2:]
    data[third + 90] ^= 0x01
    (root / damaged["flipped"]).write_bytes(bytes(data))
    # cut in the fourth record: the first three stay
    data = bytearray((root / damaged["cut"]).read_bytes())
    (root / damaged["cut"]).write_bytes(bytes(data[: len(data) - 150]))
    says = {"flipped": f"bad record at byte {third} (CRC mismatch)",
            "cut": f"its data ends at byte {len(data) - 150} but the metadata says "
                   f"{len(data)}",
            "gone": "missing although the metadata lists it",
            "meta": "the tiered queue metadata is unreadable"}
    (root / damaged["gone"]).unlink()
    # topic b's queue metadata copy garbled: its one record cannot be located
    (root / damaged["meta"]).write_bytes(b"\x00garbage")
    b_ids = [i for p, v in ids.items() if p.startswith("b0/data/b/") for i in v]
    lost = {ids[damaged["flipped"]][2], *ids[damaged["cut"]][3:], *ids[damaged["gone"]],
            *b_ids}
    assert len(lost) == 1 + 2 + 5 + 1
    return {i for v in ids.values() for i in v} - lost, damaged, says


def _location(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> TierLocation:
    """The tier under ``tmp_path / "tier"``, or a copy of it in a new moto bucket."""
    if kind == "local":
        return TierLocation(path=str(tmp_path / "tier"), broker="b0")
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"damaged-{zlib.crc32(str(tmp_path).encode())}"
    create_bucket(endpoint, bucket)
    s3 = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint, **CREDS))
    local = LocalProvider(str(tmp_path / "tier"))
    for path in local.list("b0/"):
        s3.write(path, local.read(path))
    return TierLocation(s3_bucket=bucket, s3_endpoint_url=endpoint, broker="b0",
                        s3_access_key_id=CREDS["access_key_id"],
                        s3_secret_access_key=CREDS["secret_access_key"])


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_export_writes_every_intact_record_and_names_the_damage(
        kind: str, spark: SparkSession, tmp_path: Path, manual_clock: ManualClock,
        request: pytest.FixtureRequest) -> None:
    # Given a tier with four damaged objects
    intact, paths, says = _damage(tmp_path, manual_clock)
    location = _location(kind, tmp_path, request)
    # When it is exported
    damaged: list[Damage] = []
    rows = export(spark, select(spark, location, SELECTION), str(tmp_path / "out"),
                  progress=False, damaged=damaged)
    # Then every intact record is written, nothing else, and the four are reported
    written = spark.read.parquet(str(tmp_path / "out")).select("message_id", "queue_id")
    got = [r.message_id for r in written.collect()]
    assert rows == len(intact) == 52
    assert sorted(got) == sorted(intact)
    assert [d.path for d in damaged] == sorted(paths.values())
    why = {d.path: d.reason for d in damaged}
    for kind, path in paths.items():
        assert says[kind] in why[path], kind


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chronomq.cli", *argv],
                          capture_output=True, text=True, timeout=300)


def _drain(c: ChronomqClient, topic: str) -> list[str]:
    seen: list[str] = []
    while got := c.pop(topic, "g", max_messages=32, wait_ms=0):
        seen += [m.message_id for m in got]
        c.ack("g", [m.receipt_handle for m in got])
    return seen


def test_cli_export_and_replay_report_the_damage_and_exit_0(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    intact, paths, _ = _damage(tmp_path, manual_clock)
    common = ["--topic", "a,b", "--tier-dir", str(tmp_path / "tier"), "--broker-name",
              "b0", "--master", "local[1]", "--json"]
    out = _cli("export", *common, "--output", str(tmp_path / "pq"))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["exported"] == len(intact)
    assert summary["damaged_objects"] == 4
    assert [d["object"] for d in summary["damaged"]] == sorted(paths.values())
    for path in paths.values():
        assert f"warning: damaged tier object {path}: " in out.stderr
    assert "4 damaged tier object(s) read in part or skipped: every intact record was " \
        "exported" in out.stderr
    srv = RunningServer(broker_config(tmp_path / "broker"))
    try:
        with srv.client() as c:
            c.create_topic("a", queue_count=2)
            c.create_topic("b")
            out = _cli("replay", *common, "--target", srv.target)
            assert out.returncode == 0, out.stderr[-3000:]
            summary = json.loads(out.stdout)
            assert (summary["selected"], summary["sent"], summary["failed"]) == (
                len(intact), len(intact), 0)
            assert summary["damaged_objects"] == 4
            assert [d["object"] for d in summary["damaged"]] == sorted(paths.values())
            assert f"warning: damaged tier object {paths['cut']}: " in out.stderr
            assert sorted(_drain(c, "a") + _drain(c, "b")) == sorted(intact)
    finally:
        srv.stop()
