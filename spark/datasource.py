"""The ``chronomq`` Spark data source: reads the tiered message store (a local directory
or S3) as a DataFrame, one input partition per slice of a tiered log segment
(``tiered.scan``), yielding Arrow record batches.

::

    spark.dataSource.register(ChronomqDataSource)
    df = (spark.read.format("chronomq")
          .option("path", "/var/lib/chronomq-tier")        # or the s3_* options
          .option("broker", "broker-0")
          .load()
          .where("topic = 'orders' AND store_at_ms >= 1763800000000"))

Options (plain values, so executors open their own tier): ``path`` (local-directory
tier) or ``s3_bucket``, ``s3_prefix``, ``s3_endpoint_url``, ``s3_region``,
``s3_access_key_id``, ``s3_secret_access_key``; ``broker`` (default ``broker-0``);
optionally ``topic`` (comma-separated), ``start_ms``, ``end_ms``, ``key``, and
``max_slice_bytes``; ``damage_rows`` (``true``: see below).

``broker`` names a broker (``tier.broker_name``) and reads every incarnation of it: its
own prefix and each ``<name>--<n>`` a rejoin after a takeover wrote under
(``cluster.layout``), so nothing a later life stored is missed; a comma-separated list
reads several brokers, ``*`` every broker in the tier (each prefix holding tiered queue
metadata), and an incarnation's prefix itself (``broker-0--1``) that incarnation only.

Damaged tier objects (``tiered.scan``) never fail a read: their intact records are read,
the rest skipped and logged at ERROR by the executor.  With ``damage_rows``, each
partition also yields one marker row per damaged object (``queue_id`` -1, the object's
path and what was wrong in the properties ``chronomq.damaged_object`` and
``chronomq.damage``), so a job can report them on the driver (``spark.jobs`` does).

Filter push-down: ``topic = / IN``, ``store_at_ms`` bounds and ``key =`` are handled by the
source (exactly: Spark does not evaluate them again); topic and time skip whole
segments using the tier's metadata, the key is checked while decoding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from store.names import INCARNATION_SEP, MAX_NAME, check_readable, is_name
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.s3 import S3Provider, S3Settings
from tiered.scan import SCHEMA as ARROW_SCHEMA
from tiered.scan import Damage, ScanSlice, Selection, decode_slice, log_damage, plan, tier_prefixes

SCHEMA = ("topic string, queue_id int, queue_offset long, message_id string, key string, "
          "tag string, born_at_ms long, store_at_ms long, deliver_at_ms long, "
          "properties map<string,string>, body binary")
DAMAGE_QUEUE_ID = -1  # marks a damage row (a record's queue id is a u16)
DAMAGED_OBJECT = "chronomq.damaged_object"
DAMAGE_REASON = "chronomq.damage"
ALL_BROKERS = "*"


@dataclass(frozen=True, slots=True)
class TierLocation:
    """Where the tier is, as plain values (picklable; executors open it themselves)."""

    path: str = ""
    s3_bucket: str = ""
    s3_prefix: str = ""
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    broker: str = "broker-0"  # broker names, comma-separated, or "*": broker_prefixes

    @staticmethod
    def from_tier(tier: Any, local_dir: str) -> TierLocation:
        """The tier a broker writes to, from its ``[tier]`` settings (a
        ``chronomq.config.TierConfig``; the S3 fields share their names), read for every
        incarnation of the broker."""
        if tier.provider == "s3":
            return TierLocation(broker=tier.broker_name, **{
                f: getattr(tier, f) for f in TierLocation.__slots__ if f.startswith("s3_")})
        if tier.provider != "local":
            raise ValueError(f"a {tier.provider!r} tier cannot be read outside the broker")
        return TierLocation(path=local_dir, broker=tier.broker_name)

    @staticmethod
    def from_options(options: dict[str, str]) -> TierLocation:
        o = {k.lower(): v for k, v in options.items()}
        loc = TierLocation(**{f: o[f] for f in TierLocation.__slots__ if o.get(f)})
        if not loc.path and not loc.s3_bucket:
            raise ValueError("the chronomq data source needs the option 'path' (a "
                             "local-directory tier) or 's3_bucket'")
        broker_names(loc.broker)
        return loc

    def open(self) -> Provider:
        if self.s3_bucket:
            return S3Provider(S3Settings(
                bucket=self.s3_bucket, prefix=self.s3_prefix,
                endpoint_url=self.s3_endpoint_url, region=self.s3_region,
                access_key_id=self.s3_access_key_id,
                secret_access_key=self.s3_secret_access_key))
        return LocalProvider(self.path)


def broker_names(option: str) -> tuple[str, ...]:
    """The brokers the ``broker`` option names (comma-separated; ``*``: every one); a
    ValueError naming the option for one that is not a broker name."""
    names = tuple(n.strip() for n in option.split(","))
    for name in names:
        if name != ALL_BROKERS and not is_name(name):
            raise ValueError(
                f"the chronomq data source's option 'broker' names {name[:140]!r}, not a "
                f"broker: use broker names (1-{MAX_NAME} characters from A-Z a-z 0-9 _ -), "
                f"comma-separated, or {ALL_BROKERS} for every broker in the tier")
    return names


def broker_prefixes(provider: Provider, option: str) -> list[str]:
    """The tier prefixes the ``broker`` option reads: each broker named, then each later
    incarnation of it the tier holds (``<name>--<n>``, oldest first); for ``*``, every
    prefix holding tiered queue metadata."""
    names = broker_names(option)
    if ALL_BROKERS in names:
        return tier_prefixes(provider)
    prefixes: list[str] = []
    for name in names:
        later = re.compile(re.escape(name + INCARNATION_SEP) + "([0-9]+)")
        found = [(int(m[1]), p) for p in tier_prefixes(provider, name + INCARNATION_SEP)
                 if (m := later.fullmatch(p))]
        prefixes += [name, *(p for _, p in sorted(found))]
    return list(dict.fromkeys(prefixes))


def selection_from_options(options: dict[str, str]) -> Selection:
    o = {k.lower(): v for k, v in options.items()}
    topics = frozenset(t.strip() for t in o.get("topic", "").split(",") if t.strip())
    for t in topics:
        check_readable(t)
    return Selection(topics, int(o.get("start_ms") or 0), int(o.get("end_ms") or 0),
                     o.get("key", ""))


class SlicePartition(InputPartition):
    """One slice to read, or none: a partition that only carries damage found while
    planning (queue metadata copies that do not parse)."""

    def __init__(self, s: ScanSlice | None, damaged: tuple[Damage, ...] = ()) -> None:
        super().__init__(s)
        self.slice = s
        self.damaged = damaged


def damage_rows(damaged: list[Damage], topics: list[str],
                selection: Selection) -> pa.RecordBatch:
    """One marker row per damaged object (of topic ``topics[i]``); its other columns
    satisfy the selection, so a filter Spark evaluates again keeps it."""
    n = len(damaged)
    return pa.RecordBatch.from_pydict({
        "topic": topics, "queue_id": [DAMAGE_QUEUE_ID] * n, "queue_offset": [-1] * n,
        "message_id": [""] * n, "key": [selection.key] * n, "tag": [""] * n,
        "born_at_ms": [0] * n, "store_at_ms": [selection.start_ms] * n,
        "deliver_at_ms": [0] * n,
        "properties": [[(DAMAGED_OBJECT, d.path), (DAMAGE_REASON, d.reason)]
                       for d in damaged],
        "body": [b""] * n}, schema=ARROW_SCHEMA)


class ChronomqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "chronomq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ChronomqReader(dict(self.options))


class ChronomqReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.location = TierLocation.from_options(options)
        self.selection = selection_from_options(options)
        o = {k.lower(): v for k, v in options.items()}
        self.max_slice_bytes = int(o.get("max_slice_bytes") or 64 << 20)
        self.damage_rows = o.get("damage_rows", "").lower() == "true"

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        sel = self.selection
        for f in filters:
            attribute: tuple[str, ...] = getattr(f, "attribute", ())  # NOT/AND/OR: none
            column = attribute[0] if len(attribute) == 1 else ""
            pushed = _narrow(sel, column, f)
            if pushed is None:
                yield f
            else:
                sel = pushed
        self.selection = sel

    def partitions(self) -> Sequence[InputPartition]:
        damaged: list[Damage] = []
        provider = self.location.open()
        slices = [s for prefix in broker_prefixes(provider, self.location.broker)
                  for s in plan(provider, prefix, self.selection, self.max_slice_bytes,
                                _noting(damaged))]
        parts = [SlicePartition(s) for s in slices]
        if damaged or not parts:
            parts.append(SlicePartition(None, tuple(damaged)))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        s: ScanSlice | None = partition.slice  # type: ignore[attr-defined]
        damaged: list[Damage] = list(partition.damaged)  # type: ignore[attr-defined]
        if s is not None:
            yield from decode_slice(self.location.open(), s, self.selection,
                                    _noting(damaged))
        if self.damage_rows and damaged:
            # planning damage is a queue metadata copy: <broker>/meta/<topic>/<queue>.json
            topics = [s.topic if s else d.path.split("/", 2)[-1].rpartition("/")[0]
                      for d in damaged]
            yield damage_rows(damaged, topics, self.selection)


def _noting(damaged: list[Damage]) -> Callable[[Damage], None]:
    """Log each damaged object (at ERROR) and keep it in ``damaged``."""
    def note(damage: Damage) -> None:
        log_damage(damage)
        damaged.append(damage)
    return note


def _narrow(sel: Selection, column: str, f: Filter) -> Selection | None:
    """``sel`` narrowed by filter ``f``, or None when the source cannot apply it exactly."""
    value: Any = getattr(f, "value", None)
    if column == "topic":
        if isinstance(f, EqualTo) and isinstance(value, str):
            wanted = frozenset({value})
        elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            wanted = frozenset(f.value)
        else:
            return None
        return replace(sel, topics=sel.topics & wanted if sel.topics else wanted)
    if column == "key" and isinstance(f, EqualTo) and isinstance(value, str) and value:
        if sel.key and sel.key != value:
            return None  # a second, different key: Spark evaluates it (and finds nothing)
        return replace(sel, key=value)
    if column == "store_at_ms" and isinstance(value, int):
        if isinstance(f, GreaterThanOrEqual | GreaterThan):
            start = value + (1 if isinstance(f, GreaterThan) else 0)
            return replace(sel, start_ms=max(sel.start_ms, start))
        if isinstance(f, LessThan | LessThanOrEqual):
            end = value + (1 if isinstance(f, LessThanOrEqual) else 0)
            return replace(sel, end_ms=min(sel.end_ms, end) if sel.end_ms else end)
    return None
