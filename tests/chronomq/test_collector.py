"""The broker process's garbage collector (``chronomq.collector``): its thresholds, what
its watch counts, and the figures a served broker reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess

_PROBE = """
import gc, json, sys
from chronomq import collector
watch = collector.CollectorWatch()
if sys.argv[1] == "tuned":
    watch = collector.tune()
else:
    gc.callbacks.append(watch)
kept = [(i, [i]) for i in range(200_000)]  # 400,000 containers that stay alive
gc.collect()
print(json.dumps({"figures": watch.figures(), "threshold": gc.get_threshold()}))
"""


def _probe(setting: str) -> dict[str, object]:
    """The watch's figures after a burst of long-lived containers (a fresh process: the
    setting is process-wide)."""
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_tuned_collector_runs_far_fewer_collections_and_the_watch_counts_them() -> None:
    # Given CPython's defaults, 400,000 new containers make hundreds of young collections
    default = _probe("default")
    counted = default["figures"]
    assert isinstance(counted, dict)
    assert counted["gc.collections_young"] >= 400_000 // 700 // 2
    assert counted["gc.collections_full"] >= 1  # the explicit one at least
    assert counted["gc.pause_seconds"] > 0 and counted["gc.longest_pause_s"] > 0
    # When the broker's setting is on
    tuned = _probe("tuned")
    figures = tuned["figures"]
    assert isinstance(figures, dict)
    # Then the thresholds are the module's, and young collections run a fraction as often
    assert tuned["threshold"] == [50_000, 20, 10]
    assert 1 <= figures["gc.collections_young"] <= 400_000 // 50_000 + 2
    assert figures["gc.collections_young"] * 20 < counted["gc.collections_young"]
    assert figures["gc.collections_full"] >= 1


def test_a_served_broker_reports_its_collections_and_freezes_what_startup_built(
        tmp_path: Path) -> None:
    # Given a broker run as `chronomq serve`
    srv = ServerProcess(tmp_path / "data")
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("t", queue_count=1)
            # When it has taken some messages
            for _ in range(20):
                assert all(o.ok for o in c.send([message("t", b"x" * 100)
                                                  for _ in range(500)]))
            figures = c.stats()
    finally:
        srv.terminate()
    # Then Stats reports the collector's figures, and startup's objects were frozen
    assert figures["gc.frozen_objects"] > 10_000
    assert figures["gc.collections_young"] + figures["gc.collections_full"] >= 1
    assert figures["gc.pause_seconds"] >= 0 and figures["gc.collected_objects"] >= 0
    assert figures["gc.longest_pause_s"] >= 0
