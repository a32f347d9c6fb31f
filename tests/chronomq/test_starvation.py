"""Idle streams and parked long polls must not take the threads short calls need: with the
stream and long-poll budgets full, Send, Stats and health still answer, and one call more
of a full kind is refused RESOURCE_EXHAUSTED (never queued behind the others)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.config import PopConfig
from chronomq.v1 import broker_pb2 as pb
from testkit.wait import wait_until
from tests.conftest import RunningServer, broker_config

STREAMS, POLLS = 24, 24


def _idle_subscribe(channel: grpc.Channel, opened: threading.Event,
                    stop: threading.Event) -> Iterator[pb.SubscribeRequest]:
    yield pb.SubscribeRequest(topic="idle", group="g", invisible_time_s=30)
    opened.set()
    stop.wait(60)


def test_idle_streams_and_long_polls_leave_room_for_short_calls(tmp_path: Path) -> None:
    config = dataclasses.replace(
        broker_config(tmp_path / "data", worker_threads=4, max_streams=STREAMS,
                      max_long_polls=POLLS, max_waiting_per_connection=STREAMS + POLLS),
        pop=PopConfig(max_wait_ms=60_000))
    server = RunningServer(config)
    stop = threading.Event()
    calls: list[grpc.Future] = []
    channels = [grpc.insecure_channel(server.target) for _ in range(4)]
    try:
        with server.client() as client:
            client.create_topic("idle")
            client.create_topic("work")
        stubs = [pb_grpc_stub(c) for c in channels]
        opened = []
        for i in range(STREAMS):  # every stream the budget allows, all idle
            ev = threading.Event()
            it = stubs[i % 4].Subscribe(_idle_subscribe(channels[i % 4], ev, stop))
            calls.append(it)
            opened.append(ev)
        for i in range(POLLS):  # every long poll the budget allows, all parked
            calls.append(stubs[i % 4].Pop.future(pb.PopRequest(
                topic="idle", group="p", max_messages=1, invisible_time_s=30,
                wait_ms=60_000), timeout=90))
        assert all(ev.wait(10) for ev in opened)
        wait_until(lambda: _stat(server, "rpc.open_streams") == STREAMS, 10,
                   f"{STREAMS} open streams", show=lambda: _stat(server, "rpc.open_streams"),
                   poll_s=0.05)
        wait_until(lambda: _stat(server, "rpc.parked_long_polls") == POLLS, 10,
                   f"{POLLS} parked long polls",
                   show=lambda: _stat(server, "rpc.parked_long_polls"), poll_s=0.05)
        with server.client(timeout_s=5) as client:
            t0 = time.monotonic()
            assert client.send([message("work", b"still served")])[0].ok
            assert client.stats()["rpc.open_streams"] == STREAMS
            health = health_pb2_grpc.HealthStub(channels[0]).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert time.monotonic() - t0 < 4  # answered, not stuck behind the waiters
            with pytest.raises(RpcError) as refused:  # one long poll more
                client.pop("idle", "p", max_messages=1, wait_ms=60_000)
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "server.max_long_polls" in refused.value.details
            assert client.pop("work", "p", max_messages=1, wait_ms=0)  # no wait: served
            extra = client.subscribe("idle", "g2")  # one stream more
            with pytest.raises(RpcError) as refused_stream:
                next(iter(extra.responses()))
            assert refused_stream.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            extra.close()
    finally:
        stop.set()
        for c in calls:
            c.cancel()
        for ch in channels:
            ch.close()
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < config.server.shutdown_grace_s + 5


def pb_grpc_stub(channel: grpc.Channel) -> object:
    from chronomq.v1 import broker_pb2_grpc
    return broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]


def _stat(server: RunningServer, name: str) -> float:
    with ChronomqClient(server.target, timeout_s=5) as client:
        return client.stats().get(name, -1)
