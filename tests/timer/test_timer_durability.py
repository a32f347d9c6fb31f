"""Every step of a delayed message (parked in a TimerFlatFile -> preloaded into RocksDB ->
delivered under its topic) is redone or found done after a crash, and no interleaving of
the steps loses a message.  Manual clock, real RocksDB, a local-directory tier."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient
from store.clock import ManualClock
from store.crashpoint import CRASH_EXIT_CODE
from store.message import Draft
from store.topics import Topic
from testkit.process import ServerProcess
from tests.conftest import tier_config
from tests.timer.test_flat_files import SEC, Env
from tiered.provider import Provider


class _WriteDuringRead:
    """A provider that, when a TimerFlatFile object is first read, lets another thread's
    held object write land before the read returns."""

    def __init__(self, inner: Provider) -> None:
        self.inner, self.name = inner, "race"
        self.write_gate = threading.Event()
        self.write_gate.set()
        self.written = threading.Event()
        self.write_waiting = threading.Event()
        self.raced = False

    def write(self, path: str, data: bytes) -> None:
        if not self.write_gate.is_set():
            self.write_waiting.set()
        self.write_gate.wait(10)
        self.inner.write(path, data)
        self.written.set()

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        data = self.inner.read(path, offset, length)
        if not self.raced and "/timer/" in path:
            self.raced = True
            self.write_gate.set()  # the held write goes ahead while preload is busy
            self.written.wait(10)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_an_object_written_while_its_bucket_is_preloaded_is_not_deleted_unread(
        request: object, tmp_path: Path, manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, tier_config("local", tmp_path, request, "race"))  # type: ignore[arg-type]
    try:
        env.broker.create_topic(Topic("t", 1))
        race = _WriteDuringRead(env.broker.flat_files.provider)
        env.broker.flat_files.provider = race
        # Given: one message of a far bucket already in its TimerFlatFile ...
        env.send(b"first", 16 * SEC)
        # ... and a second one whose object write is still in flight
        race.written.clear()
        race.write_gate.clear()
        sender = threading.Thread(target=env.send, args=(b"second", 17 * SEC))
        sender.start()
        assert race.write_waiting.wait(10)  # parked, swapped out, its write held
        # When: the bucket is preloaded while that write lands
        env.clock.advance(11 * SEC)
        env.timer.preload_due(env.clock.now_ms())
        sender.join(10)
        assert race.raced
        # Then: both messages are delivered when due, the second one included
        env.clock.advance(7 * SEC)
        got = env.tick()
        got += env.tick()
        assert got == [b"first", b"second"]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("label", ["timer.after_deliver_append", "timer.after_deliver_remove"])
def test_a_crash_around_delivery_delivers_each_message_once(tmp_path: Path, label: str) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data, f"server.crash_at={label}:1")
    with ChronomqClient(srv.target) as c:
        c.create_topic("t", queue_count=2)
        ids = [c.send_one("t", f"m{i}".encode(), delay_ms=300) for i in range(20)]
    # When: the server dies at the crash point, on its first delivery batch
    assert srv.wait_exit() == CRASH_EXIT_CODE
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            seen: list[str] = []
            deadline = time.monotonic() + 15
            while len(seen) < len(ids) and time.monotonic() < deadline:
                got = c.pop("t", "g", max_messages=32, invisible_time_s=60, wait_ms=500)
                seen += [m.message_id for m in got]
                if got:
                    c.ack("g", [m.receipt_handle for m in got])
            # a second look: nothing more arrives (no second copy of any message)
            got = c.pop("t", "g", max_messages=32, invisible_time_s=60, wait_ms=1500)
            seen += [m.message_id for m in got]
        assert sorted(seen) == sorted(ids)
    finally:
        assert srv.terminate() == 0


@pytest.mark.slow
def test_a_cancel_made_while_a_far_message_is_parked_survives_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = ("timer.rocks_horizon_ms=2000", "timer.bucket_ms=1000",
                "timer.preload_ahead_ms=1000", "timer.wheel_window_ms=1000",
                "timer.preload_interval_ms=200",
                "timer.flat_batch_ms=60000")  # the far message stays parked
    srv = ServerProcess(data, *settings)
    with ChronomqClient(srv.target) as c:
        c.create_topic("t", queue_count=1)
        far = c.send_one("t", b"far", delay_ms=4000)  # beyond the horizon: parked
        near = c.send_one("t", b"near", delay_ms=1500)  # in RocksDB
        assert c.cancel(near).outcome == "CANCELLED"
    srv.kill9()
    srv = ServerProcess(data, *settings)
    try:
        with ChronomqClient(srv.target) as c:
            seen: list[str] = []
            deadline = time.monotonic() + 8
            while far not in seen and time.monotonic() < deadline:
                got = c.pop("t", "g", max_messages=32, invisible_time_s=60, wait_ms=500)
                seen += [m.message_id for m in got]
        assert seen == [far]  # the cancelled message never arrives
    finally:
        assert srv.terminate() == 0


def test_two_parked_messages_with_one_id_are_both_delivered(
        request: object, tmp_path: Path, manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, tier_config("local", tmp_path, request, "same"))  # type: ignore[arg-type]
    try:
        for topic in ("t", "u"):
            env.broker.create_topic(Topic(topic, 1))
        # Given: one client-chosen id, far ahead, in two topics (both parked, then written
        # to their TimerFlatFile)
        now = env.clock.now_ms()
        due, flags = env.broker.sender.resolve_deliver_at(0, 16 * SEC, now)
        env.broker.sender.send([Draft("same-id", topic, "", "", topic.encode(), b"", now, due,
                                      flags, 0, b"") for topic in ("t", "u")]).result(10)
        env.settle()
        # When: their bucket is preloaded and they come due
        env.clock.advance(16 * SEC)
        assert env.timer.preload_due(env.clock.now_ms()) == 2
        # Then: each topic gets its message (``tick`` pops topic t)
        assert env.tick() == [b"t"]
        got = env.broker.pop.pop("u", "g", 32, 60)
        assert [p.message.body for p in got] == [b"u"]
    finally:
        env.close()
