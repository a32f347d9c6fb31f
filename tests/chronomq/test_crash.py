"""kill -9 in the middle of a stream of sends loses no acknowledged message."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess
from testkit.wait import wait_until


def _send_until_killed(target: str, acked: list[str], stop: threading.Event) -> None:
    batch_no = 0

    def batches():  # type: ignore[no-untyped-def]
        nonlocal batch_no
        while not stop.is_set():
            batch_no += 1
            yield [message("crash", f"{batch_no}-{i}".encode() * 10, key=f"k{i % 7}")
                   for i in range(20)]

    with ChronomqClient(target) as c:
        try:
            for outcomes in c.send_stream(batches()):
                acked.extend(o.message_id for o in outcomes if o.ok)
        except RpcError:
            pass  # the server died under us: expected


def kill_while_sending(srv: ServerProcess, at_least: int) -> list[str]:
    """Two SendStreams send to topic "crash" until ``at_least`` messages are
    acknowledged (fails after 30 s), then the server is killed with SIGKILL while both are
    busy; returns the acknowledged ids."""
    acked: list[str] = []
    stop = threading.Event()
    threads = [threading.Thread(target=_send_until_killed, args=(srv.target, acked, stop))
               for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= at_least, 30, f"{at_least} acknowledged sends",
                   show=lambda: len(acked))
    finally:
        srv.kill9()
        stop.set()
        for t in threads:
            t.join(30)
    return acked


def _drain(c: ChronomqClient) -> set[str]:
    seen: set[str] = set()
    while got := c.pop("crash", "verify", max_messages=32, invisible_time_s=300, wait_ms=0):
        seen.update(m.message_id for m in got)
        c.ack("verify", [m.receipt_handle for m in got])
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(3))
def test_sigkill_during_sends_loses_no_acknowledged_message(tmp_path: Path,
                                                            round_no: int) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data, "store.segment_bytes=262144")
    with ChronomqClient(srv.target) as c:
        c.create_topic("crash", queue_count=3)
    # When: the server is killed with SIGKILL while both streams are busy
    acked = kill_while_sending(srv, 2000 * (round_no + 1))
    assert len(acked) >= 2000, "the senders never got going"
    # Then: after a restart every acknowledged message is there, exactly once
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            seen = _drain(c)
            assert set(acked) <= seen
            assert len(seen) >= len(set(acked))
            # and the broker keeps working
            mid = c.send_one("crash", b"after")
            assert c.query(message_id=mid)[0].body == b"after"
    finally:
        assert srv.terminate() == 0
