"""Delayed delivery end to end: real server on 127.0.0.1, real clock, and kill -9."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.conftest import CREDS, RunningServer, create_bucket


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_delayed_send_pop_cancel_reschedule(client: ChronomqClient,
                                            server: RunningServer) -> None:
    client.create_topic("d")
    sent_at = _now_ms()
    (keep, drop, move) = [o.message_id for o in client.send([
        message("d", b"keep", delay_ms=3000), message("d", b"drop", delay_ms=3000),
        message("d", b"move", delay_ms=60_000)])]
    assert client.cancel(drop)[:2] == ("CANCELLED", 1)
    outcome, changed, due = client.reschedule(move, delay_ms=3200)
    assert (outcome, changed) == ("RESCHEDULED", 1) and due >= sent_at + 3200
    popped = client.pop("d", "g")
    # nothing is due yet (3 s leave room for a loaded machine; 1.5 s once did not)
    assert _now_ms() >= sent_at + 3000 or popped == []
    got: dict[bytes, tuple[int, int]] = {}
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        for m in client.pop("d", "g", wait_ms=2000):
            got[m.body] = (_now_ms(), m.deliver_at_ms)
            client.ack("g", [m.receipt_handle])
    assert set(got) == {b"keep", b"move"}
    for received_at, deliver_at in got.values():
        assert received_at >= deliver_at  # never early
    assert client.cancel(keep)[:2] == ("ALREADY_DELIVERED", 0)
    assert client.stats()["timer.delivered"] == 2


@pytest.mark.slow
def test_sigkill_with_pending_and_delivering_timers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data)
    start = _now_ms()
    ids: dict[str, int] = {}
    with ChronomqClient(srv.target) as c:
        c.create_topic("k", queue_count=2)
        # Given 4,000 messages due between 0.8 s and 3 s from now, many at the same instant
        for b in range(40):
            due = start + 800 + (b % 8) * 300
            out = c.send([message("k", f"{b}-{i}".encode(), deliver_at_ms=due)
                          for i in range(100)])
            ids.update({o.message_id: due for o in out})
        # When the broker is killed while some are delivered (the first instant's 500 and
        # more), some are being delivered, and the rest are pending
        wait_until(lambda: c.stats()["timer.delivered"] >= 600, 30, "600 timers delivered",
                   show=lambda: c.stats()["timer.delivered"])
    srv.kill9()
    srv = ServerProcess(data)
    try:
        seen: dict[str, int] = {}
        duplicates = 0
        with ChronomqClient(srv.target) as c:
            deadline = time.monotonic() + 30
            while len(seen) < len(ids) and time.monotonic() < deadline:
                for m in c.pop("k", "g", max_messages=32, wait_ms=1000):
                    received = _now_ms()
                    assert received >= m.deliver_at_ms == ids[m.message_id]  # never early
                    duplicates += m.message_id in seen
                    seen[m.message_id] = received
                    c.ack("g", [m.receipt_handle])
        # Then every message is delivered, at or after its time
        assert set(seen) == set(ids)
        print(f"duplicates after kill -9: {duplicates}")
    finally:
        assert srv.terminate() == 0


SMALL_HORIZONS = ("timer.wheel_window_ms=1000", "timer.rocks_horizon_ms=2000",
                  "timer.bucket_ms=1000", "timer.preload_ahead_ms=1000",
                  "timer.preload_interval_ms=200", "timer.flat_batch_ms=100")


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["local", "s3"])
def test_far_future_through_flat_files_survives_kill9(tmp_path: Path, tier: str,
                                                     request: pytest.FixtureRequest) -> None:
    settings = list(SMALL_HORIZONS)
    if tier == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        create_bucket(endpoint, "flat-kill9")
        settings += ["tier.provider=s3", "tier.s3_bucket=flat-kill9",
                     f"tier.s3_endpoint_url={endpoint}",
                     f"tier.s3_access_key_id={CREDS['access_key_id']}",
                     f"tier.s3_secret_access_key={CREDS['secret_access_key']}"]
    data = tmp_path / "data"
    srv = ServerProcess(data, *settings)
    start = _now_ms()
    ids: dict[str, int] = {}
    with ChronomqClient(srv.target) as c:
        c.create_topic("far")
        # Given messages 3-6 s ahead: beyond the 2 s RocksDB horizon, so on the tier
        out = c.send([message("far", f"{i}".encode(), deliver_at_ms=start + 3000 + i * 30)
                      for i in range(100)])
        ids = {o.message_id: start + 3000 + i * 30 for i, o in enumerate(out)}
        # parked records are written at the next flush
        wait_until(lambda: c.stats()["timer.flat_objects"] >= 1, 2,
                   "a TimerFlatFile object (Stats timer.flat_objects >= 1)",
                   show=lambda: c.stats()["timer.flat_objects"], poll_s=0.05)
    # When the broker is killed before any is due, and restarted
    srv.kill9()
    srv = ServerProcess(data, *settings)
    try:
        seen: set[str] = set()
        with ChronomqClient(srv.target) as c:
            deadline = time.monotonic() + 20
            while len(seen) < len(ids) and time.monotonic() < deadline:
                for m in c.pop("far", "g", max_messages=32, wait_ms=1000):
                    assert _now_ms() >= m.deliver_at_ms == ids[m.message_id]  # never early
                    seen.add(m.message_id)
                    c.ack("g", [m.receipt_handle])
            # Then all are preloaded from the tier and delivered, and the files are gone
            assert seen == set(ids)
            assert c.stats()["timer.flat_objects"] == 0
    finally:
        assert srv.terminate() == 0
