"""Hostile requests on every RPC of the RocketMQ 5 front, each signed as a user allowed
every action on every topic but the canary's (``deny`` on ``canary*``: deny wins): the
oracle of ``tests/chronomq/test_hostile_rpc.py``'s limited user, for this front.

Requests are generated from ``apache.rocketmq.v2.MessagingService``'s descriptors
(``tests.chronomq.fuzz``), then aimed: a share of their topics, groups, receipt handles
and recall handles are drawn from the canary's (its name, its group, the handles of two
of its leased messages, the id of its delayed message), from ``canary-x`` (forbidden too,
and missing) and from topics the user may use.  Oracles, per call:

- no gRPC INTERNAL or UNKNOWN, and no UNAUTHORIZED answer (every call is signed);
- no answer and no status message holds the canary's secret body;
- none names the canary unless the request did (its name, or one of its handles: a
  refusal names what was asked for);
- a request naming the canary or its delayed message's id that is not answered OK gets
  the same answer, byte for byte but those, as the same request naming a missing
  forbidden topic and a missing id of the same lengths: a refusal never tells whether
  the canary or its message exists;

and afterwards the canary's queue offsets, its group's figures, its delayed message, its
two leases and its messages are what they were, and no other ``canary*`` topic exists.

``CHRONOMQ_FUZZ_EXAMPLES`` sets the examples per method (default 60).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronomq.client import ChronomqClient, message
from chronomq.config import PopConfig, RocketMQConfig
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from tests.chronomq.fuzz import BAD_CODES, Tally, call, message_strategy
from tests.conftest import RunningServer, broker_config
from tests.rocketmq.test_access import signed

EXAMPLES = int(os.environ.get("CHRONOMQ_FUZZ_EXAMPLES", "60"))
ADMIN = "root-7f3a9c"
CANARY = "canary-7f3a9c"
DECOY = "canary-000000"  # forbidden as well, missing, and as long (the frames stay valid)
assert len(DECOY) == len(CANARY)
SECRET = b"CANARY-7f3a9c-SECRET"
SERVICE = rs.DESCRIPTOR.services_by_name["MessagingService"]
RESOURCE = rd.Resource.DESCRIPTOR.full_name
HANDLES = ("receipt_handle", "recall_handle")


@dataclasses.dataclass
class Targets:
    """What the requests are aimed at: names, and handles the user holds or does not."""

    topics: list[str]
    groups: list[str]
    handles: list[str]  # receipt handles: the canary's two leases, two of orders'
    recalls: list[str]  # message ids: the canary's delayed one, one of orders'
    canary_handles: list[str]
    swaps: list[tuple[bytes, bytes]]  # the canary's name and id, and stand-ins for them


@pytest.mark.slow
def test_a_limited_user_never_reaches_the_canary_through_the_rocketmq_front(
        tmp_path: Path) -> None:
    config = dataclasses.replace(
        broker_config(tmp_path / "data", auth_token=ADMIN), pop=PopConfig(max_wait_ms=100),
        rocketmq=RocketMQConfig(enabled=True, host="127.0.0.1", port=0))
    server = RunningServer(config)
    tally = Tally()
    seen: Counter[str] = Counter()  # first answers' RocketMQ codes, and oracles exercised
    try:
        with server.client(token=ADMIN) as admin:
            targets, delayed, leased = _canary(admin)
            admin.users.add("fuzzer")
            for action in ("send", "consume", "admin"):
                admin.users.grant("fuzzer", action, "*")
                admin.users.grant("fuzzer", action, "canary*", deny=True)
            before = _canary_state(server, admin)
        user = server.server.broker.access.directory.user("fuzzer")
        assert user is not None
        keys = (user.name, user.rocketmq_secret)
        with grpc.insecure_channel(f"127.0.0.1:{server.server.rocketmq_port}") as channel:
            for method in SERVICE.methods:
                _fuzz(channel, method, targets, keys, tally, seen)
        assert not tally.defects, "\n".join(tally.defects[:20])
        with server.client(token=ADMIN) as admin:
            assert _canary_state(server, admin) == before
            assert admin.query(message_id=delayed)  # still pending
            admin.ack("canary-group", leased)  # both leases untouched: their handles hold
            got = []
            while batch := admin.pop(CANARY, "canary-check", max_messages=32):
                got += [m.body for m in batch]
            assert sorted(got) == sorted(SECRET + b"-%d" % i for i in range(6))
            assert [t.name for t in admin.list_topics() if t.name.startswith("canary")] == [
                CANARY]
    finally:
        server.stop()
    assert sum(tally.statuses.values()) >= EXAMPLES * len(SERVICE.methods)
    print("\n".join(tally.lines()), dict(seen.most_common()), sep="\n")
    # the oracles had work: refusals by the rows, and refusals compared
    assert seen["refused: a canary topic"] >= EXAMPLES // 2, seen
    assert seen["refused: a canary handle"] >= 1, seen
    assert seen["compared with a missing one"] >= EXAMPLES // 2, seen


def _canary(admin: ChronomqClient) -> tuple[Targets, str, list[str]]:
    """The canary (six messages, one of them acked by canary-group and two leased for an
    hour, one delayed by an hour) and two leased messages of orders; the targets."""
    admin.create_topic(CANARY, queue_count=2)
    for topic in ("orders", "other"):
        admin.create_topic(topic, queue_count=2)
    assert all(o.ok for o in admin.send(
        [message(CANARY, SECRET + b"-%d" % i) for i in range(6)]))
    delayed = admin.send_one(CANARY, SECRET + b"-later", delay_ms=3_600_000)
    first = admin.pop(CANARY, "canary-group", max_messages=1)  # a position
    admin.ack("canary-group", [m.receipt_handle for m in first])
    leased = [m.receipt_handle for m in admin.pop(CANARY, "canary-group", max_messages=2,
                                                  invisible_time_s=3600)]
    assert len(leased) == 2
    admin.send([message("orders", b"fine-%d" % i) for i in range(4)])
    theirs = [m.receipt_handle for m in admin.pop("orders", "g", max_messages=2,
                                                  invisible_time_s=3600)]
    later = admin.send_one("orders", b"fine-later", delay_ms=3_600_000)
    missing = "f" * len(delayed)  # an id as long that names no message
    targets = Targets(topics=[CANARY, "canary-x", "orders", "other"],
                      groups=["canary-group", "g"], handles=leased + theirs,
                      recalls=[delayed, later], canary_handles=leased,
                      swaps=[(CANARY.encode(), DECOY.encode()),
                             (delayed.encode(), missing.encode())])
    return targets, delayed, leased


def _canary_state(server: RunningServer, admin: ChronomqClient) -> object:
    """What a user outside the canary must not change: its queues' offsets (read in the
    broker) and its groups' figures."""
    store = server.server.broker.store
    figures = {k: v for k, v in admin.stats().items() if f".{CANARY}." in k}
    return [store.queue_bounds(CANARY, q) for q in range(2)], sorted(figures.items())


