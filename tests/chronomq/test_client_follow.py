"""A client looking for a topic's owner while no broker answers for it.

Between a broker's loss and its successor's claim (``tier.lease_s``), and again between
the claim and the moment the successor has the topic, a routed call finds no owner that
answers and looks again after a pause.  Seen in the failover chaos (bench/RESULTS.md,
issue 51, fourteenth session): a sender's pauses grew to 1 s (a Producer's and a
Consumer's to 2 s), so a successor that took the topic was found up to a second after
it did, and a NOT_FOUND from the successor still creating the topic cost one more
second: 0.5 s p50 and 3.2 s p99 of a single failure's unavailability were the client's
own.  The pause now grows to ``FOLLOW_BACKOFF_S`` (0.25 s) and no further.

A real broker over gRPC on 127.0.0.1, and a broker address nobody listens on: the topic
is found at the real broker only once it is created there, at the sixth pause.  The
client's pauses are recorded, not slept: no wall-clock timing is asserted.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

import chronomq.client.consumer as consumer_module
import chronomq.client.routing as routing
from chronomq.client import message
from chronomq.client.errors import FOLLOW_BACKOFF_S
from chronomq.client.routing import BrokerDirectory, RoutedClient
from cluster.layout import lease_path
from cluster.ownership import Owner, TopicOwners
from tests.chronomq.test_client_held_topic import (
    REFUSALS,
    Pauses,
    TimeWithPauses,
    record_stream_pauses,
)
from tests.conftest import RunningServer
from tiered.providers.local import LocalProvider


def _nobody() -> str:
    """An address of 127.0.0.1 nobody listens on (a broker that is gone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _creates_t(server: RunningServer) -> Callable[[], None]:
    def create() -> None:
        with server.client() as c:
            c.create_topic("t", queue_count=1)
    return create


def test_a_routed_send_looks_again_at_most_every_follow_backoff(
        server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a gone broker and a broker that has topic t only from the sixth pause on
    pauses = Pauses(_creates_t(server))
    monkeypatch.setattr(routing, "time", TimeWithPauses(pauses))
    directory = BrokerDirectory([_nobody(), server.target])

    # When a routed send follows t until a broker answers for it
    with RoutedClient(directory, follow_s=60) as rc:
        (out,) = rc.send([message("t", b"found")])

    # Then it is stored, and the pauses grew to FOLLOW_BACKOFF_S, not beyond
    assert out.ok, out.error
    assert FOLLOW_BACKOFF_S == 0.25
    assert pauses.asked == [0.1, 0.2, 0.25, 0.25, 0.25, 0.25]


def _delete_t(server: RunningServer) -> None:
    with server.client() as c:
        c.delete_topic("t")


def test_a_producer_looks_again_at_most_every_follow_backoff(server: RunningServer) -> None:
    # Given the same brokers, and an idempotent Producer of the routed client made while
    # t was there
    _creates_t(server)()
    with RoutedClient(BrokerDirectory([_nobody(), server.target]), follow_s=60) as rc:
        producer = rc.producer("t", delivery_timeout_s=60)
        _delete_t(server)
        pauses = Pauses(_creates_t(server))
        record_stream_pauses(producer, pauses)

        # When it sends while no broker answers for t, until the sixth pause
        try:
            outcome = producer.send("t", b"found").result(30)
            asked = list(pauses.asked)
        finally:
            producer.close()

    # Then the message is stored, and no pause was longer than FOLLOW_BACKOFF_S
    assert outcome.ok, outcome.error
    assert len(asked) == REFUSALS
    assert max(asked) == 0.25


def test_a_consumer_looks_again_at_most_every_follow_backoff(
        server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the same brokers
    def create_and_send() -> None:
        _creates_t(server)()
        with server.client() as c:
            (sent,) = c.send([message("t", b"waiting")])
        assert sent.ok, sent.error
    pauses = Pauses(create_and_send)
    monkeypatch.setattr(consumer_module, "time", TimeWithPauses(pauses))

    # When a routed Consumer, made while t was there, subscribes while no broker answers
    # for t
    _creates_t(server)()
    with RoutedClient(BrokerDirectory([_nobody(), server.target]), follow_s=60) as rc:
        consumer = rc.consumer("t", "g")
        _delete_t(server)
        try:
            got = consumer.receive(30)
            asked = list(pauses.asked)
        finally:
            consumer.close()

    # Then it receives the message, and no pause was longer than FOLLOW_BACKOFF_S
    assert got is not None and got.body == b"waiting"
    assert len(asked) == REFUSALS
    assert max(asked) == 0.25


class _FakeTime:
    """``time`` as the routing module sees it: ``sleep`` moves ``monotonic`` on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_a_wait_for_a_paused_owner_ends_at_once_when_its_lease_is_claimed_already(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call to a paused owner timed out; the client waits, reading the bucket, until
    the owner's lease is written again (alive, or claimed).  Seen in the failover chaos
    (fourteenth session): the claim landed between the client's look for a successor
    (none yet) and its read of the lease, which showed the claim already; the client then
    waited for a further change that never comes (nobody writes a claimed lease) for two
    lease lengths, 10 s, before calling again.  Here the claimed lease names a successor
    whose own lease cannot be read yet: the look for a successor finds none, as then."""
    # Given topic t owned by broker a, whose lease b has claimed
    tier = LocalProvider(str(tmp_path))
    assert TopicOwners(tier, Owner("a", "127.0.0.1:7001")).claim("t")
    tier.write(lease_path("a"), json.dumps({
        "broker": "a", "address": "127.0.0.1:7001", "lease_s": 5.0,
        "taken_by": "b"}).encode())
    clock = _FakeTime()
    monkeypatch.setattr(routing, "time", clock)
    # When a client whose call to a timed out waits for the topic to move
    BrokerDirectory(tier=tier).await_move("t", "127.0.0.1:7001", clock.now + 60)
    # Then it does not wait: the claim is the move (the next look follows it)
    assert clock.slept == 0
