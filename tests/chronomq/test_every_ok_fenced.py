"""Every state change a client can ask for passes the one Fence (``cluster.fence``).

A broker over real gRPC on 127.0.0.1 with a local-directory tier and ``tier.durable_ack``
(its clock manual: no timing fence, the bucket alone decides).  Once another broker's
claim is in its lease, every RPC that changes state answers FAILED_PRECONDITION naming
the successor: Send, a replace, SendStream, Pop, Subscribe, Ack, Nack, DeadLetter,
ChangeInvisibleTime, Cancel, Reschedule, CreateTopic, DeleteTopic, and a schedule's
create, upsert, update, pause, resume, trigger and delete.
docs/DESIGN.md, "Every OK and its gate", names the gate of each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.config import TierConfig
from cluster.lease import claim
from tests.conftest import broker_config
from tests.manual_broker import ManualBroker


@pytest.fixture
def fenced(tmp_path: Path) -> Iterator[tuple[ManualBroker, list[str]]]:
    tier = TierConfig(provider="local", local_dir=str(tmp_path / "tier"), broker_name="a",
                      upload=True, durable_ack=True, durable_ack_ms=1)
    config = dataclasses.replace(broker_config(tmp_path / "data"), tier=tier)
    env = ManualBroker(tmp_path, {"t": 2, "gone": 1}, config)
    assert env.broker.tiered is not None
    env.broker.tiered.start()
    c = env.client
    # Given leases held, a delayed message pending and a schedule, before the claim
    c.send_one("t", b"now")
    mid = c.send_one("t", b"later", delay_ms=3_600_000)
    c.send_one("t", b"now-2")
    c.send_one("t", b"now-3")
    c.send_one("t", b"now-4")
    handles = [m.receipt_handle for m in c.pop("t", "g", max_messages=4)]
    assert len(handles) == 4
    c.create_schedule("s", "t", b"tick", every_s=60)
    # When another broker claims this one's lease in the bucket
    assert claim(env.broker.tier, "a", "b", env.clock.now_ms()) == "b"
    yield env, [mid, *handles]
    env.close()


def _calls(c: ChronomqClient, mid: str, handles: list[str]
           ) -> dict[str, Callable[[], object]]:
    return {
        "Send": lambda: c.send_one("t", b"x"),
        "Send replace": lambda: c.send_one("t", b"y", message_id=mid, replace=True,
                                           delay_ms=60_000),
        "SendStream": lambda: list(c.send_stream([[message("t", b"z")]])),
        "Pop": lambda: c.pop("t", "g2", max_messages=1),
        "Subscribe": lambda: next(iter(c.subscribe("t", "g3").messages())),
        "Ack": lambda: _first_error(c.ack("g", [handles[0]])),
        "Nack": lambda: _first_error(c.nack("g", [handles[1]])),
        "DeadLetter": lambda: _first_error(c.dead_letter("g", [handles[2]])),
        "ChangeInvisibleTime": lambda: c.change_invisible_time("g", handles[3], 60),
        "Cancel": lambda: c.cancel(mid, "t"),
        "Reschedule": lambda: c.reschedule(mid, delay_ms=120_000, topic="t"),
        "CreateTopic": lambda: c.create_topic("new", queue_count=1),
        "DeleteTopic": lambda: c.delete_topic("gone"),
        "CreateSchedule": lambda: c.create_schedule("s2", "t", b"tick", every_s=60),
        "CreateSchedule upsert": lambda: c.create_schedule("s", "t", b"new", every_s=60,
                                                           upsert=True),
        "UpdateSchedule": lambda: c.update_schedule("s", every_s=30),
        "UpdateSchedule unchanged": lambda: c.update_schedule("s", every_s=60),
        "PauseSchedule": lambda: c.pause_schedule("s"),
        "ResumeSchedule": lambda: c.resume_schedule("s"),
        "DeleteSchedule": lambda: c.delete_schedule("s"),
        "TriggerSchedule": lambda: c.trigger_schedule("s"),
    }


def _first_error(errors: list[str]) -> None:
    """A settlement answers per handle: an error there is the refusal."""
    if errors[0]:
        raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, errors[0])


@pytest.mark.parametrize("rpc", list(_calls(None, "", []).keys()))  # type: ignore[arg-type]
def test_a_broker_taken_over_answers_no_ok_to_any_change(
        fenced: tuple[ManualBroker, list[str]], rpc: str) -> None:
    env, (mid, *handles) = fenced
    # Then each change is refused, naming the successor
    with pytest.raises(RpcError) as refused:
        _calls(env.client, mid, handles)[rpc]()
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert "taken over by b" in refused.value.details
