"""Per-key flow control from outside: a Subscribe consumer and long-polling Pops over
real gRPC on 127.0.0.1, the groups figures and ``chronomq groups``."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from chronomq.cli import main
from chronomq.client import ChronomqClient, message
from pop.flowcontrol import KeyLimits
from testkit.process import ServerProcess
from tests.conftest import RunningServer, broker_config


def _server(tmp_path: Path, limits: KeyLimits) -> RunningServer:
    return RunningServer(dataclasses.replace(broker_config(tmp_path / "data"),
                                             key_limits={"G": limits}))


def test_a_subscribe_consumer_gets_every_cold_key_while_the_hot_one_waits_its_turn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = _server(tmp_path, KeyLimits(max_in_flight_per_key=1))
    try:
        with server.client() as c:
            c.create_topic("t", queue_count=2)
            # Given a hot key's 100 messages ahead of 100 cold keys' 3 each
            c.send([message("t", b"hot-%d" % i, key="hot") for i in range(100)])
            for _ in range(3):
                c.send([message("t", b"cold", key=f"cold-{k}") for k in range(100)])
            got: list[bytes] = []
            hot_unacked = hot_max = 0
            cold = 0
            deadline = time.monotonic() + 60
            with c.subscribe("t", "G", invisible_time_s=30, max_outstanding=64) as sub:
                for response in sub.responses():
                    for m in response.messages:
                        got.append(m.body)
                        if m.key == "hot":
                            hot_unacked += 1
                            hot_max = max(hot_max, hot_unacked)
                        else:
                            cold += 1
                    # the cold ones at once; the hot one after the others of its response
                    sub.ack([m.receipt_handle for m in response.messages])
                    hot_unacked = 0
                    if len(got) >= 400 or time.monotonic() > deadline:
                        break
            # Then every message came, the hot key's in order, never two at once
            assert cold == 300 and hot_max == 1
            assert [b for b in got if b.startswith(b"hot")] == [b"hot-%d" % i
                                                                 for i in range(100)]
            # a long-polling Pop is woken when the hot key has room again
            c.send([message("t", b"hot-a", key="hot"), message("t", b"hot-b", key="hot")])
            (first,) = c.pop("t", "G", max_messages=8, wait_ms=2000)
            stats = c.stats()
            assert stats["group.G.t.held_by_key"] == 1
            assert stats["group.G.t.max_in_flight_per_key"] == 1
            assert main(["groups", "--json", "--target", server.target]) == 0
            row = next(r for r in json.loads(capsys.readouterr().out) if r["group"] == "G")
            assert row["held_by_key"] == 1 and row["in_flight"] == 1
            waited: list[tuple[float, list[bytes]]] = []

            def long_poll() -> None:
                with server.client() as other:
                    t0 = time.monotonic()
                    bodies = [m.body for m in other.pop("t", "G", max_messages=8,
                                                        wait_ms=20_000)]
                    waited.append((time.monotonic() - t0, bodies))

            poller = threading.Thread(target=long_poll)
            poller.start()
            time.sleep(0.3)  # the Pop is waiting: nothing may go out yet
            assert not waited
            c.ack("G", [first.receipt_handle])  # the ack wakes it
            poller.join(30)
            ((seconds, bodies),) = waited
            assert first.body == b"hot-a" and bodies == [b"hot-b"] and seconds < 15
    finally:
        server.stop()


@pytest.mark.slow
def test_held_messages_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data, "groups.G.max_in_flight_per_key=1")
    with ChronomqClient(srv.target) as c:
        c.create_topic("t", queue_count=2)
        c.send([message("t", b"h%d" % i, key="hot") for i in range(30)])
        (first,) = c.pop("t", "G", max_messages=32, invisible_time_s=2)
        assert first.body == b"h0" and c.stats()["group.G.t.held_by_key"] == 29
    srv.kill9()  # with 29 held and h0 leased, never acked
    srv = ServerProcess(data, "groups.G.max_in_flight_per_key=1")
    try:
        with ChronomqClient(srv.target) as c:
            seen: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(seen) < 30 and time.monotonic() < deadline:
                batch = c.pop("t", "G", max_messages=32, invisible_time_s=30, wait_ms=500)
                assert len(batch) <= 1
                seen += [m.body for m in batch]
                if batch:
                    c.ack("G", [m.receipt_handle for m in batch])
        # every one once: the held ones in order, h0 again once its lease ran out
        assert sorted(seen) == sorted(b"h%d" % i for i in range(30))
        assert [b for b in seen if b != b"h0"] == [b"h%d" % i for i in range(1, 30)]
    finally:
        assert srv.terminate() == 0
