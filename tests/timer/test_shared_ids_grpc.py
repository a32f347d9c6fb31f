"""Cancel and Reschedule over real gRPC on 127.0.0.1 for an id several pending delayed
messages share; the broker's clock is a manual one, its timer driven by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.cli import main
from chronomq.client import RpcError, message
from pop.model import retry_topic
from tests.manual_broker import ManualBroker

SEC = 1000
MID = "order-1"  # client-chosen, used in two topics


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    e = ManualBroker(tmp_path, {"a": 1, "b": 1})
    yield e
    e.close()


def _send_to_both(env: ManualBroker) -> None:
    for topic in ("a", "b"):
        (out,) = env.client.send([message(topic, topic.encode(), delay_ms=10 * SEC,
                                          message_id=MID)])
        assert out.ok and out.message_id == MID
    assert env.broker.store.wait_visible(10)


def test_cancel_reaches_both_topics_and_says_two(env: ManualBroker) -> None:
    _send_to_both(env)
    assert env.client.cancel(MID)[:2] == ("CANCELLED", 2)
    env.tick(60 * SEC)
    assert (env.bodies("a"), env.bodies("b")) == ([], [])
    assert env.client.cancel(MID)[:2] == ("NOT_FOUND", 0)


def test_a_topic_narrows_cancel_and_reschedule(env: ManualBroker) -> None:
    _send_to_both(env)
    assert env.client.cancel(MID, topic="a")[:2] == ("CANCELLED", 1)
    assert env.client.cancel(MID, topic="a")[:2] == ("NOT_FOUND", 0)
    moved = env.client.reschedule(MID, delay_ms=30 * SEC, topic="b")
    assert (moved.outcome, moved.changed) == ("RESCHEDULED", 1)
    env.tick(29 * SEC)
    assert (env.bodies("a"), env.bodies("b")) == ([], [])
    env.tick(1 * SEC)
    assert (env.bodies("a"), env.bodies("b")) == ([], [b"b"])


def test_reschedule_moves_both(env: ManualBroker) -> None:
    _send_to_both(env)
    moved = env.client.reschedule(MID, delay_ms=20 * SEC)
    assert (moved.outcome, moved.changed) == ("RESCHEDULED", 2)
    env.tick(10 * SEC)
    assert (env.bodies("a"), env.bodies("b")) == ([], [])  # neither kept its old time
    env.tick(10 * SEC)
    assert (env.bodies("a"), env.bodies("b")) == ([b"a"], [b"b"])


def test_both_retry_copies_of_a_nacked_message_are_reached(env: ManualBroker) -> None:
    # Given one message that two groups leased and nacked with a 10 s back-off
    (out,) = env.client.send([message("a", b"m")])
    for group in ("g1", "g2"):
        (m,) = env.client.pop("a", group, max_messages=1)
        assert env.client.nack(group, [m.receipt_handle], delay_ms=10 * SEC) == [""]
    assert env.broker.store.wait_visible(10)
    # When the first group's copy is rescheduled by its retry topic, then both cancelled
    moved = env.client.reschedule(out.message_id, delay_ms=20 * SEC,
                                  topic=retry_topic("g1", "a"))
    cancelled = env.client.cancel(out.message_id)
    # Then neither group gets the message again
    env.tick(60 * SEC)
    assert env.client.pop("a", "g1") == [] and env.client.pop("a", "g2") == []
    assert (moved.changed, cancelled.changed) == (1, 2)


def test_a_bad_topic_is_refused_before_anything_is_done(env: ManualBroker) -> None:
    _send_to_both(env)
    for bad in ("no/slash", "%RETRY%only-group", "x" * 200):
        with pytest.raises(RpcError) as refused:
            env.client.cancel(MID, topic=bad)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "name" in refused.value.details
    assert env.client.cancel(MID)[:2] == ("CANCELLED", 2)  # both were still pending


def test_the_cli_prints_how_many_changed(env: ManualBroker,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _send_to_both(env)
    target = ["--target", env.running.target]
    assert main(["reschedule", MID, "--delay-ms", "20000", "--topic", "b", *target]) == 0
    out = capsys.readouterr().out
    assert "outcome: RESCHEDULED" in out and "changed: 1" in out
    assert main(["cancel", MID, *target]) == 0
    out = capsys.readouterr().out
    assert "outcome: CANCELLED" in out and "changed: 2" in out
    # nothing left: exit 1, and the reason on stderr
    assert main(["cancel", MID, "--topic", "a", *target]) == 1
    assert "NOT_FOUND: no message order-1 in topic a is pending" in capsys.readouterr().err
