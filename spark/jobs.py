"""Backlog jobs over the tiered store: replay a selection into a live broker, or export
it as Parquet.  Both read through the ``chronomq`` data source, so they run unchanged on
``local[N]`` or a cluster (``spark.standalone``).

Replay sends from every partition at once (``mapInArrow``: Arrow batches in, a row of
counts out) through a ``ReplaySink``, the narrow sending interface this package defines
and the composition root implements (``chronomq.replay_sink``: one SendStream per
partition, requests of ``SEND_BATCH`` messages), so no import points from here up into
``chronomq``.  Each message keeps its original message id, so the broker's dedupe window
(``store.dedupe_window_ms``) makes a second run of the same replay deliver nothing twice.
``spread_ms`` re-times deliveries: a message stored at fraction f of the selected time
span is delivered at launch + f * spread.  ``rate`` caps the total send rate: the
selection is first spread evenly over as many partitions as run at once (a shuffle, only
with a rate), each sending its share; a request goes out as soon as the messages before
it are within the share (``Pace``), so the cap is reached when the broker can take it.
A refused message is counted and the first refusal's status kept, so the job can say
why; the send window (first request to last answer) gives the rate achieved.

Damaged tier objects do not stop either job: ``select`` asks the source for a marker row
per damaged object (``damage_rows``); both jobs take the markers out before sending or
writing and collect them in the same pass (a Spark ``Observation``), so every intact
record is delivered and the damaged objects are reported (``ReplayResult.damaged``,
``export(..., damaged=[])``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from spark.datasource import DAMAGE_QUEUE_ID, DAMAGE_REASON, DAMAGED_OBJECT, TierLocation
from store.names import check_name
from tiered.scan import Damage, Selection

SEND_BATCH = 500
# one message as replay sends it: topic, body, key, tag, properties, deliver_at_ms (0: now),
# and its original message id
Row = tuple[str, bytes, str, str, Any, int, str]
Result = tuple[bool, bool, str]  # ok, duplicate, "CODE: message" when refused


class ReplaySink(Protocol):
    """Where a replay sends: ``send`` takes batches of rows and yields, per batch, one
    result per row, in order.  Picklable (plain attributes): Spark ships it to its Python
    workers, each of which opens its own connection.  ``chronomq.replay_sink`` has the
    broker's (SendStream over gRPC)."""

    def send(self, batches: Iterator[list[Row]]) -> Iterator[list[Result]]: ...
COUNTS = "sent long, duplicates long, failed long, error string, first_ms long, last_ms long"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    selected: int
    sent: int
    duplicates: int  # already delivered by an earlier run (dedupe window)
    failed: int
    seconds: float
    first_error: str = ""  # "CODE: message" of a failed send, when any failed
    send_seconds: float = 0.0  # from the first request sent to the last answer
    damaged: tuple[Damage, ...] = ()  # tier objects skipped in part or whole, by path

    @property
    def rate(self) -> float:
        """Messages answered per second of sending."""
        done = self.sent + self.duplicates + self.failed
        return done / self.send_seconds if self.send_seconds > 0 else 0.0


def select(spark: SparkSession, location: TierLocation, selection: Selection) -> DataFrame:
    """The selected messages as a DataFrame (the selection is pushed into the source),
    with a marker row per damaged tier object (``queue_id`` -1; ``replay`` and
    ``export`` take them out and report them)."""
    reader = (spark.read.format("chronomq").option("broker", location.broker)
              .option("damage_rows", "true"))
    for field in TierLocation.__slots__:
        value = getattr(location, field)
        if value and field != "broker":
            reader = reader.option(field, value)
    df = reader.load()
    if selection.topics:
        df = df.where(F.col("topic").isin(sorted(selection.topics)))
    if selection.start_ms:
        df = df.where(F.col("store_at_ms") >= selection.start_ms)
    if selection.end_ms:
        df = df.where(F.col("store_at_ms") < selection.end_ms)
    if selection.key:
        df = df.where(F.col("key") == selection.key)
    return df


def replay(spark: SparkSession, df: DataFrame, sink: ReplaySink, into_topic: str = "",
           spread_ms: int = 0, rate: float = 0, progress: bool = True) -> ReplayResult:
    """Send the messages of ``df`` through ``sink`` (a live broker)."""
    if into_topic:
        check_name(into_topic)
    t0 = time.monotonic()
    first_ms = span_ms = 0
    observed, damage = _without_damage(df)
    if spread_ms:  # an extra pass over the intact records (no report: the send has it)
        intact = df if damage is None else df.where(F.col("queue_id") != DAMAGE_QUEUE_ID)
        lo, hi = intact.agg(F.min("store_at_ms"),
                            F.max("store_at_ms")).first() or (None, None)
        if lo is not None and hi is not None:
            first_ms, span_ms = int(lo), max(1, int(hi) - int(lo))
    launch_ms = int(time.time() * 1000)
    running = max(1, spark.sparkContext.defaultParallelism)
    df = observed
    if rate:  # every partition sends at once, at an even share of the rate
        df = df.repartition(running)
    per_task_rate = rate / running if rate else 0.0
    sender = _Sender(sink, into_topic, spread_ms, first_ms, span_ms, launch_ms,
                     per_task_rate)
    with _Progress(spark, "replay", progress):
        counts = df.mapInArrow(sender, COUNTS).agg(
            F.sum("sent"), F.sum("duplicates"), F.sum("failed"),
            F.first("error", ignorenulls=True), F.min("first_ms"), F.max("last_ms")).first()
    sent, dups, failed, error, first, last = counts or (0, 0, 0, None, None, None)
    sent, dups, failed = int(sent or 0), int(dups or 0), int(failed or 0)
    window_s = (last - first) / 1000 if first is not None and last is not None else 0.0
    return ReplayResult(sent + dups + failed, sent, dups, failed, time.monotonic() - t0,
                        error or "", window_s, tuple(_damaged(damage)))


