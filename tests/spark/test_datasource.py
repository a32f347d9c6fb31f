"""The chronomq data source in a real local[2] Spark session over a local-directory tier:
every row decoded, filters pushed down (whole segments skipped), key selection."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from store.clock import ManualClock
from tests.tiered.test_scan import _tiered


def test_reads_the_tier_with_filters_pushed_down(spark: SparkSession, tmp_path: Path,
                                                manual_clock: ManualClock) -> None:
    _, _, t0 = _tiered(tmp_path, manual_clock)
    df = (spark.read.format("chronomq").option("path", str(tmp_path / "tier"))
          .option("broker", "b0").load())
    assert df.count() == 61
    rows = df.where("topic = 'a'").select("body", "key", "properties", "queue_id").collect()
    assert sorted(r.body for r in rows) == sorted(f"{m}-{i}".encode()
                                                  for m in range(3) for i in range(20))
    assert {r.queue_id for r in rows} <= {0, 1}
    one = next(r for r in rows if r.body == b"2-7")
    assert (one.key, one.properties) == ("k3", {"n": "7"})
    second_minute = df.where(f"topic = 'a' AND store_at_ms >= {t0 + 60_000} "
                             f"AND store_at_ms < {t0 + 120_000}")
    assert second_minute.rdd.getNumPartitions() < df.where("topic = 'a'").rdd.getNumPartitions()
    assert sorted(r.body for r in second_minute.collect()) == sorted(
        f"1-{i}".encode() for i in range(20))
    assert df.where("topic = 'a' AND key = 'k2'").count() == 15
    assert df.where("topic = 'b'").select("body").collect()[0].body == b"other"
    assert df.where("topic = 'missing'").count() == 0
