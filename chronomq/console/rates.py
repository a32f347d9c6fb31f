"""Rates over the last minutes: the console's sends/s, deliveries/s and acks/s.

The broker's figures are counters since start (``rpc.sent``, ``timer.delivered``,
``pop.popped``, ``pop.acked``).  A ``RateSampler`` reads them every ``interval_s`` (a
scheduler job of the console) into a ring of ``keep`` samples, and ``series`` turns
neighbouring samples into per-second rates.  Memory: ``keep`` samples of a few numbers.
Thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

# what the overview charts, and the counters each rate is made of
RATES: dict[str, tuple[str, ...]] = {
    "sent": ("rpc.sent", "rocketmq.sent"),
    "due": ("timer.delivered",),
    "delivered": ("pop.popped",),
    "acked": ("pop.acked",),
}


class RateSampler:
    def __init__(self, figures: Callable[[], dict[str, float]],
                 now_s: Callable[[], float], keep: int = 180) -> None:
        self._figures = figures
        self._now_s = now_s
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=keep)

    def sample(self, figures: dict[str, float] | None = None) -> None:
        f = self._figures() if figures is None else figures
        values = {name: sum(f.get(k, 0.0) for k in keys) for name, keys in RATES.items()}
        with self._lock:
            self._samples.append((self._now_s(), values))

    def series(self) -> dict[str, list[float]]:
        """``{"t": [unix s], "<rate>": [per second], ...}``, one point per sample interval
        (the first sample has no rate and is left out)."""
        with self._lock:
            samples = list(self._samples)
        out: dict[str, list[float]] = {"t": [], **{name: [] for name in RATES}}
        for (t0, a), (t1, b) in itertools.pairwise(samples):
            dt = t1 - t0
            if dt <= 0:
                continue
            out["t"].append(round(t1, 3))
            for name in RATES:  # a counter reset (restart) reads as 0, never negative
                out[name].append(round(max(0.0, b[name] - a[name]) / dt, 2))
        return out
