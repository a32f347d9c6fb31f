"""Filters the data source cannot push (``NOT``, ``OR`` and others without one column)
are handed back to Spark, which evaluates them, instead of failing the read."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from store.clock import ManualClock
from tests.tiered.test_scan import _tiered


def test_not_and_or_filters_are_left_to_spark(spark: SparkSession, tmp_path: Path,
                                              manual_clock: ManualClock) -> None:
    _tiered(tmp_path, manual_clock)
    df = (spark.read.format("chronomq").option("path", str(tmp_path / "tier"))
          .option("broker", "b0").load())
    assert df.where("NOT (topic = 'b')").count() == 60
    assert df.where("queue_id != 1").count() == 1
    assert df.where("topic = 'b' OR key = 'k0'").count() == 16
