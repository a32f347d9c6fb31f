"""What an OK answer of the POP layer promises survives a restart: acks are final and
leases are kept (real store, real RocksDB, manual clock)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient
from pop.service import TagFilter
from store.clock import ManualClock
from store.crashpoint import CRASH_EXIT_CODE
from store.topics import Topic
from testkit.process import ServerProcess
from tests.pop.test_pop_service import Env


def _env(tmp_path: Path, clock: ManualClock) -> Env:
    e = Env(tmp_path, clock)
    e.store.create_topic(Topic("t", 1))
    return e


def test_acks_of_a_later_lease_survive_a_restart_while_an_earlier_one_is_open(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    env = _env(tmp_path, manual_clock)
    # Given: two leases on one queue; the second one fully acked, the first still open
    env.send(6)
    first = env.pop.pop("t", "G", 3, 60)
    second = env.pop.pop("t", "G", 3, 60)
    assert len(first) == len(second) == 3
    assert env.pop.ack_many("G", [p.receipt_handle for p in second]) == [None] * 3
    # When: the broker restarts
    env = env.reopen()
    try:
        # Then: the acked messages never come back, and the open lease is kept
        assert env.pop.pop("t", "G", 32, 60) == []
        env.clock.advance(61_000)
        assert env.pop.revive_due() == 3
        again = env.pop.pop("t", "G", 32, 60)
        assert {p.message.message_id for p in again} == \
            {p.message.message_id for p in first}
        assert all(p.delivery_attempt == 2 for p in again)
    finally:
        env.close()


def test_messages_a_tag_filter_skipped_stay_done_after_a_restart(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    env = _env(tmp_path, manual_clock)
    # Given: an open lease, then a Pop whose tag filter skips three messages
    env.send(1, tag="a")
    open_lease = env.pop.pop("t", "G", 1, 60)
    env.send(3, tag="b")
    assert env.pop.pop("t", "G", 32, 60, tag_filter=TagFilter.parse("a")) == []
    # When: the broker restarts
    env = env.reopen()
    try:
        # Then: the skipped messages are done for the group, the lease is still held
        assert len(open_lease) == 1
        assert env.pop.pop("t", "G", 32, 60) == []
    finally:
        env.close()


def test_acks_and_leases_are_group_committed(tmp_path: Path,
                                             manual_clock: ManualClock) -> None:
    env = _env(tmp_path, manual_clock)
    try:
        env.send(40)
        got = env.pop.pop("t", "G", 32, 60)
        syncs = env.pop.statistics().durable_syncs
        assert syncs >= 1  # the Pop waited for its leases to be durable
        assert env.pop.ack_many("G", [p.receipt_handle for p in got]) == [None] * 32
        assert env.pop.statistics().durable_syncs == syncs + 1  # 32 acks, one fsync
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("label", ["pop.after_copy_append", "pop.after_mark_done"])
def test_a_crash_around_revive_redelivers_each_message_once(tmp_path: Path, label: str) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data, f"server.crash_at={label}:1")
    with ChronomqClient(srv.target) as c:
        c.create_topic("t", queue_count=1)
        ids = {c.send_one("t", f"m{i}".encode()) for i in range(5)}
        # Given: five messages leased for 1 s and never acked
        got = c.pop("t", "g", max_messages=32, invisible_time_s=1, wait_ms=0)
        assert {m.message_id for m in got} == ids
    # When: the revive of those leases crashes the broker at the crash point
    assert srv.wait_exit() == CRASH_EXIT_CODE
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            # Then: each message comes back exactly once more (attempt 2) ...
            again: list[tuple[str, int]] = []
            deadline = time.monotonic() + 15
            while len(again) < len(ids) and time.monotonic() < deadline:
                got = c.pop("t", "g", max_messages=32, invisible_time_s=60, wait_ms=500)
                again += [(m.message_id, m.delivery_attempt) for m in got]
                if got:
                    c.ack("g", [m.receipt_handle for m in got])
            # ... and, once acked, never again
            later = c.pop("t", "g", max_messages=32, invisible_time_s=60, wait_ms=2500)
        assert sorted(again) == sorted((i, 2) for i in ids)
        assert later == []
    finally:
        assert srv.terminate() == 0


def test_a_damaged_record_is_skipped_and_never_blocks_its_queue(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    env = _env(tmp_path, manual_clock)
    try:
        sent = env.send(5)
        # Given: one byte of the third message's body flipped on disk
        bad = sent[2]
        segment = tmp_path / "data" / "commitlog" / f"{0:020d}.log"
        with open(segment, "r+b") as f:
            at = bad.commit_offset + bad.record_size - 1
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
        # When: a group pops the queue
        got = env.pop.pop("t", "G", 32, 60)
        # Then: every other message is delivered, the damaged one is skipped and counted
        assert [p.message.message_id for p in got] == \
            [m.message_id for i, m in enumerate(sent) if i != 2]
        assert env.store.statistics().damaged_records == 1
        assert env.pop.ack_many("G", [p.receipt_handle for p in got]) == [None] * 4
        assert env.pop.pop("t", "G", 32, 60) == []
    finally:
        env.close()
