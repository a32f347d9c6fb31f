"""A broker whose data volume fills up: a real small filesystem (a tmpfs the test mounts)
under a real broker subprocess.

What must hold: sends above the watermark are refused with RESOURCE_EXHAUSTED naming the
volume, nothing answered OK is lost, Pop / Ack / Stats keep working (on the space the
watermark keeps), sends resume by themselves once space comes back, SIGTERM exits 0 and
a restart works on a volume filled to the last byte by someone else.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess
from tests.conftest import fill_volume as fill

VOLUME_MB = 48
BODY = b"d" * (60 << 10)


def send_until_refused(client: ChronomqClient, ledger: list[str],
                       max_batches: int = 2000) -> RpcError:
    for _ in range(max_batches):
        try:
            outcomes = client.send([message("t", BODY) for _ in range(4)])
        except RpcError as exc:
            return exc
        assert all(o.ok for o in outcomes), outcomes
        ledger.extend(o.message_id for o in outcomes)
    raise AssertionError("the volume never filled")


def drain(client: ChronomqClient, group: str) -> set[str]:
    got: set[str] = set()
    while batch := client.pop("t", group, max_messages=32, invisible_time_s=60):
        errors = client.ack(group, [m.receipt_handle for m in batch])
        assert errors == [""] * len(batch)
        got.update(m.message_id for m in batch)
    return got


def test_a_full_volume_refuses_sends_cleanly_and_keeps_consumers_going(
        small_volume: Callable[[int], Path]) -> None:
    volume = small_volume(VOLUME_MB)
    data = volume / "data"
    settings = ("store.segment_bytes=4194304", "store.disk_reserve_bytes=4194304")
    ballast = volume / "someone-elses-file"
    flood = volume / "filled-to-the-last-byte"
    fill(ballast, (VOLUME_MB // 2) << 20)  # half the volume belongs to someone else
    server = ServerProcess(data, *settings)
    ledger: list[str] = []
    try:
        with ChronomqClient(server.target) as client:
            client.create_topic("t", queue_count=2)
            refused = send_until_refused(client, ledger)
            assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert str(volume) in refused.details and "%" in refused.details
            stats = client.stats()
            assert stats["disk.refused_sends"] >= 1  # refused a request short of the mark
            assert stats["disk.used_ratio"] >= stats["disk.max_used_ratio"] - 0.02
            # consumers go on: Pop and Ack work on the space the watermark keeps ...
            first = client.pop("t", "g", max_messages=8, invisible_time_s=60)
            assert first and client.ack("g", [m.receipt_handle for m in first]) == [""] * 8
            # ... and when someone else fills the volume to the last byte
            fill(flood)
            second = client.pop("t", "g", max_messages=8, invisible_time_s=60)
            assert second and client.ack("g", [m.receipt_handle for m in second]) == [""] * 8
        assert server.terminate() == 0, "".join(server.output[-30:])
        # a restart on the full volume works, and nothing answered OK is lost
        server = ServerProcess(data, *settings)
        with ChronomqClient(server.target) as client:
            got = {m.message_id for m in first + second} | drain(client, "g")
            assert set(ledger) <= got
            with pytest.raises(RpcError) as refused_again:
                client.send([message("t", BODY)])
            assert refused_again.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            # space comes back: sends resume without a restart
            ballast.unlink()
            flood.unlink()
            assert client.send([message("t", b"resumed")])[0].ok
            assert client.stats()["disk.used_ratio"] < 0.5
        assert server.terminate() == 0, "".join(server.output[-30:])
    finally:
        if server.proc.poll() is None:
            server.kill9()
