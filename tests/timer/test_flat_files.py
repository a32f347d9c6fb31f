"""Far-future timers parked in TimerFlatFiles on the tier, preloaded before their hour;
manual clock, real RocksDB, a local-directory tier and moto's S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig, TierConfig
from store.clock import ManualClock
from store.message import Draft
from store.store import StoreConfig
from store.topics import Topic
from tests.conftest import tier_config
from tests.tiered.faults import FaultyProvider
from timer.model import TimerConfig, TimerOutcome

SEC = 1000
# small horizons, as the settings allow: wheel 5 s, RocksDB 10 s, buckets of 5 s
TIMER = TimerConfig(wheel_window_ms=5 * SEC, rocks_horizon_ms=10 * SEC, bucket_ms=5 * SEC,
                    preload_ahead_ms=5 * SEC, flat_batch_ms=0)


class Env:
    def __init__(self, root: Path, clock: ManualClock, tier: TierConfig) -> None:
        self.root, self.clock, self.tier_config = root, clock, tier
        self.broker = Broker(BrokerConfig(store=StoreConfig(str(root / "data")), timer=TIMER,
                                          tier=tier), clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.timer = self.broker.timer

    def send(self, body: bytes, delay_ms: int) -> str:
        now = self.clock.now_ms()
        due, flags = self.broker.sender.resolve_deliver_at(0, delay_ms, now)
        (info,) = self.broker.sender.send([Draft("", "t", "", "", body, b"", now, due, flags, 0,
                                                 b"")]).result(10)
        self.settle()
        return info.message_id

    def settle(self) -> None:
        """Let the dispatcher catch up and write parked records (flat_batch_ms = 0)."""
        assert self.broker.store.wait_visible(10)
        self.timer.write_parked()

    def tick(self) -> list[bytes]:
        now = self.clock.now_ms()
        self.timer.preload_due(now)
        while not self.timer.load_due(now):
            self.timer.deliver_due(now)
        self.timer.deliver_due(now)
        self.settle()
        got = self.broker.pop.pop("t", "g", 32, 60)
        for p in got:
            self.broker.pop.ack("g", p.receipt_handle)
        return sorted(p.message.body for p in got)

    def objects(self) -> list[str]:
        return self.broker.tier.list()

    def close(self) -> None:
        self.broker.stop()


@pytest.fixture(params=["local", "s3"])
def env(request: pytest.FixtureRequest, tmp_path: Path,
        manual_clock: ManualClock) -> Iterator[Env]:
    tier = tier_config(request.param, tmp_path, request, "flat")
    e = Env(tmp_path, manual_clock, tier)
    e.broker.create_topic(Topic("t", 2))
    yield e
    e.close()


def test_routing_at_the_horizon(env: Env) -> None:
    near = env.send(b"near", 10 * SEC - 1)  # just inside the RocksDB horizon
    far = env.send(b"far", 10 * SEC)  # at the horizon: parked on the tier
    timers = env.broker.timer_store
    assert timers.locate(near) != [] and timers.locate_parked(near) == []
    assert timers.locate(far) == [] and timers.locate_parked(far) != []
    assert len(env.objects()) == 1 and env.objects()[0].startswith("broker-0/timer/")
    assert env.broker.timer.statistics().flat_objects == 1


def test_far_messages_are_preloaded_and_delivered_on_time(env: Env) -> None:
    # Given messages 30 s to 60 s ahead: all in TimerFlatFiles
    ids = [env.send(f"{s}".encode(), s * SEC) for s in (30, 31, 44, 60)]
    assert all(env.broker.timer_store.locate(i) == [] for i in ids)  # none in RocksDB
    buckets_before = {o.split("/")[2] for o in env.objects()}
    delivered: dict[int, list[bytes]] = {}
    for t in range(1, 62):
        env.clock.advance(SEC)
        got = env.tick()
        if got:
            delivered[t] = got
    # Then each is delivered at its second, none early
    assert delivered == {30: [b"30"], 31: [b"31"], 44: [b"44"], 60: [b"60"]}
    # and every bucket file was deleted after its preload
    assert env.objects() == [] and len(buckets_before) == 3


def test_cancel_and_reschedule_parked_messages(env: Env) -> None:
    gone = env.send(b"gone", 40 * SEC)
    moved = env.send(b"moved", 50 * SEC)
    kept = env.send(b"kept", 40 * SEC)
    assert env.timer.cancel(gone).outcome is TimerOutcome.CANCELLED
    moving = env.timer.reschedule(moved, env.clock.now_ms() + 2 * SEC)
    assert moving.outcome is TimerOutcome.RESCHEDULED
    delivered: list[bytes] = []
    for _ in range(55):
        env.clock.advance(SEC)
        delivered += env.tick()
    assert delivered == [b"moved", b"kept"]
    assert env.timer.cancel(gone).outcome is TimerOutcome.NOT_FOUND
    assert env.timer.cancel(kept).outcome is TimerOutcome.ALREADY_DELIVERED


def test_parked_messages_survive_restart(env: Env) -> None:
    env.send(b"far", 30 * SEC)
    env.close()
    env2 = Env(env.root, env.clock, env.tier_config)
    try:
        assert len(env2.objects()) == 1
        delivered: list[bytes] = []
        for _ in range(31):
            env.clock.advance(SEC)
            delivered += env2.tick()
        assert delivered == [b"far"]
    finally:
        env.broker = env2.broker  # closed by the fixture


def test_a_failed_flat_file_write_keeps_the_records_parked(tmp_path: Path,
                                                           manual_clock: ManualClock) -> None:
    e = Env(tmp_path, manual_clock, TierConfig(provider="local", local_dir=str(tmp_path / "t")))
    try:
        e.broker.create_topic(Topic("t", 1))
        flaky = FaultyProvider(e.broker.flat_files.provider, failures=1)
        e.broker.flat_files.provider = flaky
        now = e.clock.now_ms()
        due, flags = e.broker.sender.resolve_deliver_at(0, 30 * SEC, now)
        draft = Draft("", "t", "", "", b"far", b"", now, due, flags, 0, b"")
        e.broker.sender.send([draft]).result(10)
        assert e.broker.store.wait_visible(10)
        # When the tier refuses the write, the record stays parked (durably, in RocksDB;
        # the dispatch position does not wait for it)
        assert e.timer.write_parked() == 0
        assert flaky.failures == 0
        assert e.timer.statistics().parked_unwritten == 1
        e.timer.flush()
        assert e.timer.position() == e.broker.store.commitlog.confirmed_offset
        # Then the next round writes it, and it is delivered on time
        assert e.timer.write_parked() == 1
        assert e.timer.statistics().parked_unwritten == 0 and len(e.objects()) == 1
        e.clock.advance(30 * SEC)
        assert e.tick() == [b"far"]
    finally:
        e.close()
