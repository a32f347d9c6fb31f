"""Prometheus endpoint: the Stats figures as metric families that follow Prometheus's
conventions.

* one family per quantity, with what varies as labels: ``group.<g>.<t>.lag`` becomes
  ``chronomq_group_lag_messages{group="g",topic="t"}``, not a family per group;
  ``takeover.<b>.pending`` becomes ``chronomq_takeover_pending{broker="b"}`` (and
  ``mount.<b>.*`` likewise);
* counters (figures that only grow while the broker runs) end in ``_total``;
* base units: times in seconds (``_seconds``), sizes in bytes (``_bytes``);
* the timer's lateness buckets (``timer.lateness_le_<N>ms``, each counting its own range)
  become one cumulative histogram ``chronomq_timer_lateness_seconds``.

``family(name)`` maps a flat figure name to ``(family, kind, labels, scale)``; every other
figure is a gauge named ``chronomq_<figure>`` with its dots turned into underscores.  The
README's metrics table lists the families.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# figures that only grow while the broker runs (reset by a restart)
COUNTERS = frozenset({
    "commitlog.appended_batches", "commitlog.fsyncs", "disk.refused_sends",
    "disk.reserve_releases", "pop.acked", "pop.dead_lettered", "pop.durable_syncs",
    "pop.popped", "pop.recovered_copies", "pop.released", "pop.revived", "rpc.popped",
    "rpc.refused_waits", "rpc.sent", "store.damaged_records", "store.messages_appended",
    "timer.cancelled", "timer.delivered", "timer.rescheduled", "timer.flat_damaged_objects",
    "tier.uploaded_records", "tier.uploaded_bytes", "tier.upload_batches",
    "tier.failed_uploads", "tier.expired_objects", "tier.reused_records",
    "tier.damaged_objects", "tier.cache_hits", "tier.cache_fetches", "tier.cache_fetched",
    "tier.cache_expired_unread", "rocketmq.sent", "rocketmq.received", "rocketmq.acked",
    "gc.collections_young", "gc.collections_middle", "gc.collections_full",
    "gc.pause_seconds", "gc.collected_objects", "access.denied", "access.refresh_failures",
})
GROUP_FIGURES = {  # group.<group>.<topic>.<figure>
    "in_flight": ("chronomq_group_in_flight_messages", "gauge",
                  "leased, not yet acked, released or revived"),
    "backlog": ("chronomq_group_backlog_messages", "gauge", "visible, not yet leased"),
    "lag": ("chronomq_group_lag_messages", "gauge", "not yet acked"),
    "redelivered": ("chronomq_group_redelivered", "counter",
                    "copies put on the retry topic (revive and release)"),
    "dead_lettered": ("chronomq_group_dead_lettered", "counter",
                      "moved to the dead-letter topic"),
}
BROKER_FIGURES = ("takeover.", "mount.")  # <kind>.<broker>.<figure>: broker as a label
MS_TIMESTAMPS = frozenset({"timer.last_delivery_ms", "timer.next_due_ms",
                           "tier.last_upload_ms"})
_LATENESS = re.compile(r"timer\.lateness_(le_(\d+)ms|over_\d+ms)$")


class FigureSource(Protocol):
    def figures(self) -> dict[str, float]: ...


def _plain(name: str) -> str:
    return "chronomq_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def family(name: str) -> tuple[str, str, dict[str, str], float]:
    """``(family, kind, labels, scale)`` of one flat figure (not the lateness buckets);
    ``kind`` is "gauge" or "counter" (a counter family's samples add ``_total``)."""
    if name.startswith("group."):
        group, rest = name[len("group."):].split(".", 1)  # group names hold no dot
        topic, figure = rest.rsplit(".", 1)
        if figure in GROUP_FIGURES:
            fam, kind, _ = GROUP_FIGURES[figure]
            return fam, kind, {"group": group, "topic": topic}, 1.0
    if name.startswith(BROKER_FIGURES):  # broker names hold no dot
        kind, broker, figure = name.split(".", 2)
        return _plain(f"{kind}.{figure}"), "gauge", {"broker": broker}, 1.0
    if name in MS_TIMESTAMPS:
        return _plain(name[:-len("_ms")]) + "_timestamp_seconds", "gauge", {}, 0.001
    if name.endswith("_s"):
        return _plain(name[:-len("_s")]) + "_seconds", "gauge", {}, 1.0
    if name in COUNTERS:
        return _plain(name), "counter", {}, 1.0
    return _plain(name), "gauge", {}, 1.0


def families(figures: dict[str, float]) -> list[Metric]:
    """The metric families of one Stats snapshot."""
    grouped: dict[tuple[str, str], list[tuple[dict[str, str], float]]] = defaultdict(list)
    lateness: list[tuple[float, float]] = []  # (upper bound in s or inf, count in range)
    for name, value in figures.items():
        m = _LATENESS.match(name)
        if m:
            lateness.append((int(m.group(2)) / 1000 if m.group(2) else float("inf"), value))
            continue
        fam, kind, labels, scale = family(name)
        grouped[(fam, kind)].append((labels, value * scale))
    out: list[Metric] = []
    docs = {fam: doc for fam, _, doc in GROUP_FIGURES.values()}
    for (fam, kind), samples in sorted(grouped.items()):
        label_names = sorted(samples[0][0])
        doc = docs.get(fam, f"chronomq figure {fam.removeprefix('chronomq_')}")
        metric: GaugeMetricFamily | CounterMetricFamily = (
            CounterMetricFamily(fam, doc, labels=label_names) if kind == "counter"
            else GaugeMetricFamily(fam, doc, labels=label_names))
        for labels, value in samples:
            metric.add_metric([labels[k] for k in label_names], value)
        out.append(metric)
    if lateness:
        buckets, running = [], 0.0
        for upper, count in sorted(lateness):
            running += count
            buckets.append(("+Inf" if upper == float("inf") else f"{upper:g}", running))
        if buckets[-1][0] != "+Inf":
            buckets.append(("+Inf", running))
        out.append(HistogramMetricFamily(
            "chronomq_timer_lateness_seconds",
            "delayed messages appended (made consumable) this long after their due time",
            buckets=buckets))
    return out


class _FiguresCollector:
    def __init__(self, source: FigureSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(self._source.figures())


def start_metrics(host: str, port: int, source: FigureSource) -> Callable[[], None]:
    """Serve ``/metrics`` on ``host:port``; return a function that stops it."""
    registry = CollectorRegistry()
    registry.register(_FiguresCollector(source))
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop
