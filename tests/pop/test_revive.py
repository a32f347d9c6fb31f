"""Revive, ChangeInvisibleTime, release with back-off and dead letters, on a real broker
(store, RocksDB, timer) driven by a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from pop.policy import RetryPolicy, parse_backoff
from pop.service import (
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_GROUP,
    PROP_DLQ_REASON,
    PROP_ORIGIN_TOPIC,
    AlreadyDone,
    HandleSuperseded,
    PoppedMessage,
    ReceiptHandleExpired,
    dlq_topic,
    retry_topic,
)
from store.clock import ManualClock
from store.errors import InvalidArgument
from store.message import Message, draft_of
from store.store import StoreConfig
from store.topics import Topic


class Env:
    def __init__(self, root: Path, clock: ManualClock, **groups: RetryPolicy) -> None:
        self.root, self.clock, self.groups = root, clock, groups
        cfg = BrokerConfig(store=StoreConfig(str(root / "data")), groups=dict(groups))
        self.broker = Broker(cfg, clock)
        self.broker.open()
        self.broker.start(timer_thread=False)
        self.pop = self.broker.pop

    def send(self, n: int, topic: str = "t", start: int = 0) -> list[str]:
        now = self.clock.now_ms()
        drafts = [draft_of(Message("", topic, f"m{start + i}".encode(), born_at_ms=now))
                  for i in range(n)]
        infos = self.broker.sender.send(drafts).result(10)
        self.settle()
        return [i.message_id for i in infos]

    def settle(self) -> None:
        assert self.broker.store.wait_visible(10)

    def advance(self, ms: int) -> int:
        """Move the clock; fire the timer and the revive wheel; return revived count."""
        self.clock.advance(ms)
        now = self.clock.now_ms()
        timer = self.broker.timer
        while not timer.load_due(now):
            timer.deliver_due(now)
        timer.deliver_due(now)
        self.settle()
        revived = self.pop.revive_due(now)
        self.settle()
        return revived

    def take(self, group: str = "G", n: int = 32, invisible_s: int = 30,
             topic: str = "t") -> list[PoppedMessage]:
        return self.pop.pop(topic, group, n, invisible_s)

    def bodies(self, got: list[PoppedMessage]) -> list[bytes]:
        return sorted(p.message.body for p in got)

    def close(self) -> None:
        self.broker.stop()

    def reopen(self) -> Env:
        self.close()
        return Env(self.root, self.clock, **self.groups)


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock, DL=RetryPolicy(max_attempts=3, backoff_ms=(2000,),
                                                   jitter=0.0))
    e.broker.create_topic(Topic("t", 2))
    yield e
    e.close()


def test_an_expired_lease_revives_at_its_deadline_with_the_next_attempt(env: Env) -> None:
    ids = env.send(3)
    got = env.take(invisible_s=10)
    env.pop.ack("G", got[0].receipt_handle)
    assert env.advance(9_999) == 0  # one ms before the deadline: nothing
    assert env.take() == []
    assert env.advance(1) == 2
    again = env.take()
    assert {p.message.message_id for p in again} == set(ids) - {got[0].message.message_id}
    assert all(p.delivery_attempt == 2 and p.message.topic == "t" for p in again)
    assert env.take() == []  # a revived message is leased once
    for p in again:
        env.pop.ack("G", p.receipt_handle)
    assert env.advance(60_000) == 0  # acked copies do not come back
    stats = {(s.group, s.topic): s for s in env.pop.group_statistics()}
    assert stats[("G", "t")].redelivered == 2 and stats[("G", "t")].in_flight == 0
    assert stats[("G", "t")].lag == 0


def test_ack_after_expiry_is_refused_and_the_message_comes_back(env: Env) -> None:
    env.send(1)
    (p,) = env.take(invisible_s=5)
    env.advance(5_000)
    with pytest.raises(ReceiptHandleExpired):
        env.pop.ack("G", p.receipt_handle)
    (again,) = env.take()
    assert again.message.message_id == p.message.message_id and again.delivery_attempt == 2


def test_change_invisible_time_extends_shortens_and_zero(env: Env) -> None:
    env.send(3)
    a, b, c = sorted(env.take(invisible_s=10), key=lambda p: p.message.body)
    a2 = env.pop.change_invisible_time("G", a.receipt_handle, 60)  # extend
    b2 = env.pop.change_invisible_time("G", b.receipt_handle, 2)  # shorten
    env.pop.change_invisible_time("G", c.receipt_handle, 0)  # visible now
    with pytest.raises(HandleSuperseded):
        env.pop.ack("G", a.receipt_handle)  # the old handle stopped working
    assert env.advance(0) == 1
    assert env.bodies(env.take()) == [b"m2"]
    assert env.advance(2_000) == 1  # b at its new, shorter deadline
    (b_again,) = env.take()
    assert b_again.message.body == b"m1"
    assert env.advance(8_000) == 0  # a's old deadline passes: still leased
    env.pop.ack("G", a2)
    with pytest.raises(AlreadyDone):
        env.pop.change_invisible_time("G", a2, 5)
    with pytest.raises(ReceiptHandleExpired):
        env.pop.ack("G", b2)
    with pytest.raises(InvalidArgument):
        env.pop.change_invisible_time("G", b_again.receipt_handle, 12 * 3600 + 1)


def test_change_invisible_time_survives_a_restart(env: Env) -> None:
    env.send(2)
    a, _ = sorted(env.take(invisible_s=10), key=lambda p: p.message.body)
    env.pop.change_invisible_time("G", a.receipt_handle, 100)
    env2 = env.reopen()
    try:
        assert env2.advance(10_000) == 1  # b at the original deadline, after a restart
        assert env2.bodies(env2.take(invisible_s=300)) == [b"m1"]
        assert env2.advance(90_000) == 1
        assert env2.bodies(env2.take()) == [b"m0"]
    finally:
        env.__dict__.update(env2.__dict__)


def test_release_uses_the_back_off_or_the_given_delay(env: Env) -> None:
    env.send(2)
    a, b = sorted(env.take(group="DL"), key=lambda p: p.message.body)
    assert env.pop.release_many("DL", [(a.receipt_handle, None), (b.receipt_handle, 500)]) \
        == [None, None]
    assert env.pop.release_many("DL", [(a.receipt_handle, None)]) == [None]  # idempotent
    env.advance(499)
    assert env.take(group="DL") == []
    env.advance(1)
    assert env.bodies(env.take(group="DL")) == [b"m1"]
    env.advance(1_499)
    assert env.take(group="DL") == []  # the group's back-off: 2 s, never earlier
    env.advance(1)
    (again,) = env.take(group="DL")
    assert again.message.body == b"m0" and again.delivery_attempt == 2


def test_max_attempts_moves_a_message_to_the_dead_letter_topic(env: Env) -> None:
    (mid,) = env.send(1)
    for attempt in (1, 2, 3):
        (p,) = env.take(group="DL", invisible_s=5)
        assert p.delivery_attempt == attempt
        assert env.advance(5_000) == 1
    assert env.take(group="DL") == []  # not redelivered after the third attempt
    dlq = dlq_topic("DL", "t")
    (dead,) = env.take(group="inspect", topic=dlq)
    assert dead.message.message_id == mid and dead.message.body == b"m0"
    props = dead.message.properties
    assert props[PROP_DLQ_REASON] == "max attempts (3) reached"
    assert props[PROP_DLQ_ATTEMPTS] == "3" and props[PROP_DLQ_GROUP] == "DL"
    assert props[PROP_ORIGIN_TOPIC] == "t"
    assert env.pop.statistics().dead_lettered == 1
    assert [(s.dead_lettered, s.redelivered) for s in env.pop.group_statistics()
            if (s.group, s.topic) == ("DL", "t")] == [(1, 2)]


def test_a_consumer_can_dead_letter_a_message(env: Env) -> None:
    env.send(1)
    (p,) = env.take()
    assert env.pop.dead_letter_many("G", [(p.receipt_handle, "cannot parse")]) == [None]
    (dead,) = env.take(group="x", topic=dlq_topic("G", "t"))
    assert dead.message.properties[PROP_DLQ_REASON] == "cannot parse"
    env.pop.ack("x", dead.receipt_handle)
    assert env.advance(60_000) == 0 and env.take() == []


def test_retries_and_fresh_messages_are_mixed(env: Env) -> None:
    env.send(40)
    assert len(env.take(n=32, invisible_s=1) + env.take(n=32, invisible_s=1)) == 40  # no acks
    env.advance(1_000)
    assert env.broker.store.topics.get(retry_topic("G", "t")) is not None
    env.send(40, start=100)  # fresh ones arrive behind 40 retries
    got = env.take(n=16)
    attempts = [p.delivery_attempt for p in got]
    assert attempts.count(2) == 8 and attempts.count(1) == 8


def test_leases_in_flight_revive_after_a_restart(env: Env) -> None:
    env.send(4)
    got = env.take(invisible_s=20)
    env.pop.ack("G", got[0].receipt_handle)
    env2 = env.reopen()
    try:
        assert env2.take() == []  # still leased
        stats = [s for s in env2.pop.group_statistics() if s.group == "G"]
        assert stats[0].in_flight == 3
        assert env2.advance(20_000) == 3
        again = env2.take()
        assert {p.message.message_id for p in again} == \
            {p.message.message_id for p in got[1:]}
    finally:
        env.__dict__.update(env2.__dict__)


def test_bad_group_names_and_delays(env: Env) -> None:
    env.send(1)
    for group in ("", "a%b", "a b", "a.b", "x" * 128, "g\n"):
        with pytest.raises(InvalidArgument):
            env.take(group=group)
    (p,) = env.take()
    with pytest.raises(InvalidArgument):
        env.pop.release_many("G", [(p.receipt_handle, -1)])


def test_backoff_schedule_and_parsing() -> None:
    policy = RetryPolicy(backoff_ms=parse_backoff("1s, 5s,1m"), jitter=0.5)
    for attempt, base in ((1, 1000), (2, 5000), (3, 60_000), (9, 60_000)):
        for _ in range(50):
            assert base <= policy.backoff(attempt) < base * 1.5
    assert RetryPolicy(jitter=0).backoff(100) == 7_200_000  # capped at 2 h
    for bad in ("", "1x", "3h", "0s"):
        with pytest.raises(InvalidArgument):
            parse_backoff(bad)
    with pytest.raises(InvalidArgument):
        RetryPolicy(max_attempts=0)
