"""A client on a broker that stops answering without closing its connection (a paused
process, a machine lost behind a network that drops packets) notices it and gives up the
call, instead of waiting for ever (issue 37: a ``Producer`` stalled on a paused broker;
its batches in flight had no answer and no error, so it neither failed nor followed the
topic to its new owner).  The client pings on its open calls (HTTP/2 keepalive,
``keepalive_s``); a ping without an answer breaks the call with UNAVAILABLE.

Real parts: a broker in its own process (``chronomq serve``), paused with SIGSTOP; the
client library over gRPC on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError
from chronomq.client.consumer import Consumer
from chronomq.client.producer import Producer
from testkit.process import ServerProcess
from testkit.wait import wait_until

KEEPALIVE_S = 1.0
NOTICED_WITHIN_S = 30.0  # a bound for the test only: it notices in ~2 s (ping + timeout)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ServerProcess]:
    p = ServerProcess(tmp_path / "data")
    yield p
    os.kill(p.proc.pid, signal.SIGCONT)
    p.kill9()


def _pause(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it is stopped (the signal is
    delivered asynchronously: an answer may still leave just after ``kill``)."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:  # a thread that ended meanwhile
                continue
        return all(s == "T" for s in states)
    wait_until(stopped, 10, f"every thread of process {pid} to stop")


def test_a_producer_gives_up_a_batch_a_paused_broker_never_answers(
        broker: ServerProcess) -> None:
    # Given a producer streaming to a broker, one send answered
    with ChronomqClient(broker.target, keepalive_s=KEEPALIVE_S) as c:
        c.create_topic("t", queue_count=1)
        with Producer(c, idempotent=False) as producer:
            assert producer.send("t", b"first").result(10).message_id
            # When the broker is paused (its socket stays open; nothing answers)
            _pause(broker.proc.pid)
            pending = producer.send("t", b"second")
            # Then the send fails (outcome unknown) instead of waiting for ever
            exc = pending.exception(NOTICED_WITHIN_S)
            assert isinstance(exc, RpcError) and exc.code == grpc.StatusCode.UNAVAILABLE
            os.kill(broker.proc.pid, signal.SIGCONT)


def test_a_stream_consumer_notices_a_paused_broker(broker: ServerProcess) -> None:
    # Given a Subscribe consumer on a broker
    with ChronomqClient(broker.target, keepalive_s=KEEPALIVE_S) as c:
        c.create_topic("t", queue_count=1)
        with Consumer(c, "t", "g") as consumer:
            assert consumer.receive(timeout_s=1) is None  # the stream is open
            before = consumer.streams_opened
            # When the broker is paused
            _pause(broker.proc.pid)
            # Then the consumer's stream breaks and it opens another (it retries)
            wait_until(lambda: consumer.streams_opened > before, NOTICED_WITHIN_S,
                       "the consumer to open a new stream")
            os.kill(broker.proc.pid, signal.SIGCONT)


def test_a_consumer_waiting_on_an_idle_topic_keeps_its_stream(broker: ServerProcess) -> None:
    # Seen while measuring: "Received a GOAWAY with error code ENHANCE_YOUR_CALM ...
    # too_many_pings" on a Consumer whose topic was idle, its stream broken and opened
    # again: the broker's allowance of a ping a second was set under a key gRPC does not
    # read, so its default (one ping in five minutes without data) struck the client out
    with ChronomqClient(broker.target, keepalive_s=2.0) as c:
        c.create_topic("idle")
        with Consumer(c, "idle", "G") as consumer:
            # six pings without data, two strikes being enough to be sent away (at the
            # third ping, after 6 s)
            assert consumer.receive(timeout_s=13) is None
            assert consumer.streams_opened == 1
            c.send_one("idle", b"at last")
            m = consumer.receive(timeout_s=10)
            assert m is not None and m.body == b"at last"
            assert consumer.streams_opened == 1
