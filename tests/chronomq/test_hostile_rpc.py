"""Property-based hostile requests over every RPC of both APIs (``chronomq.v1.Broker`` and
the RocketMQ 5 ``MessagingService``) against one real server, with the oracles of
``tests.chronomq.fuzz``: no INTERNAL or UNKNOWN answer, a canary topic's messages never in
another call's answer and intact afterwards, nothing written or removed outside the data
dir and the tier, and the server still answering and stopping within its grace period.

``CHRONOMQ_FUZZ_EXAMPLES`` sets the examples per method (CI: 60, a few thousand calls in
all); ``bench/bench_fuzz.py`` is the long mode.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chronomq.api.schedules import SETTINGS, spec_of
from chronomq.client import ChronomqClient, RpcError, message
from chronomq.config import PopConfig, RocketMQConfig, TierConfig
from chronomq.rocketmq.pb import service as rs
from chronomq.v1 import broker_pb2
from store.store import StoreConfig
from tests.chronomq.fuzz import BAD_CODES, Tally, call, frames, message_strategy, tree
from tests.conftest import RunningServer, broker_config
from tests.manual_broker import ManualBroker

EXAMPLES = int(os.environ.get("CHRONOMQ_FUZZ_EXAMPLES", "60"))
CANARY = "canary-7f3a9c"
SECRET = b"CANARY-7f3a9c-SECRET"
SERVICES = [broker_pb2.DESCRIPTOR.services_by_name["Broker"],
            rs.DESCRIPTOR.services_by_name["MessagingService"]]


def test_hostile_requests_on_every_rpc_of_both_apis(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("must survive")
    data, tier = tmp_path / "data", tmp_path / "tier"
    base = broker_config(data)
    config = dataclasses.replace(
        base, pop=PopConfig(max_wait_ms=100),
        store=StoreConfig(str(data), segment_bytes=1 << 20, max_body_bytes=64 << 10,
                          auto_create_topics=True),
        tier=TierConfig(local_dir=str(tier), upload=True, upload_batch_ms=200),
        rocketmq=RocketMQConfig(enabled=True, host="127.0.0.1", port=0))
    server = RunningServer(config)
    before = tree(tmp_path, skip=(data, tier))
    tally = Tally()
    try:
        with server.client() as client:
            client.create_topic(CANARY, queue_count=2)
            sent = client.send([message(CANARY, SECRET + b"-%d" % i) for i in range(6)])
            assert all(o.ok for o in sent)
        targets = {SERVICES[0].full_name: server.target,
                   SERVICES[1].full_name: f"127.0.0.1:{server.server.rocketmq_port}"}
        for service in SERVICES:
            with grpc.insecure_channel(targets[service.full_name]) as channel:
                for method in service.methods:
                    _fuzz(channel, service.full_name, method, tally)
        assert not tally.defects, "\n".join(tally.defects[:20])
        with server.client() as client:  # the canary is intact
            got = []
            while batch := client.pop(CANARY, "canary-check", max_messages=32):
                got += [m.body for m in batch]
            assert sorted(got) == sorted(SECRET + b"-%d" % i for i in range(6))
            assert client.stats()["store.topics"] >= 1
    finally:
        t0 = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - t0
    assert stop_s < config.server.shutdown_grace_s + 5
    assert tree(tmp_path, skip=(data, tier)) == before  # nothing outside was touched
    assert sum(tally.statuses.values()) >= EXAMPLES * 20
    print("\n".join(tally.lines()))


def _fuzz(channel: grpc.Channel, service: str, method: object, tally: Tally) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        requests = data.draw(frames(method))  # type: ignore[arg-type]
        answers: list[bytes] = []
        code = call(channel, service, method, requests, answers,  # type: ignore[arg-type]
                    timeout_s=0.5)
        tally.record(f"{service}/{method.name}", code, requests)  # type: ignore[attr-defined]
        assert code not in BAD_CODES
        assert not any(SECRET in a for a in answers), "the canary leaked"

    run()


def test_a_limited_user_never_reaches_a_topic_outside_its_permissions(tmp_path: Path) -> None:
    """Hostile requests on every RPC as a user allowed every action on every topic but
    the canary's (``deny`` on ``canary*``: deny wins): besides the oracles above, no
    answer and no error message names the canary topic (ListTopics never lists it, Stats
    never counts its group), and afterwards its messages, queue offsets, pending delayed
    message, group position and schedule are what they were."""
    data = tmp_path / "data"
    base = broker_config(data, auth_token="root-7f3a9c")
    config = dataclasses.replace(
        base, pop=PopConfig(max_wait_ms=100),
        store=StoreConfig(str(data), segment_bytes=1 << 20, max_body_bytes=64 << 10,
                          auto_create_topics=True))
    server = RunningServer(config)
    tally = Tally()
    try:
        with server.client(token="root-7f3a9c") as admin:
            admin.create_topic(CANARY, queue_count=2)
            assert all(o.ok for o in admin.send(
                [message(CANARY, SECRET + b"-%d" % i) for i in range(6)]))
            delayed = admin.send_one(CANARY, SECRET + b"-later", delay_ms=3_600_000)
            first = admin.pop(CANARY, "canary-group", max_messages=1)  # a position
            admin.ack("canary-group", [m.receipt_handle for m in first])
            # no tick while the test runs (one at an hour's start would grow the queue)
            admin.create_schedule("canary-ticks", CANARY, SECRET, every_s=3600,
                                  start_ms=4_102_444_800_000)
            user = admin.users.add("fuzzer").token
            for action in ("send", "consume", "admin"):
                admin.users.grant("fuzzer", action, "*")
                admin.users.grant("fuzzer", action, "canary*", deny=True)
            before = _canary_state(server, admin)
        metadata = (("authorization", f"Bearer {user}"),)
        with grpc.insecure_channel(server.target) as channel:
            for method in SERVICES[0].methods:
                _fuzz_as(channel, SERVICES[0].full_name, method, tally, metadata)
        assert not tally.defects, "\n".join(tally.defects[:20])
        with server.client(token=user) as c:  # (the user's own view, once more)
            assert CANARY not in {t.name for t in c.list_topics()}
            assert not any(CANARY in f for f in c.stats())
        with server.client(token="root-7f3a9c") as admin:
            assert _canary_state(server, admin) == before
            assert admin.query(message_id=delayed)  # still pending
            got = []
            while batch := admin.pop(CANARY, "canary-check", max_messages=32):
                got += [m.body for m in batch]
            assert sorted(got) == sorted(SECRET + b"-%d" % i for i in range(6))
    finally:
        server.stop()
    assert sum(tally.statuses.values()) >= EXAMPLES * 20
    print("\n".join(tally.lines()))


def _canary_state(server: RunningServer, admin: ChronomqClient) -> object:
    """What a user outside the canary must not change: its queues' offsets, its group's
    figures, its schedule."""
    store = server.server.broker.store
    (schedule,) = [s for s in admin.list_schedules() if s.topic == CANARY]
    figures = {k: v for k, v in admin.stats().items() if f".{CANARY}." in k}
    return ([store.queue_bounds(CANARY, q) for q in range(2)], sorted(figures.items()),
            (schedule.name, schedule.every_s, schedule.paused, schedule.body,
             schedule.generation))


def _fuzz_as(channel: grpc.Channel, service: str, method: object, tally: Tally,
             metadata: tuple[tuple[str, str], ...]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        requests = data.draw(frames(method))  # type: ignore[arg-type]
        answers: list[bytes] = []
        details: list[str] = []
        code = call(channel, service, method, requests, answers,  # type: ignore[arg-type]
                    metadata=metadata, timeout_s=0.5, details=details)
        tally.record(f"{service}/{method.name}", code, requests)  # type: ignore[attr-defined]
        assert code not in BAD_CODES
        assert code != grpc.StatusCode.UNAUTHENTICATED, details
        assert not any(SECRET in a or CANARY.encode() in a for a in answers), \
            "the canary leaked"
        assert not any(CANARY in d for d in details), details

    run()


def test_hostile_updates_and_page_tokens_leave_every_schedule_valid(tmp_path: Path) -> None:
    """UpdateSchedule of an existing schedule with hostile values in any settings, and
    hostile page tokens: answered OK, INVALID_ARGUMENT or NOT_FOUND (never INTERNAL or
    UNKNOWN), and what the broker holds afterwards is a schedule a create accepts, with
    its name and generation unchanged."""
    server = RunningServer(broker_config(tmp_path / "data"))
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
               grpc.StatusCode.NOT_FOUND}
    seen: dict[grpc.StatusCode, int] = {}
    hostile = message_strategy(broker_pb2.Schedule.DESCRIPTOR)
    masks = st.lists(st.one_of(st.sampled_from(SETTINGS), st.sampled_from(
        ["fired", "paused", "name", "generation", "", "cron ", "\x00"]), st.text(
            max_size=8)), max_size=5)
    try:
        with server.client() as c:
            c.create_topic("t")
            c.create_schedule("s", "t", b"x", cron="0 9 * * *")

            @settings(max_examples=EXAMPLES * 3, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(hostile, masks, st.booleans(), st.text(max_size=12))
            # an update that is answered OK, whatever the draw (a CI run drew 180 hostile
            # ones and none was valid)
            @example(broker_pb2.Schedule(name="s", cron="0 10 * * *"), ["cron"], True, "")
            def run(schedule: broker_pb2.Schedule, mask: list[str], own_name: bool,
                    token: str) -> None:
                if own_name:
                    schedule.name = "s"
                try:
                    c.call("UpdateSchedule", broker_pb2.UpdateScheduleRequest(
                        schedule=schedule, update_mask=mask))
                    code = grpc.StatusCode.OK
                except RpcError as exc:
                    code = exc.code
                assert code in allowed, (code, schedule, mask)
                seen[code] = seen.get(code, 0) + 1
                (held,) = c.list_schedules()
                spec_of(held, 64 << 10)  # still what a create accepts
                assert (held.name, held.generation) == ("s", 0)
                try:
                    c.list_schedules_page(page_token=token)
                except RpcError as exc:
                    assert exc.code == grpc.StatusCode.INVALID_ARGUMENT, exc
            run()
    finally:
        server.stop()
    assert seen.get(grpc.StatusCode.OK) and seen.get(grpc.StatusCode.INVALID_ARGUMENT)


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(["a", "b", "a~1"]),
              st.binary(min_size=1, max_size=4), st.sampled_from([0, 0, 1000]),
              st.sampled_from([0, 1, 2, -1, 7, 2**31 - 1, -(2**31)]), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([0, 500, 1000])),
    st.tuples(st.just("pop"), st.booleans())), max_size=12)


def test_hostile_debounces_never_put_two_bodies_under_one_id(tmp_path: Path) -> None:
    """Any sequence of Sends with replace (any ``if_delivered`` number, ids that look like
    a generation), timer steps, acks and nacks: each answer is OK with its case, or
    INVALID_ARGUMENT (an ``if_delivered`` the enum does not name) or FAILED_PRECONDITION
    (``REFUSE``); an OK's id is the id sent or one of its generations; and no id ever
    reaches a consumer with two bodies."""
    env = ManualBroker(tmp_path, {})
    topics = iter(range(10**6))
    try:
        @settings(max_examples=max(EXAMPLES // 2, 10), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(_STEPS)
        def run(steps: list[tuple[object, ...]]) -> None:
            topic = f"d{next(topics)}"
            env.client.create_topic(topic, queue_count=1)
            bodies: dict[str, set[bytes]] = {}

            def received(ack: bool) -> None:
                for group in ("g1", "g2"):
                    got = env.client.pop(topic, group, max_messages=32)
                    for m in got:
                        bodies.setdefault(m.message_id, set()).add(m.body)
                    handles = [m.receipt_handle for m in got]
                    if handles:
                        if ack or group == "g2":
                            env.client.ack(group, handles)
                        else:
                            env.client.nack(group, handles, delay_ms=500)

            for step in steps:
                if step[0] == "tick":
                    env.tick(int(step[1]))  # type: ignore[call-overload]
                elif step[0] == "pop":
                    received(bool(step[1]))
                else:
                    _, mid, body, delay, if_delivered, replace = step
                    m = broker_pb2.OutgoingMessage(topic=topic, body=body, message_id=mid,
                                                   replace=replace, delay_ms=delay,
                                                   if_delivered=if_delivered)
                    (out,) = env.client.send([m])
                    if if_delivered == 0 or (replace and if_delivered == 1):
                        assert out.ok or out.error_code == 9, out  # FAILED_PRECONDITION
                    else:  # not a value of the enum, or a setting without replace
                        assert out.error_code == 3, out  # INVALID_ARGUMENT
                    if out.ok and replace:
                        assert out.replace_outcome in ("REPLACED", "NONE_PENDING",
                                                       "ALREADY_DELIVERED")
                        assert out.message_id == mid or \
                            out.message_id.removeprefix(f"{mid}~").isdigit()
                    elif out.error_code == 9:
                        assert replace and if_delivered == 1
            env.tick(3000)
            received(True)
            env.tick(3000)
            received(True)
            assert all(len(b) == 1 for b in bodies.values()), bodies

        run()
    finally:
        env.close()
