"""End to end: send -> tier (local directory and moto's S3) -> a Spark replay of a
selection (topic, time range, key) into a live broker on loopback -> Pop sees exactly
the selected messages once, also after the same replay runs twice; export to Parquet."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from chronomq.client import ChronomqClient, message
from chronomq.replay_sink import GrpcReplaySink
from spark.datasource import TierLocation
from spark.jobs import export, replay, select
from testkit.process import wait_tier_caught_up
from testkit.wait import wait_until
from tests.conftest import RunningServer, broker_config, tier_config
from tiered.scan import Selection


def _server(kind: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> tuple[RunningServer, TierLocation]:
    fast = {"upload": True, "upload_batch_ms": 50, "read": "not_in_disk"}
    tier = tier_config(kind, tmp_path, request, "replay", **fast)
    config = dataclasses.replace(broker_config(tmp_path / "data"), tier=tier)
    return RunningServer(config), TierLocation.from_tier(tier, config.tier_local_dir())


def _now_ms() -> int:
    return time.time_ns() // 1_000_000  # the clock the broker stamps store times with


def _next_ms() -> int:
    """The first wall-clock millisecond after now: every message stored so far (its Send
    answered) has a store time before it, every one sent from now on one at or after."""
    sent_by_ms = _now_ms()
    return wait_until(lambda: (now := _now_ms()) > sent_by_ms and now, 1,
                      f"the clock to pass {sent_by_ms} ms", poll_s=0.001)


def _drain(c: ChronomqClient, topic: str, group: str) -> list[str]:
    seen: list[str] = []
    while got := c.pop(topic, group, max_messages=32, wait_ms=0):
        seen += [m.message_id for m in got]
        c.ack(group, [m.receipt_handle for m in got])
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_replay_delivers_exactly_the_selection_once(
        kind: str, spark: SparkSession, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    srv, location = _server(kind, tmp_path, request)
    try:
        with srv.client() as c:
            c.create_topic("orders", queue_count=2)
            c.create_topic("other")
            c.create_topic("replayed")
            early = [o.message_id for o in c.send(
                [message("orders", f"early-{i}".encode(), key=f"k{i % 3}") for i in range(30)])]
            start_ms = _next_ms()
            window = c.send([message("orders", f"in-{i}".encode(), key=f"k{i % 3}",
                                     properties={"n": str(i)}) for i in range(60)])
            c.send([message("other", b"not selected", key="k1")])
            end_ms = _next_ms()
            c.send([message("orders", b"late", key="k1")])
            wait_tier_caught_up(c)
            wanted = {o.message_id for o, i in zip(window, range(60), strict=True)
                      if i % 3 == 1}
            selection = Selection(frozenset({"orders"}), start_ms, end_ms, "k1")
            df = select(spark, location, selection)
            sink = GrpcReplaySink(srv.target)
            first = replay(spark, df, sink, into_topic="replayed", progress=False)
            assert (first.selected, first.sent, first.duplicates, first.failed) == (20, 20, 0, 0)
            got = _drain(c, "replayed", "g")
            assert sorted(got) == sorted(wanted)  # the original ids, each once
            again = replay(spark, select(spark, location, selection), sink,
                           into_topic="replayed", progress=False)
            assert (again.sent, again.duplicates) == (0, 20)
            assert _drain(c, "replayed", "g") == []
            assert not set(early) & set(got)
            out = export(spark, df, str(tmp_path / "export"), progress=False)
            assert out == 20
            rows = spark.read.parquet(str(tmp_path / "export")).collect()
            assert {r.message_id for r in rows} == wanted and all(r.key == "k1" for r in rows)
    finally:
        srv.stop()


def test_spread_retimes_deliveries(spark: SparkSession, tmp_path: Path,
                                   request: pytest.FixtureRequest) -> None:
    srv, location = _server("local", tmp_path, request)
    try:
        with srv.client() as c:
            c.create_topic("orders")
            c.create_topic("later")
            first = c.send([message("orders", f"a{i}".encode()) for i in range(5)])
            # the span spread stretches: the second batch stored 0.1 s after the first
            # (real time on purpose: the broker stamps store times on its system clock)
            wait_until(lambda: _now_ms() >= first[0].deliver_at_ms + 100, 5,
                       "0.1 s of store time after the first batch", poll_s=0.005)
            c.send([message("orders", f"b{i}".encode()) for i in range(5)])
            wait_tier_caught_up(c)
            df = select(spark, location, Selection(frozenset({"orders"})))
            sink = GrpcReplaySink(srv.target)
            r = replay(spark, df, sink, into_topic="later", spread_ms=3_600_000,
                       progress=False)
            assert r.sent == 10
            # the span (0.1 s) now lasts an hour: the first batch is due at once, the
            # second an hour from the launch
            got = c.pop("later", "g", max_messages=32, wait_ms=1000)
            assert sorted(m.message_id for m in got) == sorted(o.message_id for o in first)
            stats = c.stats()
            assert stats["timer.pending_wheel"] + stats["timer.pending_rocksdb"] >= 5
            # --rate: 10 messages at 2 msgs/s, 1 a second from each of the 2 partitions:
            # the last pair cannot leave before 4 s have passed (the same ids into the
            # same topic again: this second replay stores nothing)
            capped = replay(spark, df, sink, into_topic="later", rate=2,
                            progress=False)
            assert capped.duplicates == 10 and capped.send_seconds >= 4.0
    finally:
        srv.stop()


def test_rate_cap_is_reached_not_exceeded(spark: SparkSession, tmp_path: Path,
                                          request: pytest.FixtureRequest) -> None:
    """A replay capped at 1,000 msgs/s of 3,000 messages sends at that rate: never above
    (one request per partition is the only burst), and not far below when the broker
    can take more (it takes tens of thousands a second)."""
    srv, location = _server("local", tmp_path, request)
    try:
        with srv.client() as c:
            c.create_topic("orders", queue_count=4)
            c.create_topic("copy")
            for _ in range(3):
                c.send([message("orders", b"x" * 100) for _ in range(1000)])
            wait_tier_caught_up(c)
        df = select(spark, location, Selection(frozenset({"orders"})))
        r = replay(spark, df, GrpcReplaySink(srv.target), into_topic="copy", rate=1000,
                   progress=False)
        assert (r.sent, r.failed) == (3000, 0)
        burst = 2 * 50  # one request (a tenth of its 500/s share) from each of 2 partitions
        assert (3000 - burst) / r.send_seconds <= 1000 * 1.02
        assert r.rate >= 1000 * 0.75, r  # before the fix: about half the cap
    finally:
        srv.stop()


@pytest.mark.slow
def test_cli_replay_and_export(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    srv, _ = _server("local", tmp_path, request)
    try:
        with srv.client() as c:
            c.create_topic("orders")
            c.create_topic("copy")
            sent = c.send([message("orders", f"m{i}".encode(), key="k") for i in range(40)])
            wait_tier_caught_up(c)
        common = ["--topic", "orders", "--key", "k", "--tier-dir", str(tmp_path / "tier"),
                  "--master", "local[1]", "--json"]
        out = subprocess.run(
            [sys.executable, "-m", "chronomq.cli", "replay", *common, "--into-topic", "copy",
             "--target", srv.target], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads(out.stdout)
        assert (result["selected"], result["sent"], result["duplicates"]) == (40, 40, 0)
        assert result["spark_start_seconds"] > 0
        # export finds the tier through the broker's config file instead
        toml = tmp_path / "broker.toml"
        toml.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n'
                        f'[tier]\nprovider = "local"\nlocal_dir = "{tmp_path / "tier"}"\n')
        by_config = ["--topic", "orders", "--key", "k", "--config", str(toml),
                     "--master", "local[1]", "--json"]
        out = subprocess.run(
            [sys.executable, "-m", "chronomq.cli", "export", *by_config, "--output",
             str(tmp_path / "pq")], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["exported"] == len(sent)
        bad = subprocess.run([sys.executable, "-m", "chronomq.cli", "export", *common,
                              "--output", str(tmp_path / "x"), "--from", "yesterday"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "epoch ms or ISO-8601" in bad.stderr
        toml.write_text('[tier]\nprovider = "memory"\n')
        bad = subprocess.run([sys.executable, "-m", "chronomq.cli", "export", *by_config,
                              "--output", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "cannot be read outside the broker" in bad.stderr
    finally:
        srv.stop()
