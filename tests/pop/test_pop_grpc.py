"""POP over the real gRPC server on 127.0.0.1: groups, long polling, Subscribe, revive,
and kill -9 with messages in flight."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, message
from chronomq.v1 import broker_pb2 as pb
from pop.handle import HandleCodec
from testkit.process import ServerProcess
from tests.conftest import RunningServer


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _send(c: ChronomqClient, topic: str, n: int) -> list[str]:
    out = c.send([message(topic, f"m{i}".encode()) for i in range(n)])
    assert all(o.ok for o in out)
    return [o.message_id for o in out]


def test_two_consumers_of_a_group_never_hold_the_same_message(
        client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("t", queue_count=3)
    ids = set(_send(client, "t", 300))
    held: list[list[str]] = [[], []]

    def consume(n: int) -> None:
        with server.client() as c:
            while got := c.pop("t", "G", max_messages=7, invisible_time_s=60):
                held[n] += [m.message_id for m in got]  # never acked: all stay leased

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not set(held[0]) & set(held[1])
    assert len(held[0]) + len(held[1]) == 300 and set(held[0]) | set(held[1]) == ids
    assert held[0] and held[1]
    # another group gets every message too
    other: set[str] = set()
    while got := client.pop("t", "H", max_messages=32):
        other |= {m.message_id for m in got}
    assert other == ids


def test_long_poll_wakes_on_timer_delivery_and_on_revive(client: ChronomqClient) -> None:
    client.create_topic("t")
    due = _now_ms() + 800
    mid = client.send_one("t", b"later", deliver_at_ms=due)
    got = client.pop("t", "G", invisible_time_s=1, wait_ms=5000)
    received = _now_ms()
    assert [m.message_id for m in got] == [mid] and received >= due
    deadline = due + 1000  # leased no earlier than due; not acked: back after 1 s
    again = client.pop("t", "G", wait_ms=5000)
    assert [m.message_id for m in again] == [mid] and _now_ms() >= deadline
    assert again[0].delivery_attempt == 2 and again[0].topic == "t"


def test_unary_change_invisible_time_nack_and_dead_letter(client: ChronomqClient) -> None:
    client.create_topic("t")
    _send(client, "t", 3)
    a, b, c = client.pop("t", "G", invisible_time_s=60)
    new_a = client.change_invisible_time("G", a.receipt_handle, 0)  # visible now
    (err,) = client.ack("G", [a.receipt_handle])
    assert "ChangeInvisibleTime" in err or "expired" in err
    assert new_a != a.receipt_handle
    assert client.nack("G", [b.receipt_handle], delay_ms=0) == [""]
    assert client.dead_letter("G", [c.receipt_handle], reason="poison") == [""]
    back = client.pop("t", "G", invisible_time_s=60, wait_ms=3000)
    while len(back) < 2:
        back += client.pop("t", "G", invisible_time_s=60, wait_ms=3000)
    assert sorted(m.body for m in back) == [b"m0", b"m1"]
    assert all(m.delivery_attempt == 2 for m in back)
    (dead,) = client.pop("%DLQ%G%t", "ops", wait_ms=3000)
    assert dead.body == b"m2" and dead.properties["chronomq.dlq.reason"] == "poison"
    figures = client.stats()
    assert figures["group.G.t.dead_lettered"] == 1 and figures["group.G.t.in_flight"] == 2


def test_subscribe_pushes_within_its_credit(client: ChronomqClient,
                                            server: RunningServer) -> None:
    client.create_topic("s", queue_count=2)
    _send(client, "s", 20)
    with client.subscribe("s", "G", invisible_time_s=60, max_outstanding=5) as sub:
        responses = sub.responses()
        first: list[pb.ReceivedMessage] = []
        while len(first) < 5:
            first += next(responses).messages
        assert len(first) == 5
        (g,) = [x for x in server.server.broker.pop.group_statistics() if x.group == "G"]
        assert g.in_flight == 5 and g.backlog == 15  # the credit holds the rest back
        sub.ack([m.receipt_handle for m in first])
        second: list[pb.ReceivedMessage] = []
        while len(second) < 5:
            second += next(responses).messages
        sub.nack([second[0].receipt_handle], delay_ms=0)
        sub.change(second[1].receipt_handle, 120)
        sub.ack(["forged-handle"])
        changed: list[pb.HandleChange] = []
        errors: list[pb.SettleError] = []
        redelivered: list[pb.ReceivedMessage] = []
        while not (changed and errors and redelivered):
            r = next(responses)
            changed += r.changed
            errors += r.errors
            redelivered += [m for m in r.messages if m.delivery_attempt == 2]
        assert changed[0].old_receipt_handle == second[1].receipt_handle
        assert changed[0].receipt_handle and not changed[0].HasField("error")
        assert errors[0].receipt_handle == "forged-handle"
        assert redelivered[0].message_id == second[0].message_id


def test_subscribe_wakes_on_send(client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("w")
    with client.subscribe("w", "G") as sub, server.client() as producer:
        got: list[pb.ReceivedMessage] = []

        def read() -> None:
            for m in sub.messages():
                got.append(m)
                sub.ack([m.receipt_handle])
                if len(got) == 3:
                    return

        reader = threading.Thread(target=read)
        reader.start()
        for i in range(3):
            producer.send_one("w", f"n{i}".encode())
        reader.join(10)
        assert sorted(m.body for m in got) == [b"n0", b"n1", b"n2"]


def test_subscribe_rejects_bad_settings(client: ChronomqClient) -> None:
    client.create_topic("t")
    with client.subscribe("t", "G", invisible_time_s=0) as sub, pytest.raises(Exception) as e:
        next(sub.responses())
    assert "invisible_time_s" in str(e.value)
    with client.subscribe("missing", "G") as sub, pytest.raises(Exception) as e:
        next(sub.responses())
    assert "NOT_FOUND" in str(e.value)


@pytest.mark.slow
def test_sigkill_with_messages_in_flight(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    with ChronomqClient(srv.target) as c:
        c.create_topic("k", queue_count=2)
        _send(c, "k", 40)
        leased = []
        while len(leased) < 40:
            leased += c.pop("k", "G", invisible_time_s=3)
        # each lease's exact deadline, from its handle (the broker's secret is on disk)
        codec = HandleCodec((tmp_path / "data" / "pop-secret").read_bytes())
        deadline = {m.message_id: codec.decode("G", m.receipt_handle).expire_at_ms
                    for m in leased}
        acked = leased[:25]
        assert c.ack("G", [m.receipt_handle for m in acked]) == [""] * 25
    srv.kill9()
    srv = ServerProcess(tmp_path / "data")
    try:
        with ChronomqClient(srv.target) as c:
            back: list[pb.ReceivedMessage] = []
            give_up = time.monotonic() + 30
            while time.monotonic() < give_up and len(back) < 15:
                got = c.pop("k", "G", invisible_time_s=60, wait_ms=2000)
                now = _now_ms()
                assert all(now >= deadline[m.message_id] for m in got)  # never early
                back += got
            assert {m.message_id for m in back} == {m.message_id for m in leased[25:]}
            assert all(m.delivery_attempt == 2 for m in back)
            assert c.pop("k", "G", wait_ms=1500) == []  # acked ones never come back
    finally:
        srv.terminate()


def test_closing_a_subscription_gives_back_what_it_held(client: ChronomqClient) -> None:
    client.create_topic("c")
    ids = set(_send(client, "c", 4))
    with client.subscribe("c", "G", invisible_time_s=600, max_outstanding=10) as sub:
        responses = sub.responses()
        held: list[pb.ReceivedMessage] = []
        while len(held) < 4:
            held += next(responses).messages
        sub.ack([held[0].receipt_handle])  # applied before the stream ends
    back: list[pb.ReceivedMessage] = []
    while len(back) < 3:
        got = client.pop("c", "G", wait_ms=3000)
        assert got, "the closed stream's messages did not come back"
        back += got
    assert {m.message_id for m in back} == ids - {held[0].message_id}
    assert all(m.delivery_attempt == 2 for m in back)
