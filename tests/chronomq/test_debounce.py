"""Debounce by id: a Send with ``replace`` replaces the pending messages with its id, over
real gRPC on 127.0.0.1, the CLI and the console; the broker's clock is a manual one, its
timer driven by hand."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.cli import main
from chronomq.client import ChronomqClient, RpcError, message
from chronomq.client.producer import Producer
from store.crashpoint import CRASH_EXIT_CODE
from testkit.process import ServerProcess
from tests.manual_broker import ManualBroker

SEC = 1000
DAY = 86_400 * SEC


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    e = ManualBroker(tmp_path, {"a": 2, "b": 2})
    yield e
    e.close()


def test_a_replace_takes_the_place_of_the_pending_message(env: ManualBroker) -> None:
    # Given an order time-out pending in 10 s
    (first,) = env.client.send([message("a", b"v1", delay_ms=10 * SEC, message_id="order-1",
                                        key="k1", properties={"p": "1"})])
    assert first.ok and first.replaced == 0
    # When the same id is sent again with replace: new body, properties, due in 5 s
    (second,) = env.client.send([message("a", b"v2", delay_ms=5 * SEC, message_id="order-1",
                                         key="k2", properties={"p": "2"}, replace=True)])
    # Then the answer says it replaced one, under the same id, due at the new time
    assert second.ok and not second.duplicate and second.replaced == 1
    assert second.message_id == "order-1"
    assert second.deliver_at_ms == env.clock.now_ms() + 5 * SEC
    # without replace, the same id is still a duplicate (nothing stored)
    (again,) = env.client.send([message("a", b"v3", delay_ms=1 * SEC, message_id="order-1")])
    assert again.duplicate and again.replaced == 0
    env.tick(5 * SEC - 1)
    assert env.bodies("a") == []  # never early
    env.tick(1)
    got = env.client.pop("a", "g2", max_messages=32)
    assert [(m.body, m.key, dict(m.properties)) for m in got] == [(b"v2", "k2", {"p": "2"})]
    env.tick(60 * SEC)  # the replaced one's time: nothing more comes
    assert env.bodies("a", "g3") == [b"v2"] and env.client.pop("a", "g2") == []


def test_a_replace_with_nothing_pending_is_stored_as_new(env: ManualBroker) -> None:
    (out,) = env.client.send([message("a", b"x", delay_ms=SEC, message_id="fresh",
                                      replace=True)])
    assert out.ok and out.replaced == 0 and out.message_id == "fresh"
    env.tick(SEC)
    assert env.bodies("a") == [b"x"]
    # once delivered it is no longer pending: a replace stores a new one beside it
    (out,) = env.client.send([message("a", b"y", delay_ms=SEC, message_id="fresh",
                                      replace=True)])
    assert out.ok and out.replaced == 0
    env.tick(SEC)
    assert env.bodies("a") == [b"y"]


def test_a_replace_reaches_a_parked_message_and_only_its_topic(env: ManualBroker) -> None:
    # Given one id pending in two topics, in a TimerFlatFile days ahead
    for topic in ("a", "b"):
        (out,) = env.client.send([message(topic, topic.encode(), delay_ms=3 * DAY,
                                          message_id="far")])
        assert out.ok
    env.tick(0)
    # When topic a's is replaced by one due in a second
    (out,) = env.client.send([message("a", b"soon", delay_ms=SEC, message_id="far",
                                      replace=True)])
    assert out.replaced == 1
    env.tick(SEC)
    assert env.bodies("a") == [b"soon"]
    # Then topic b's is still pending and comes at its own time, a's never
    env.tick(3 * DAY)
    assert env.bodies("a") == [] and env.bodies("b") == [b"b"]


def test_racing_replaces_leave_one_message_pending(env: ManualBroker) -> None:
    env.client.send([message("a", b"start", delay_ms=30 * SEC, message_id="race")])
    answers: list[int] = []

    def replace(i: int) -> None:
        with env.running.client() as c:
            (out,) = c.send([message("a", f"r{i}".encode(), delay_ms=20 * SEC,
                                     message_id="race", replace=True)])
            assert out.ok
            answers.append(out.replaced)

    threads = [threading.Thread(target=replace, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # every replace found exactly the one before it
    assert answers == [1] * 8
    env.tick(60 * SEC)
    assert len(env.bodies("a")) == 1


def test_a_replace_needs_an_id_and_is_checked_like_any_send(env: ManualBroker) -> None:
    bad = [message("a", b"x", delay_ms=SEC), message("nope", b"x", message_id="i")]
    bad[0].replace = True
    bad[1].replace = True
    outs = env.client.send(bad)
    assert [o.error_code for o in outs] == [grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                           grpc.StatusCode.NOT_FOUND.value[0]]
    assert "replace needs a message_id" in outs[0].error
    with pytest.raises(ValueError):
        message("a", b"x", replace=True)


def test_the_producer_and_the_cli_replace(env: ManualBroker, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    with Producer(env.client) as p:
        assert p.send("a", b"one", delay_ms=10 * SEC, message_id="job").result(10).ok
        assert p.send("a", b"two", delay_ms=10 * SEC, message_id="job",
                      replace=True).result(10).replaced == 1
    target = ["--target", env.running.target]
    assert main(["send", "a", "three", "--id", "job", "--replace", "--delay-ms", "2000",
                 "--json", *target]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["replaced"] == 1 and out["message_id"] == "job"
    assert main(["send", "a", "x", "--replace", *target]) == 2
    assert "--replace needs --id" in capsys.readouterr().err
    env.tick(2 * SEC)
    assert env.bodies("a") == [b"three"]
    env.tick(60 * SEC)
    assert env.bodies("a") == []


@pytest.mark.slow
def test_a_crash_inside_a_replace_loses_nothing_answered(tmp_path: Path) -> None:
    """kill -9 between a replacing message's append and the cancel of the one it
    replaces: the replace had no answer; both are pending (the OK'd one is not lost), and
    the client's retry leaves exactly its own."""
    data = tmp_path / "data"
    srv = ServerProcess(data, "server.crash_at=debounce.after_append:1")
    with ChronomqClient(srv.target, timeout_s=10) as c:
        c.create_topic("t", queue_count=1)
        (first,) = c.send([message("t", b"v1", delay_ms=4 * SEC, message_id="job")])
        assert first.ok
        with pytest.raises(RpcError):  # the broker dies inside the replace
            c.send([message("t", b"v2", delay_ms=4 * SEC, message_id="job", replace=True)])
    assert srv.wait_exit() == CRASH_EXIT_CODE
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target, timeout_s=10) as c:
            # the retry finds both pending and keeps only itself
            (again,) = c.send([message("t", b"v2", delay_ms=SEC, message_id="job",
                                       replace=True)])
            assert again.ok and again.replaced == 2
            got: list[bytes] = []
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                batch = c.pop("t", "g", max_messages=8, wait_ms=500)
                got += [m.body for m in batch]
                if batch:
                    c.ack("g", [m.receipt_handle for m in batch])
        assert got == [b"v2"]
    finally:
        assert srv.terminate() == 0
