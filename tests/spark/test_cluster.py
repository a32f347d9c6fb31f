"""The backlog jobs on a real Spark standalone cluster: a master and two worker processes
started from pyspark's distribution (``spark.standalone``), the tier on moto's S3
server, the jobs run unchanged through the ``chronomq`` console script with
``--master spark://...``: export gives the same rows as on ``local[2]``, and replay into
a live broker delivers every message as it was sent.  Everything is stopped by PID."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from chronomq.client import message
from spark.standalone import StandaloneCluster
from testkit.process import wait_tier_caught_up
from tests.conftest import RunningServer, broker_config, tier_config

COLUMNS = ["message_id", "topic", "queue_id", "queue_offset", "key", "tag", "body",
           "store_at_ms"]


def _cli(*argv: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "chronomq.cli", *argv, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _rows(path: Path) -> list[tuple[Any, ...]]:
    table = pq.read_table(path, columns=COLUMNS)
    return sorted(zip(*(table.column(c).to_pylist() for c in COLUMNS), strict=True))


@pytest.mark.slow
def test_export_and_replay_on_a_standalone_cluster(tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    tier = tier_config("s3", tmp_path, request, "cluster", upload=True, upload_batch_ms=50,
                       read="not_in_disk")
    config = dataclasses.replace(broker_config(tmp_path / "data"), tier=tier)
    srv = RunningServer(config)
    try:
        with srv.client() as c:
            c.create_topic("orders", queue_count=2)
            c.create_topic("copy")
            sent = {}
            for b in range(3):
                out = c.send([message("orders", f"body-{b}-{i}".encode(), key=f"k{i % 7}",
                                      tag="t") for i in range(100)])
                sent.update({o.message_id: f"body-{b}-{i}".encode()
                             for i, o in enumerate(out)})
            wait_tier_caught_up(c)
        toml = tmp_path / "broker.toml"
        toml.write_text(
            f'[store]\ndata_dir = "{tmp_path / "data"}"\n[tier]\nprovider = "s3"\n'
            f'broker_name = "{tier.broker_name}"\ns3_bucket = "{tier.s3_bucket}"\n'
            f's3_endpoint_url = "{tier.s3_endpoint_url}"\n'
            f's3_access_key_id = "{tier.s3_access_key_id}"\n'
            f's3_secret_access_key = "{tier.s3_secret_access_key}"\n')
        common = ["--config", str(toml), "--topic", "orders"]
        local = _cli("export", *common, "--master", "local[2]", "--output",
                     str(tmp_path / "local"))
        with StandaloneCluster(workers=2, root=tmp_path / "cluster") as cluster:
            assert len(cluster.pids) == 3  # the master and two workers
            remote = _cli("export", *common, "--master", cluster.master_url, "--output",
                          str(tmp_path / "remote"))
            replayed = _cli("replay", *common, "--master", cluster.master_url,
                            "--into-topic", "copy", "--target", srv.target)
            pids = cluster.pids
        for pid in pids:  # stopped by PID
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert local["exported"] == remote["exported"] == 300
        assert _rows(tmp_path / "remote") == _rows(tmp_path / "local")
        assert (replayed["sent"], replayed["failed"]) == (300, 0)
        with srv.client() as c:
            got = {}
            while batch := c.pop("copy", "g", 32, 30, 0):
                got.update({m.message_id: m.body for m in batch})
                c.ack("g", [m.receipt_handle for m in batch])
        assert got == sent  # every message once, with its id and body
    finally:
        srv.stop()
