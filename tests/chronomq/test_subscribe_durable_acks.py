"""A Subscribe stream's acks with ``tier.durable_ack``: a real broker over gRPC on
127.0.0.1, its tier a memory provider behind a gate that holds every write.

Seen from outside (issue 39): a ``Consumer`` took and acked 0.14x of what it does
without durable-ack, because the stream applied one request's acks, waited for their
tier commit, and only then read the next request: one commit per request, and the
credit of the acked messages back only after it.  Now a request's acks are applied at
once and reported (``settled_through``) once durable, in order, while the next requests
are applied meanwhile; an ack that cannot be made durable ends the stream, so the
client counts it as unknown, never as done.  And the ``Consumer``'s credit follows the
stream by itself (a later request may change it): it grows when the loop finds nothing
waiting, within what the loop takes in half an invisible time, and its acks gather while
its requests wait for the tier; the ``Producer``'s window of batches in flight grows when
full batches wait for a slot.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

import chronomq.broker
from chronomq.api.subscription import MAX_CREDIT
from chronomq.client import ChronomqClient, message
from chronomq.client.consumer import (
    AUTO_MAX,
    AUTO_START,
    PREFETCH_BYTES,
    SETTLE_IN_FLIGHT,
    Consumer,
    grown_credit,
)
from chronomq.client.producer import AUTO_START as PRODUCER_AUTO_START
from chronomq.client.producer import Producer
from chronomq.v1 import broker_pb2 as pb
from tests.chronomq.test_duplicate_durability import Faulty
from tests.conftest import RunningServer, broker_config
from tiered.config import TierConfig
from tiered.providers.memory import MemoryProvider

UPLOAD_TIMEOUT_S = 2.0


@contextmanager
def _gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upload_timeout_s: float
           ) -> Iterator[tuple[RunningServer, Faulty]]:
    faulty = Faulty(MemoryProvider())
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: faulty)
    config = replace(broker_config(tmp_path / "data"), tier=TierConfig(
        provider="memory", upload=True, durable_ack=True, durable_ack_ms=1,
        upload_timeout_s=upload_timeout_s))
    server = RunningServer(config)
    try:
        yield server, faulty
    finally:
        faulty.release()
        server.stop()


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunningServer,
                                                                             Faulty]]:
    with _gated(tmp_path, monkeypatch, UPLOAD_TIMEOUT_S) as pair:
        yield pair


@pytest.fixture
def gated_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[tuple[RunningServer, Faulty]]:
    """``gated``, but a held tier times waits out only after 30 s (room for a slow
    machine between the hold and the release)."""
    with _gated(tmp_path, monkeypatch, 30.0) as pair:
        yield pair


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


@contextmanager
def subscribed(c: ChronomqClient, messages: int, credit: int) -> Iterator[Stream]:
    """Topic ``t`` with ``messages`` messages, and a raw Subscribe stream of group ``g``
    on it with ``credit``; closed after."""
    c.create_topic("t")
    for _ in range(messages):
        c.send_one("t", b"x")
    stream = Stream(c, pb.SubscribeRequest(topic="t", group="g", invisible_time_s=60,
                                           max_outstanding=credit))
    try:
        yield stream
    finally:
        stream.close()


def _filled(c: ChronomqClient, messages: int) -> None:
    """Topic ``t`` (two queues) with ``messages`` messages, sent 500 a request."""
    c.create_topic("t", queue_count=2)
    for _ in range(0, messages, 500):
        assert all(o.ok for o in c.send([message("t", b"x")] * 500))

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
    with server.client() as c, subscribed(c, 10, 10) as stream:
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


def test_acks_that_cannot_reach_the_tier_end_the_stream_unreported(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, faulty = gated
    with server.client() as c, subscribed(c, 3, 3) as stream:
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


def test_a_later_request_changes_the_streams_credit(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, _ = gated
    with server.client() as c, subscribed(c, 8, 2) as stream:
        first = stream.messages(2)
        # When a request raises the credit to 5 (nothing settled)
        stream.send(pb.SubscribeRequest(max_outstanding=5))
        # Then three more come, and no more
        more = stream.messages(3)
        assert len(first) + len(more) == 5
        assert {m.message_id for m in first}.isdisjoint(m.message_id for m in more)
        with pytest.raises(queue.Empty):
            stream.responses.get(timeout=1.0)


def test_the_credit_grows_when_the_loop_waits_within_what_it_handles_in_time() -> None:
    assert grown_credit(AUTO_START, rate_per_s=0, invisible_time_s=30) == AUTO_START
    assert grown_credit(256, rate_per_s=10_000, invisible_time_s=30) == 1024  # x4
    assert grown_credit(4096, rate_per_s=10_000, invisible_time_s=30) == AUTO_MAX
    # a slow loop (10 a second, 30 s leases) never prefetches what it cannot take in time
    assert grown_credit(256, rate_per_s=10, invisible_time_s=30) == 256
    assert grown_credit(256, rate_per_s=40, invisible_time_s=30) == 600  # 600 in 15 s
    assert grown_credit(300, rate_per_s=40, invisible_time_s=10) == 300  # never shrinks
    assert grown_credit(256, rate_per_s=100, invisible_time_s=10) == 500
    # large bodies: never more than PREFETCH_BYTES of them ahead (1,024 of 64 KiB)
    assert grown_credit(512, rate_per_s=10_000, invisible_time_s=30,
                        message_bytes=64 << 10) == PREFETCH_BYTES // (64 << 10) == 1024
    assert grown_credit(1024, rate_per_s=10_000, invisible_time_s=30,
                        message_bytes=64 << 10) == 1024
    # never past what a broker takes (a larger max_outstanding is refused)
    assert grown_credit(4096, rate_per_s=10_000, invisible_time_s=30,
                        message_bytes=100) == AUTO_MAX == MAX_CREDIT


def test_a_consumer_on_a_durable_ack_broker_raises_its_credit_by_itself(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, _ = gated
    with server.client() as c:
        _filled(c, 10_000)
        taken = 0
        with Consumer(c, "t", "g") as consumer:
            assert consumer.credit == AUTO_START
            while taken < 10_000:
                m = consumer.receive(timeout_s=30)
                assert m is not None
                consumer.ack(m)
                taken += 1
            assert consumer.flush(60)
            # every lease waited for a tier commit: the loop found nothing waiting at
            # times, and the credit grew (within what it takes in 15 s)
            assert consumer.credit > AUTO_START
        assert c.stats()["pop.acked"] == 10_000


@pytest.mark.parametrize("in_flight", [None, 4], ids=["default", "fixed"])
def test_a_producer_on_a_durable_ack_broker_widens_its_window_by_itself(
        gated: tuple[RunningServer, Faulty], in_flight: int | None) -> None:
    server, faulty = gated
    with server.client() as c:
        c.create_topic("t", queue_count=2)
        producer = Producer(c, **({} if in_flight is None else {"in_flight": in_flight}))
        try:
            assert producer.in_flight == PRODUCER_AUTO_START
            # Given the tier holds every commit: four batches fly, unanswered
            faulty.hold()
            futures = [producer.send("t", b"x") for _ in range(5_000)]
            assert _wait(lambda: producer.batches_sent == PRODUCER_AUTO_START)
            # When the commits go through
            faulty.release()
            assert producer.flush(60)
            assert all(f.result(0).message_id for f in futures)
        finally:
            producer.close()
    # Then the default window grew (full batches had waited for a slot); a fixed one not
    if in_flight is None:
        assert producer.in_flight > PRODUCER_AUTO_START
    else:
        assert producer.in_flight == 4


def test_a_stream_leases_several_batches_before_the_first_is_durable_and_pushes_none_early(
        gated_long: tuple[RunningServer, Faulty]) -> None:
    # (a held tier times the first lease's wait out after 30 s, not 2: leasing the
    # three batches took longer than 2 s once on a loaded machine, and the stream failed)
    server, faulty = gated_long
    with server.client() as c:
        _filled(c, 3_000)
        # Given the tier holds every commit
        faulty.hold()
        stream = Stream(c, pb.SubscribeRequest(topic="t", group="g", invisible_time_s=60,
                                               max_outstanding=3_000))
        try:
            # When the stream leases: all three batches it has credit for are leased
            # while the first waits for the tier, and none leaves the broker yet
            assert _wait(lambda: c.stats()["pop.popped"] == 3_000), c.stats()["pop.popped"]
            assert stream.responses.empty()
            # Then, the commits through, all come, each once
            faulty.release()
            got = stream.messages(3_000)
            assert len({m.message_id for m in got}) == 3_000
        finally:
            stream.close()


def test_a_consumers_acks_gather_while_its_requests_wait_for_the_tier(
        gated: tuple[RunningServer, Faulty]) -> None:
    server, faulty = gated
    with server.client() as c:
        c.create_topic("t")
        assert all(o.ok for o in c.send([message("t", b"x")] * 100))
        with Consumer(c, "t", "g", prefetch=100) as consumer:
            taken = [consumer.receive(timeout_s=30) for _ in range(100)]
            assert all(m is not None for m in taken)
            # Given the tier holds every commit, and SETTLE_IN_FLIGHT requests of one
            # ack each are sent (applied, not answered)
            faulty.hold()
            futures = []
            for i, m in enumerate(taken[:SETTLE_IN_FLIGHT]):
                assert m is not None
                futures.append(consumer.ack(m))
                assert _wait(lambda i=i: c.stats()["pop.acked"] == i + 1)
            # When the loop acks the rest
            futures += [consumer.ack(m) for m in taken[SETTLE_IN_FLIGHT:] if m is not None]
            # Then they wait on the client, gathered, until a request is answered
            time.sleep(0.5)
            assert c.stats()["pop.acked"] == SETTLE_IN_FLIGHT
            assert not any(f.done() for f in futures)
            faulty.release()
            for f in futures:
                f.result(30)
        assert c.stats()["pop.acked"] == 100


def test_a_stream_leases_what_arrives_while_its_first_leases_wait_for_the_tier(
        gated_long: tuple[RunningServer, Faulty]) -> None:
    server, faulty = gated_long
    with server.client() as c, subscribed(c, 1, 100) as stream:
        first = stream.messages(1)
        # Given the tier holds every write: no send or lease is confirmed (the sends'
        # answers wait; their messages are visible here meanwhile)
        faulty.hold()

        def send(body: bytes) -> object:
            return c.stub.Send.future(pb.SendRequest(messages=[message("t", body)]),
                                      metadata=c.metadata, timeout=30)

        sends = [send(b"a")]
        # When more messages arrive while the lease of the first waits for the tier
        assert _wait(lambda: c.stats()["pop.popped"] >= 2)
        sends += [send(b"b") for _ in range(5)]
        # Then they are leased meanwhile (not only after the wait), none sent yet
        assert _wait(lambda: c.stats()["pop.popped"] == 7), c.stats()["pop.popped"]
        assert stream.responses.empty()
        # and once the tier takes the writes, all go out, in the order they were leased
        faulty.release()
        later = stream.messages(6)
        assert [m.body for m in first + later] == [b"x", b"a"] + [b"b"] * 5
        assert all(f.result().results[0].message_id for f in sends)  # type: ignore[attr-defined]
