"""A Subscribe stream's acks with ``tier.durable_ack``: a real broker over gRPC on
127.0.0.1, its tier a memory provider behind a gate that holds every write.

Seen from outside (issue 39): a ``Consumer`` took and acked 0.14x of what it does
without durable-ack, because the stream applied one request's acks, waited for their
tier commit, and only then read the next request: one commit per request, and the
credit of the acked messages back only after it.  Now a request's acks are applied at
once and reported (``settled_through``) once durable, in order, while the next requests
are applied meanwhile; an ack that cannot be made durable ends the stream, so the
client counts it as unknown, never as done.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

import chronomq.broker
from chronomq.client import ChronomqClient
from chronomq.v1 import broker_pb2 as pb
from tests.chronomq.test_duplicate_durability import Faulty
from tests.conftest import RunningServer, broker_config
from tiered.config import TierConfig
from tiered.providers.memory import MemoryProvider

UPLOAD_TIMEOUT_S = 2.0


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunningServer,
                                                                             Faulty]]:
    faulty = Faulty(MemoryProvider())
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: faulty)
    config = replace(broker_config(tmp_path / "data"), tier=TierConfig(
        provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
        upload_timeout_s=UPLOAD_TIMEOUT_S))
    server = RunningServer(config)
    try:
        yield server, faulty
    finally:
        faulty.release()
        server.stop()


class Stream:
    """A raw Subscribe stream: requests put by the test, responses read on a thread."""

    def __init__(self, c: ChronomqClient, first: pb.SubscribeRequest) -> None:
        self._requests: queue.SimpleQueue[pb.SubscribeRequest | None] = queue.SimpleQueue()
        self._requests.put(first)
        # responses, then the error that ended the stream, or None when it ended cleanly
        self.responses: queue.SimpleQueue[pb.SubscribeResponse | grpc.RpcError | None] = \
            queue.SimpleQueue()
        self._call = c.stub.Subscribe(iter(self._requests.get, None), metadata=c.metadata,
                                      timeout=60)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for r in self._call:
                self.responses.put(r)
        except grpc.RpcError as exc:
            self.responses.put(exc)
        else:
            self.responses.put(None)

    def send(self, request: pb.SubscribeRequest) -> None:
        self._requests.put(request)

    def messages(self, n: int) -> list[pb.ReceivedMessage]:
        got: list[pb.ReceivedMessage] = []
        while len(got) < n:
            r = self.responses.get(timeout=30)
            assert isinstance(r, pb.SubscribeResponse), r
            got += r.messages
        return got

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


def _wait(predicate: object, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_a_streams_next_acks_are_applied_while_the_first_wait_for_the_tier(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, faulty = gated
    with server.client() as c:
        c.create_topic("t")
        for _ in range(10):
            c.send_one("t", b"x")
        stream = Stream(c, pb.SubscribeRequest(topic="t", group="g", invisible_time_s=60,
                                               max_outstanding=10))
        try:
            handles = [m.receipt_handle for m in stream.messages(10)]
            # Given the tier holds every write from now on (no commit completes)
            faulty.hold()
            # When two requests ack five messages each
            stream.send(pb.SubscribeRequest(ack=handles[:5], settle_id=1))
            stream.send(pb.SubscribeRequest(ack=handles[5:], settle_id=2))
            # Then both are applied while neither is durable, and neither is reported
            assert _wait(lambda: c.stats()["pop.acked"] == 10), c.stats()["pop.acked"]
            assert faulty.held > 0
            while not stream.responses.empty():
                r = stream.responses.get()
                assert isinstance(r, pb.SubscribeResponse) and not r.settled_through, r
            # and once the tier takes the writes, both are reported, in order
            faulty.release()
            through = 0
            while through < 2:
                r = stream.responses.get(timeout=30)
                assert isinstance(r, pb.SubscribeResponse), r
                assert not r.errors
                assert r.settled_through == 0 or r.settled_through > through
                through = max(through, r.settled_through)
        finally:
            stream.close()


def test_acks_that_cannot_reach_the_tier_end_the_stream_unreported(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, faulty = gated
    with server.client() as c:
        c.create_topic("t")
        for _ in range(3):
            c.send_one("t", b"x")
        stream = Stream(c, pb.SubscribeRequest(topic="t", group="g", invisible_time_s=60,
                                               max_outstanding=3))
        try:
            handles = [m.receipt_handle for m in stream.messages(3)]
            faulty.refuse = "/"  # every write to the tier fails from now on
            stream.send(pb.SubscribeRequest(ack=handles, settle_id=1))
            # the acks' wait times out (tier.upload_timeout_s): the stream ends, and
            # settled_through never says 1
            while True:
                r = stream.responses.get(timeout=UPLOAD_TIMEOUT_S * 10)
                if not isinstance(r, pb.SubscribeResponse):
                    break  # ended: with an error, or cleanly
                assert r.settled_through != 1, "acks reported done though not durable"
        finally:
            stream.close()
