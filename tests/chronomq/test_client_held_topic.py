"""A client at a topic its new owner holds while a takeover adopts the topic's state.

Between a takeover's claim and its end, the successor has the departed broker's topics
but answers UNAVAILABLE "being taken over" (``store.holds``): it answers them in a
moment.  Seen in the failover chaos (bench/RESULTS.md, issue 51): clients came back
0.7-2.3 s after the takeover accepted sends, because by then their back-off from the
lost broker had grown to 1-2 s, and a held refusal doubled it again.  A held refusal is
now asked again at the same broker every ``HELD_RETRY_S``, without back-off.

A real broker over gRPC on 127.0.0.1 holds topic ``t``; the client's pauses are
recorded (the module's ``time.sleep``, or the Producer's wait) and the hold is released
at the sixth refusal: no wall-clock timing is asserted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

import chronomq.client.consumer as consumer_module
import chronomq.client.routing as routing
from chronomq.client import message
from chronomq.client.errors import HELD_RETRY_S, being_taken_over
from chronomq.client.producer import Producer
from chronomq.client.routing import BrokerDirectory, RoutedClient
from tests.conftest import RunningServer

REFUSALS = 6  # the hold is released when the client pauses for the sixth time


class Pauses:
    """Records each pause the client asks for; at the ``REFUSALS``-th, ``release``."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.asked: list[float] = []
        self._release = release

    def __call__(self, seconds: float) -> None:
        self.asked.append(round(seconds, 3))
        if len(self.asked) == REFUSALS:
            self._release()


class TimeWithPauses:
    """``time`` as the routing module sees it, its ``sleep`` recorded (not slept)."""

    def __init__(self, pauses: Pauses) -> None:
        self.sleep = pauses
        self.monotonic = time.monotonic


def record_stream_pauses(producer: Producer, pauses: Pauses) -> None:
    """The Producer's stream back-off (its only timed wait off the main thread) goes to
    ``pauses``, not slept."""
    cond = producer._cond
    wait_for = cond.wait_for

    def recorded(predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        if timeout is not None and threading.current_thread() is not threading.main_thread():
            pauses(timeout)
            return predicate()
        return wait_for(predicate, timeout)
    cond.wait_for = recorded  # type: ignore[method-assign]


def _held(server: RunningServer) -> Callable[[], None]:
    """Topic ``t`` on the server, held as a takeover holds it; returns its release."""
    with server.client() as c:
        c.create_topic("t", queue_count=1)
    holds = server.server.broker.store.holds
    holds.hold(["t"], "broker-gone")
    return lambda: holds.release(["t"])


def test_the_refusal_of_a_held_topic_says_so(server: RunningServer) -> None:
    _held(server)
    with server.client() as c:
        (out,) = c.send([message("t", b"x")])
    assert not out.ok
    assert out.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert being_taken_over(out.error), out.error


def test_a_send_to_a_held_topic_is_asked_again_soon_at_the_same_broker(
        server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given topic t held by a takeover at the broker the client finds it on
    pauses = Pauses(_held(server))
    monkeypatch.setattr(routing, "time", TimeWithPauses(pauses))
    located: list[str] = []
    directory = BrokerDirectory([server.target])
    locate = directory.locate

    def counting(topic: str) -> str:
        located.append(topic)
        return locate(topic)
    monkeypatch.setattr(directory, "locate", counting)

    # When a routed send meets the hold until the sixth refusal
    with RoutedClient(directory, follow_s=60) as rc:
        (out,) = rc.send([message("t", b"after the hold")])

    # Then it is stored, every pause was the short one (no back-off), and the owner was
    # never looked for again (it was right)
    assert out.ok, out.error
    assert pauses.asked == [HELD_RETRY_S] * REFUSALS
    assert set(located) == {"t"}
    assert len(directory._owners) == 1


def test_a_producer_at_a_held_topic_tries_again_soon(server: RunningServer) -> None:
    # Given topic t held by a takeover, and an idempotent Producer of the routed client
    release = _held(server)
    with RoutedClient(BrokerDirectory([server.target]), follow_s=60) as rc:
        producer = rc.producer("t", delivery_timeout_s=60)
        pauses = Pauses(release)
        record_stream_pauses(producer, pauses)

        # When it sends while the hold lasts until the sixth refusal
        try:
            outcome = producer.send("t", b"after the hold").result(30)
            asked = list(pauses.asked)  # (not those of the stream's end at close)
        finally:
            producer.close()

    # Then the message is stored, and every pause was the short one
    assert outcome.ok, outcome.error
    assert asked == [HELD_RETRY_S] * REFUSALS


def test_a_consumer_at_a_held_topic_subscribes_again_soon(
        server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a message in topic t, then t held by a takeover
    release = _held(server)
    release()
    with server.client() as c:
        (sent,) = c.send([message("t", b"waiting")])
    assert sent.ok, sent.error
    server.server.broker.store.holds.hold(["t"], "broker-gone")
    pauses = Pauses(release)
    monkeypatch.setattr(consumer_module, "time", TimeWithPauses(pauses))

    # When a routed Consumer subscribes while the hold lasts until the sixth refusal
    with RoutedClient(BrokerDirectory([server.target]), follow_s=60) as rc:
        consumer = rc.consumer("t", "g")
        try:
            got = consumer.receive(30)
            asked = list(pauses.asked)
        finally:
            consumer.close()

    # Then it receives the message, and every pause was the short one
    assert got is not None and got.message_id == sent.message_id
    assert asked == [HELD_RETRY_S] * REFUSALS
