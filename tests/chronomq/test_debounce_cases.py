"""Debounce never yields two bodies under one id: a Send with ``replace`` tells apart the
three cases it meets (replaced a pending one; none pending, the id never stored; the old
one already delivered or in flight), and ``if_delivered`` decides the last one (a new id,
``<id>~<n>``, or FAILED_PRECONDITION).  Retry copies of the id are superseded too.  Over
real gRPC on 127.0.0.1, real RocksDB, the broker's clock a manual one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.client import RpcError, message
from chronomq.client.producer import Producer
from chronomq.v1 import broker_pb2 as pb
from testkit.wait import wait_until
from tests.manual_broker import ManualBroker

SEC = 1000
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ManualBroker]:
    e = ManualBroker(tmp_path, {"a": 1, "b": 1})
    yield e
    e.close()


def _received(env: ManualBroker, topic: str, group: str = "g") -> list[tuple[str, bytes]]:
    got = env.client.pop(topic, group, max_messages=32)
    if got:
        env.client.ack(group, [m.receipt_handle for m in got])
    return sorted((m.message_id, m.body) for m in got)


def test_the_answer_tells_the_three_cases_apart(env: ManualBroker) -> None:
    # Given an id never sent: none pending
    (first,) = env.client.send([message("a", b"v1", delay_ms=10 * SEC, message_id="u7",
                                        replace=True)])
    assert (first.replace_outcome, first.message_id, first.replaced) == \
        ("NONE_PENDING", "u7", 0)
    # a pending one replaced
    (second,) = env.client.send([message("a", b"v2", delay_ms=10 * SEC, message_id="u7",
                                         replace=True)])
    assert (second.replace_outcome, second.message_id, second.replaced) == \
        ("REPLACED", "u7", 1)
    env.tick(10 * SEC)
    assert _received(env, "a") == [("u7", b"v2")]
    # When it is sent again with replace after its delivery
    (third,) = env.client.send([message("a", b"v3", delay_ms=5 * SEC, message_id="u7",
                                        replace=True)])
    # Then the case is told, and the new body comes under the id's next generation
    assert (third.replace_outcome, third.message_id, third.replaced) == \
        ("ALREADY_DELIVERED", "u7~1", 0)
    # a replace of the id while that one is pending replaces it, under its id
    (fourth,) = env.client.send([message("a", b"v4", delay_ms=5 * SEC, message_id="u7",
                                         replace=True)])
    assert (fourth.replace_outcome, fourth.message_id, fourth.replaced) == \
        ("REPLACED", "u7~1", 1)
    env.tick(5 * SEC)
    assert _received(env, "a") == [("u7~1", b"v4")]
    (fifth,) = env.client.send([message("a", b"v5", message_id="u7", replace=True)])
    assert (fifth.replace_outcome, fifth.message_id) == ("ALREADY_DELIVERED", "u7~2")
    assert _received(env, "a") == [("u7~2", b"v5")]
    # a Send without replace is unchanged: none of this is in its answer
    (plain,) = env.client.send([message("a", b"x", message_id="other")])
    assert plain.replace_outcome == "" and plain.replaced == 0


def test_refuse_stores_nothing_once_delivered(env: ManualBroker) -> None:
    env.client.send([message("a", b"v1", message_id="job")])
    assert _received(env, "a") == [("job", b"v1")]
    (out,) = env.client.send([message("a", b"v2", delay_ms=SEC, message_id="job",
                                      replace=True, if_delivered="REFUSE")])
    assert out.error_code == FAILED_PRECONDITION and "already delivered" in out.error
    env.tick(60 * SEC)
    assert _received(env, "a") == []
    # REFUSE changes nothing in the other two cases
    (fresh,) = env.client.send([message("a", b"n", delay_ms=SEC, message_id="new",
                                        replace=True, if_delivered="REFUSE")])
    assert fresh.replace_outcome == "NONE_PENDING"
    (again,) = env.client.send([message("a", b"n2", delay_ms=SEC, message_id="new",
                                        replace=True, if_delivered="REFUSE")])
    assert again.replace_outcome == "REPLACED" and again.replaced == 1


def test_in_flight_is_not_replaced_under_its_id(env: ManualBroker) -> None:
    # Given a message leased to a consumer, not yet acked
    env.client.send([message("a", b"v1", message_id="lease")])
    (_leased,) = env.client.pop("a", "g", max_messages=1)
    # When it is replaced
    (out,) = env.client.send([message("a", b"v2", message_id="lease", replace=True)])
    # Then the consumers see the new body under another id
    assert (out.replace_outcome, out.message_id) == ("ALREADY_DELIVERED", "lease~1")
    assert _received(env, "a", "g2") == [("lease", b"v1"), ("lease~1", b"v2")]


def test_a_timer_firing_during_a_replace_waits_for_it(env: ManualBroker) -> None:
    """The replace pins the id in the timer: an entry of it that comes due meanwhile is
    held, so it is either replaced (still pending) or was already on its way (in flight),
    never delivered under the id beside the replacing message."""
    env.client.send([message("a", b"v1", delay_ms=SEC, message_id="pin")])
    timer = env.broker.timer
    with timer.pinned("pin"):
        env.tick(SEC)  # due now, held
        assert _received(env, "a") == []
        assert timer.pending_topics("pin") == [("a", False)]
    env.tick(0)  # released: delivered
    assert _received(env, "a") == [("pin", b"v1")]


def test_retry_copies_are_superseded(env: ManualBroker) -> None:
    # Given a message group g nacked (its retry copy waits out a back-off in the timer)
    # and group g2 acked
    env.client.send([message("a", b"v1", message_id="r")])
    assert _received(env, "a", "g2") == [("r", b"v1")]
    (got,) = env.client.pop("a", "g", max_messages=1)
    assert env.client.nack("g", [got.receipt_handle], delay_ms=30 * SEC) == [""]
    # (the copy is durable when the nack answers; the timer takes it from the CommitLog)
    wait_until(lambda: env.broker.timer.pending_topics("r") == [("%RETRY%g%a", False)],
               10, "the retry copy in the timer")
    # When it is replaced
    (out,) = env.client.send([message("a", b"v2", message_id="r", replace=True)])
    # Then the new body comes under a new id to both groups, the retry copy is cancelled
    assert (out.replace_outcome, out.message_id, out.replaced) == \
        ("ALREADY_DELIVERED", "r~1", 1)
    assert _received(env, "a", "g2") == [("r~1", b"v2")]
    env.tick(60 * SEC)
    assert _received(env, "a", "g") == [("r~1", b"v2")]
    assert env.broker.timer.pending_topics("r") == []


def test_a_generation_this_broker_never_stored_is_replaced_too(env: ManualBroker) -> None:
    # Given an id's generation ~1 in this broker's dedupe index but not the id itself (as
    # after a takeover: the first generation was stored by the departed broker)
    env.client.send([message("a", b"gen1", message_id="k~1")])
    assert _received(env, "a") == [("k~1", b"gen1")]
    # When the id is debounced twice, each a delayed body
    (first,) = env.client.send([message("a", b"v1", delay_ms=5 * SEC, message_id="k",
                                        replace=True)])
    (second,) = env.client.send([message("a", b"v2", delay_ms=5 * SEC, message_id="k",
                                         replace=True)])
    # Then the second replaces the first, whichever generation it went under
    assert first.replace_outcome == "ALREADY_DELIVERED" and first.message_id == "k~2"
    assert (second.replace_outcome, second.message_id, second.replaced) == \
        ("REPLACED", "k~2", 1)
    env.tick(5 * SEC)
    assert _received(env, "a") == [("k~2", b"v2")]  # one body: never the replaced one


def test_refuse_leaves_a_retry_copy(env: ManualBroker) -> None:
    env.client.send([message("a", b"v1", message_id="r")])
    (got,) = env.client.pop("a", "g", max_messages=1)
    env.client.nack("g", [got.receipt_handle], delay_ms=SEC)
    (out,) = env.client.send([message("a", b"v2", message_id="r", replace=True,
                                      if_delivered="REFUSE")])
    assert out.error_code == FAILED_PRECONDITION
    env.tick(SEC)
    assert [(m.message_id, m.body) for m in env.client.pop("a", "g")] == [("r", b"v1")]


def test_only_its_topic_counts(env: ManualBroker) -> None:
    env.client.send([message("b", b"elsewhere", message_id="t")])
    (out,) = env.client.send([message("a", b"here", delay_ms=SEC, message_id="t",
                                      replace=True)])
    assert (out.replace_outcome, out.message_id) == ("NONE_PENDING", "t")


def test_if_delivered_is_checked(env: ManualBroker) -> None:
    bad = message("a", b"x", message_id="i", replace=True)
    bad.if_delivered = 7  # not a value of the enum (proto3 keeps it)
    (out,) = env.client.send([bad])
    assert out.error_code == INVALID_ARGUMENT and "if_delivered" in out.error
    with pytest.raises(ValueError):
        message("a", b"x", message_id="i", if_delivered="REFUSE")  # without replace
    with pytest.raises(ValueError):
        message("a", b"x", message_id="i", replace=True, if_delivered="drop")
    assert pb.IF_DELIVERED_NEW_ID == 0  # the default


def test_the_producer_tells_the_case(env: ManualBroker) -> None:
    with Producer(env.client) as p:
        assert p.send("a", b"1", message_id="p", replace=True).result(10).replace_outcome \
            == "NONE_PENDING"
        assert _received(env, "a") == [("p", b"1")]
        refused = p.send("a", b"2", message_id="p", replace=True, if_delivered="REFUSE")
        with pytest.raises(RpcError) as info:
            refused.result(10)
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
        out = p.send("a", b"3", message_id="p", replace=True).result(10)
        assert (out.replace_outcome, out.message_id) == ("ALREADY_DELIVERED", "p~1")
