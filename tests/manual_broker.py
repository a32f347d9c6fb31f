"""ManualBroker: a broker in this process over real gRPC on 127.0.0.1 whose clock is a
manual one and whose timer and schedules are driven by hand (``tick``), for the tests
of delayed delivery through the public API (debounce, schedules, ids shared by several
messages).  Nothing here stands in for a component: ``tick`` calls what the timer and
schedules threads would call at that time."""

from __future__ import annotations

import time
from pathlib import Path

from chronomq.config import BrokerConfig
from store.clock import ManualClock
from tests.conftest import RunningServer, broker_config, run_timer


class ManualBroker:
    def __init__(self, root: Path, topics: dict[str, int], config: BrokerConfig | None = None,
                 start_ms: int | None = None) -> None:
        self.clock = ManualClock(int(time.time() * 1000) if start_ms is None else start_ms)
        self.running = RunningServer(config or broker_config(root / "data"), self.clock,
                                     background=False)
        self.broker = self.running.server.broker
        self.client = self.running.client()
        for name, queue_count in topics.items():
            self.client.create_topic(name, queue_count=queue_count)

    def tick(self, ms: int) -> int:
        """Move the clock and do what the schedules and timer threads would do: fire the
        schedules due, write what is parked, preload the hour's TimerFlatFiles, load and
        deliver what is due (visible on return).  Returns the messages schedules sent."""
        now = self.clock.advance(ms)
        sent = self.broker.schedules.fire_due(now)
        self.broker.timer.write_parked(force=True)
        self.broker.timer.preload_due(now)
        run_timer(self.broker, now)
        return sent

    def bodies(self, topic: str, group: str = "g") -> list[bytes]:
        """Pop what is visible (up to 32), ack it, return the bodies sorted."""
        got = self.client.pop(topic, group, max_messages=32)
        if got:
            assert self.client.ack(group, [m.receipt_handle for m in got]) == [""] * len(got)
        return sorted(m.body for m in got)

    def close(self) -> None:
        self.client.close()
        self.running.stop()