# ---------------------------------------------------------------- aimed requests

def _aimable(desc: Descriptor, depth: int = 0) -> bool:
    """Whether messages of ``desc`` hold (within three levels) a Resource or a handle."""
    if desc.full_name == RESOURCE:
        return True
    if depth >= 3:
        return False
    inner = [f.message_type for f in desc.fields if f.type == FieldDescriptor.TYPE_MESSAGE]
    return any(f.name in HANDLES for f in desc.fields) or any(
        d is not None and not d.GetOptions().map_entry and _aimable(d, depth + 1)
        for d in inner)


_OFTEN = st.integers(0, 3).map(bool)  # three times in four


def _aim(msg: Any, draw: st.DrawFn, targets: Targets, depth: int = 0) -> None:
    """Set a share of ``msg``'s resources and handles to the targets (in place)."""
    for f in msg.DESCRIPTOR.fields:
        if f.name in HANDLES and f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated:
            if draw(_OFTEN):
                pool = targets.handles if f.name == "receipt_handle" else targets.recalls
                setattr(msg, f.name, draw(st.sampled_from(pool)))
            continue
        if f.type != FieldDescriptor.TYPE_MESSAGE or depth >= 3 or not _aimable(
                f.message_type, depth + 1):
            continue
        if f.message_type.full_name == RESOURCE:
            names = targets.groups if f.name == "group" else targets.topics
            for r in (list(getattr(msg, f.name)) if f.is_repeated else [getattr(msg, f.name)]):
                if draw(_OFTEN):
                    r.name = draw(st.sampled_from(names))
        elif f.is_repeated:
            items = getattr(msg, f.name)
            if not items and draw(st.booleans()):
                items.add()
            for item in items:
                _aim(item, draw, targets, depth + 1)
        elif msg.HasField(f.name) or draw(st.booleans()):
            _aim(getattr(msg, f.name), draw, targets, depth + 1)


