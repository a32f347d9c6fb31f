"""What the POP service keeps in memory stays bounded by what is open, not by how many
messages went through (issue 16): real store, RocksDB and timer, manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.memtrace import rocksdb_figures
from pop.checkpoint import WRITE_BUFFER_BYTES
from store.clock import ManualClock
from store.topics import Topic
from tests.pop.test_revive import Env

TWELVE_HOURS_S = 12 * 3600


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock)
    e.broker.create_topic(Topic("t", 4))
    yield e
    e.close()


def test_acked_leases_leave_the_revive_wheel_before_their_deadline(env: Env) -> None:
    # Given 1,000 messages popped 32 at a time with a 12-hour invisible time
    env.send(1000)
    pops = 0
    while got := env.take(n=32, invisible_s=TWELVE_HOURS_S):
        pops += 1
        # Then while a lease is open its deadline waits on the wheel
        assert env.pop.pending_deadlines >= 1
        # When the consumer acks every message of it at once
        assert env.pop.ack_many("G", [p.receipt_handle for p in got]) == [None] * len(got)
        # Then the wheel holds nothing for it, hours before its deadline
        assert env.pop.pending_deadlines == 0
    assert pops >= 1000 // 32


def test_open_leases_keep_their_deadlines_and_still_revive(env: Env) -> None:
    # Given 200 messages popped and left open
    env.send(200)
    leases = []
    while got := env.take(n=32, invisible_s=60):
        leases.append(got)
    open_leases = env.pop.statistics().open_checkpoints  # a Pop may lease several queues
    assert env.pop.pending_deadlines == open_leases
    # When one Pop's leases are acked, and another's after an entry's deadline moved
    env.pop.ack_many("G", [p.receipt_handle for p in leases[0]])
    first, *rest = leases[1]
    moved = env.pop.change_invisible_time("G", first.receipt_handle, 600)
    env.pop.ack_many("G", [moved] + [p.receipt_handle for p in rest])
    # Then only the other leases' deadlines wait, and they revive on time
    assert env.pop.pending_deadlines == env.pop.statistics().open_checkpoints < open_leases
    assert env.advance(60_000) == 200 - len(leases[0]) - len(leases[1])
    assert env.pop.pending_deadlines == 0


def test_pop_rocksdb_memtables_stay_within_two_write_buffers(env: Env) -> None:
    # Given 24 MB of checkpoint-sized writes to the broker's POP RocksDB
    kv = env.broker.databases()["pop"]
    most = 0
    for batch in range(120):
        kv.write([(b"c-test-%d-%d" % (batch, i), bytes(100)) for i in range(2000)])
        most = max(most, rocksdb_figures({"pop": kv})["pop"]["memtables"])
    # Then RocksDB held at most two write buffers of them in memory
    assert most <= 2 * WRITE_BUFFER_BYTES + (1 << 20)
