"""The data source's ``broker`` option names brokers, not tier prefixes: a broker that
rejoined after a takeover writes under ``<name>--<n>`` (``cluster.layout``), and reading
``<name>`` reads every incarnation of it.  A comma-separated list reads several brokers,
``*`` every broker in the tier; a name that is not one is refused.  A real local[2]
Spark session over a local-directory tier written by the tiered dispatcher."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from spark.datasource import TierLocation
from store.clock import ManualClock
from store.message import Message, draft_of
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.providers.local import LocalProvider

BODIES = {"b": {b"b-0", b"b-1"}, "b--1": {b"b1-0", b"b1-1", b"b1-2"}, "c": {b"c-0"},
          "b--x": {b"c-0"}}  # b--x: a copy of c, a broker whose name only looks like b's


def _upload(root: Path, clock: ManualClock, prefix: str, bodies: set[bytes]) -> None:
    """``bodies`` sent to topic ``orders`` of a broker that writes under ``prefix``."""
    store = MessageStore(StoreConfig(str(root / "data" / prefix)), clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, LocalProvider(str(root / "tier")), prefix,
                            str(root / "data" / prefix / "tiered"), TierConfig(), clock)
    tier.open()
    store.create_topic(Topic("orders", 1))
    store.put_drafts([draft_of(Message("", "orders", b)) for b in sorted(bodies)]).result(10)
    while tier.step():
        pass
    tier.stop()
    store.stop()


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tier holding broker b's two incarnations (b, b--1), broker c, broker b--x and
    the cluster's own objects beside them (a lease, an owner record)."""
    root = tmp_path_factory.mktemp("incarnations")
    clock = ManualClock()
    for prefix in ("b", "b--1", "c"):
        _upload(root, clock, prefix, BODIES[prefix])
    shutil.copytree(root / "tier" / "c", root / "tier" / "b--x")
    provider = LocalProvider(str(root / "tier"))
    provider.write("brokers/b--1.json", b"{}")
    provider.write("owners/orders.json", b"{}")
    return root / "tier"


def _bodies(spark: SparkSession, tier: Path, broker: str) -> list[bytes]:
    df = spark.read.format("chronomq").option("path", str(tier)).option("broker", broker)
    return sorted(r.body for r in df.load().select("body").collect())


def _of(*prefixes: str) -> list[bytes]:
    return sorted(b for p in prefixes for b in BODIES[p])


def test_a_broker_is_read_with_every_incarnation(spark: SparkSession, tier: Path) -> None:
    # Given b wrote under b, then (rejoined) under b--1
    # When the source reads broker b
    # Then it gets both lives, neither c nor b--x
    assert _bodies(spark, tier, "b") == _of("b", "b--1")
    # an incarnation's own prefix reads that incarnation only
    assert _bodies(spark, tier, "b--1") == _of("b--1")


def test_several_brokers_and_every_broker(spark: SparkSession, tier: Path) -> None:
    assert _bodies(spark, tier, "b,c") == _of("b", "b--1", "c")
    assert _bodies(spark, tier, " c , b ") == _of("b", "b--1", "c")
    assert _bodies(spark, tier, "*") == _of("b", "b--1", "c", "b--x")


@pytest.mark.parametrize("broker", ["b/../c", "b,", "%SYS%state", "b c", ",", "*x"])
def test_an_invalid_broker_name_is_refused(spark: SparkSession, tier: Path,
                                           broker: str) -> None:
    with pytest.raises(ValueError, match="option 'broker'"):
        TierLocation.from_options({"path": str(tier), "broker": broker})
    with pytest.raises(AnalysisException, match="option 'broker'"):  # its ValueError
        _bodies(spark, tier, broker)