def _frames(method: MethodDescriptor, targets: Targets) -> st.SearchStrategy[list[bytes]]:
    messages = message_strategy(method.input_type)

    @st.composite
    def one(draw: st.DrawFn) -> bytes:
        if draw(st.integers(0, 9)) == 0:
            return draw(st.binary(max_size=48))  # not the message at all
        msg = draw(messages)
        _aim(msg, draw, targets)
        return bytes(msg.SerializeToString())

    return st.lists(one(), min_size=1, max_size=3 if method.client_streaming else 1)


# ---------------------------------------------------------------- calls and oracles

def _statuses(method: MethodDescriptor, answers: list[bytes]) -> list[tuple[int, str]]:
    """Each answer's RocketMQ status (code, message), where it has one."""
    cls = message_factory.GetMessageClass(method.output_type)
    parsed: list[Any] = [cls.FromString(a) for a in answers]
    return [(m.status.code, m.status.message) for m in parsed if m.HasField("status")]


# the topics each RPC's row checks (chronomq/rocketmq/access.py's ROCKETMQ_RULES, as the
# README states them), and the RPCs that settle a receipt handle
_CHECKED = {
    "QueryRoute": lambda r: [r.topic.name],
    "SendMessage": lambda r: [m.topic.name for m in r.messages],
    "QueryAssignment": lambda r: [r.topic.name],
    "ReceiveMessage": lambda r: [r.message_queue.topic.name],
    "RecallMessage": lambda r: [r.topic.name],
}
_SETTLE = {"AckMessage": lambda r: [e.receipt_handle for e in r.entries],
           "ChangeInvisibleDuration": lambda r: [r.receipt_handle],
           "ForwardMessageToDeadLetterQueue": lambda r: [r.receipt_handle]}


def _forbidden(method: MethodDescriptor, frame: bytes, targets: Targets) -> str:
    """Why the RPC's row must refuse this request ('' when it need not): a canary*
    topic among those it checks, or one of the canary's handles with the group it was
    leased to."""
    try:
        r: Any = message_factory.GetMessageClass(method.input_type).FromString(frame)
    except Exception:  # not the message: INVALID_ARGUMENT before any row
        return ""
    if any(t.startswith("canary") for t in _CHECKED.get(method.name, lambda r: [])(r)):
        return "a canary topic"
    if method.name in _SETTLE and r.group.name == "canary-group" and any(
            h in targets.canary_handles for h in _SETTLE[method.name](r)):
        return "a canary handle"
    return ""


def _fuzz(channel: grpc.Channel, method: MethodDescriptor, targets: Targets,
          keys: tuple[str, str], tally: Tally, seen: Counter[str]) -> None:
    name = f"{SERVICE.full_name}/{method.name}"
    canary = CANARY.encode()

    def swapped(data: bytes) -> bytes:
        for secret, stand_in in targets.swaps:
            data = data.replace(secret, stand_in)
        return data

    def signed_call(requests: list[bytes]) -> tuple[grpc.StatusCode, list[bytes], list[str]]:
        answers: list[bytes] = []
        details: list[str] = []
        code = call(channel, SERVICE.full_name, method, requests, answers,
                    metadata=tuple(signed(*keys)), timeout_s=0.5, details=details)
        return code, answers, details

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        requests = data.draw(_frames(method, targets))
        code, answers, details = signed_call(requests)
        tally.record(name, code, requests)
        assert code not in BAD_CODES, (code, details)
        statuses = _statuses(method, answers)
        seen.update(rd.Code.Name(c) for c, _ in statuses[:1])
        assert all(c != rd.Code.UNAUTHORIZED for c, _ in statuses), statuses
        said = [*answers, *(d.encode() for d in details)]
        assert not any(SECRET in a for a in said), "the canary's body leaked"
        by_name = any(secret in r for secret, _ in targets.swaps for r in requests)
        by_handle = any(h.encode() in r for h in targets.canary_handles for r in requests)
        assert any(canary in r for r in requests) or by_handle or not any(
            canary in a for a in said), \
            ("the canary was named", said)
        why = "" if method.client_streaming else _forbidden(method, requests[0], targets)
        if why:
            seen[f"refused: {why}"] += 1
            assert statuses[:1] and statuses[0][0] == rd.Code.FORBIDDEN, statuses
        refused = code != grpc.StatusCode.OK or (statuses and statuses[0][0] != rd.Code.OK)
        if by_name and not by_handle and refused:
            # the same refusal for a forbidden topic, or a message, that does not exist
            seen["compared with a missing one"] += 1
            again = signed_call([swapped(r) for r in requests])
            assert (code, [swapped(a) for a in answers],
                    [swapped(d.encode()).decode() for d in details]) == again, requests

    run()
