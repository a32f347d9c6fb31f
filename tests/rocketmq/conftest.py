"""A broker with its RocketMQ 5 front on 127.0.0.1, driven by a manual clock.

The clock starts at the wall-clock time, because RocketMQ clients compute delivery
timestamps from their own clock; tests then move it with ``tick``, which runs the timer
and the revive step by hand (the background threads are off).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.config import RocketMQConfig
from chronomq.rocketmq.pb import service_grpc
from pop.flowcontrol import KeyLimits
from store.clock import ManualClock
from store.topics import Topic
from tests.conftest import RunningServer, broker_config


class RocketMQEnv:
    def __init__(self, root: Path, server: dict[str, object] | None = None,
                 key_limits: dict[str, KeyLimits] | None = None,
                 **rocketmq: object) -> None:
        config = dataclasses.replace(
            broker_config(root / "data", **(server or {})),
            rocketmq=RocketMQConfig(enabled=True, host="127.0.0.1", port=0,
                                    **rocketmq),  # type: ignore[arg-type]
            key_limits=key_limits or {})
        self.clock = ManualClock(int(time.time() * 1000))
        self.running = RunningServer(config, self.clock, background=False)
        self.broker = self.running.server.broker
        self.endpoint = f"127.0.0.1:{self.running.server.rocketmq_port}"
        for name in ("orders", "other"):
            self.broker.create_topic(Topic(name, 4))
        tls = self.running.config.server.tls_cert_file
        self.channel = grpc.secure_channel(self.endpoint, grpc.ssl_channel_credentials(
            Path(tls).read_bytes())) if tls else grpc.insecure_channel(self.endpoint)
        self.stub = service_grpc.MessagingServiceStub(self.channel)

    def tick(self, ms: int) -> int:
        """Move the clock and do what the timer and revive threads would do."""
        now = self.clock.advance(ms)
        while not self.broker.timer.load_due(now):
            pass
        self.broker.timer.deliver_due(now)
        front = self.running.server.rocketmq
        front.renew_leases(now)  # the scheduled job's step
        self.broker.pop.revive_due(now)
        self.broker.store.wait_visible()
        return now

    def close(self) -> None:
        self.channel.close()
        self.running.stop()


@pytest.fixture
def rmq(tmp_path: Path) -> Iterator[RocketMQEnv]:
    env = RocketMQEnv(tmp_path)
    yield env
    env.close()
