"""Prometheus endpoint: every Stats figure as a gauge named ``chronomq_<figure>``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric


class FigureSource(Protocol):
    def figures(self) -> dict[str, float]: ...


class _FiguresCollector:
    def __init__(self, source: FigureSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._source.figures().items()):
            metric = "chronomq_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)
            yield GaugeMetricFamily(metric, f"chronomq figure {name}", value=value)


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
