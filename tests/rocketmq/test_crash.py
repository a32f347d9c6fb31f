"""kill -9 of ``chronomq serve`` while RocketMQ producers send through the front: every
send that was answered OK is there after the restart, once."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from chronomq.rocketmq.pb import service_grpc
from testkit.process import ServerProcess
from testkit.wait import wait_until

SETTINGS = ("rocketmq.enabled=true", "rocketmq.port=0")


def _send_until_killed(target: str, lane: int, acked: list[str], stop: threading.Event) -> None:
    with grpc.insecure_channel(target) as ch:
        stub = service_grpc.MessagingServiceStub(ch)
        seq = 0
        while not stop.is_set():
            ids = [f"LANE{lane}-{seq + i}" for i in range(10)]
            seq += 10
            request = rs.SendMessageRequest(messages=[rd.Message(
                topic=rd.Resource(name="crash"), body=mid.encode(),
                system_properties=rd.SystemProperties(message_id=mid, message_type=rd.NORMAL))
                for mid in ids])
            try:
                r = stub.SendMessage(request, timeout=5)
            except grpc.RpcError:
                return  # the server died under us: expected
            acked.extend(e.message_id for e in r.entries if e.status.code == rd.OK)


@pytest.mark.slow
def test_kill9_loses_no_acknowledged_send(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data, *SETTINGS)
    with ChronomqClient(srv.target) as c:
        c.create_topic("crash", queue_count=2)
    acked: list[str] = []
    stop = threading.Event()
    lanes = [threading.Thread(target=_send_until_killed, args=(srv.rocketmq_target, i, acked,
                                                               stop)) for i in range(4)]
    for t in lanes:
        t.start()
    try:  # the senders got going
        wait_until(lambda: len(acked) >= 1000, 30, "1000 acknowledged sends",
                   show=lambda: len(acked))
    finally:
        srv.kill9()
        stop.set()
        for t in lanes:
            t.join(30)
    srv = ServerProcess(data, *SETTINGS)
    try:
        with ChronomqClient(srv.target) as c:
            seen: list[str] = []
            while got := c.pop("crash", "verify", max_messages=32, invisible_time_s=300):
                seen.extend(m.message_id for m in got)
                c.ack("verify", [m.receipt_handle for m in got])
        assert set(acked) <= set(seen)
        assert len(seen) == len(set(seen))  # a retried id is stored once
    finally:
        assert srv.terminate() == 0