def export(spark: SparkSession, df: DataFrame, path: str, progress: bool = True,
           damaged: list[Damage] | None = None) -> int:
    """Write ``df`` as Parquet under ``path`` (replacing it); returns the rows written.
    The damaged tier objects met are added to ``damaged`` (when given)."""
    observed, damage = _without_damage(df)
    with _Progress(spark, "export", progress):
        observed.write.mode("overwrite").parquet(path)
    if damaged is not None:
        damaged += _damaged(damage)
    return int(spark.read.parquet(path).count())


def _without_damage(df: DataFrame) -> tuple[DataFrame, Observation | None]:
    """``df`` without its damage marker rows, and the observation that collects them
    while the job's action runs (None: ``df`` has no such columns)."""
    if not {"queue_id", "properties"} <= set(df.columns):
        return df, None
    marker = F.col("queue_id") == DAMAGE_QUEUE_ID
    props = F.col("properties")
    observation = Observation("chronomq_damage")
    observed = df.observe(observation, F.collect_set(F.when(marker, F.struct(
        props[DAMAGED_OBJECT].alias("path"), props[DAMAGE_REASON].alias("reason"))))
        .alias("damaged"))
    return observed.where(~marker), observation


def _damaged(observation: Observation | None) -> list[Damage]:
    """The damaged objects the observed action met, by path (after the action)."""
    if observation is None:
        return []
    rows = observation.get.get("damaged") or []
    return sorted((Damage(r["path"], r["reason"]) for r in rows), key=lambda d: d.path)


class _Sender:
    """The per-partition send function (picklable: plain values only)."""

    def __init__(self, sink: ReplaySink, into_topic: str, spread_ms: int,
                 first_ms: int, span_ms: int, launch_ms: int, rate: float) -> None:
        self.sink, self.into_topic = sink, into_topic
        self.spread_ms, self.first_ms, self.span_ms = spread_ms, first_ms, span_ms
        self.launch_ms, self.rate = launch_ms, rate

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sent = dups = failed = 0
        error: str | None = None
        first_ms: int | None = None
        pace = Pace(self.rate, time.monotonic, time.sleep)
        # with a rate, about ten requests a second (small bursts)
        step = min(SEND_BATCH, max(1, int(self.rate / 10))) if self.rate else SEND_BATCH

        def requests() -> Iterator[list[Row]]:
            nonlocal first_ms
            for batch in batches:
                cols = batch.to_pydict()
                n = batch.num_rows
                topics = [self.into_topic] * n if self.into_topic else cols["topic"]
                due = [0] * n
                if self.spread_ms:
                    due = [self.launch_ms + int((at - self.first_ms) / self.span_ms
                                                * self.spread_ms)
                           for at in cols["store_at_ms"]]
                rows = list(zip(topics, cols["body"], cols["key"], cols["tag"],
                                cols["properties"], due, cols["message_id"], strict=True))
                for at in range(0, n, step):
                    chunk = rows[at : at + step]
                    pace.before(len(chunk))
                    if first_ms is None:
                        first_ms = int(time.time() * 1000)
                    yield chunk

        for results in self.sink.send(requests()):
            for ok, duplicate, refused in results:
                if not ok:
                    failed += 1
                    if error is None:
                        error = refused
                elif duplicate:
                    dups += 1
                else:
                    sent += 1
        yield pa.RecordBatch.from_pydict({"sent": [sent], "duplicates": [dups],
                                          "failed": [failed], "error": [error],
                                          "first_ms": [first_ms],
                                          "last_ms": [int(time.time() * 1000)
                                                      if first_ms is not None else None]},
                                         schema=_COUNTS_SCHEMA)


_COUNTS_SCHEMA = pa.schema([("sent", pa.int64()), ("duplicates", pa.int64()),
                            ("failed", pa.int64()), ("error", pa.string()),
                            ("first_ms", pa.int64()), ("last_ms", pa.int64())])


class Pace:
    """Holds a sender to ``rate`` messages a second (0: no cap): ``before(n)`` returns
    when the messages sent before the ``n`` about to go are within the rate, counted
    from the first request (so a request is the only burst).  Time is injected (tests)."""

    def __init__(self, rate: float, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self.rate, self._clock, self._sleep = rate, clock, sleep
        self._sent = 0
        self._start: float | None = None

    def before(self, n: int) -> None:
        if not self.rate:
            return
        if self._start is None:
            self._start = self._clock()
        ahead = self._sent / self.rate - (self._clock() - self._start)
        if ahead > 0:
            self._sleep(ahead)
        self._sent += n


class _Progress:
    """Prints the job's task progress every two seconds while it runs."""

    def __init__(self, spark: SparkSession, what: str, enabled: bool) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._what, self._enabled = what, enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Progress:
        if self._enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._enabled:
            self._thread.join(5)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(2.0):
            done = total = 0
            for sid in self._tracker.getActiveStageIds():
                info = self._tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                print(f"{self._what}: {done}/{total} partitions done, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
