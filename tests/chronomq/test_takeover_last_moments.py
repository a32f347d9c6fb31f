"""A departed broker's last moments: its timer delivered due messages (a copy under
their topic and the timer stream's record of it, in one CommitLog write), and it died
before both were in the tier.  They go up in different queues, so one may be there
without the other.  Real brokers in one process, a real local-directory tier and
RocksDB, a manual clock.

Seen in the failover chaos run (bench/RESULTS.md): a delayed message due at the moment
its owner was killed came twice, from two queues, 829 ms apart, both attempt 1 (the
copy in the tier, its record not: the successor scheduled it again).  The other half,
the record in the tier without the copy, lost acknowledged messages in a test of this
file before the timer stream's metadata copy waited for the other queues.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import chronomq.broker
from chronomq.broker import Broker
from cluster.timersnapshot import read_pointer
from store.clock import ManualClock
from store.names import TIMER_STREAM
from store.topics import Topic
from tests.chronomq.test_duplicate_durability import Faulty
from tests.chronomq.test_takeover_adoption import _open, _run
from tests.chronomq.test_takeover_adoption import brokers as brokers
from tests.chronomq.test_timer_compaction import _caught_up, _send_delayed, _tick
from tiered.carried import carried, freshest, lease_path, meta_prefix
from tiered.provider import Provider
from tiered.providers.local import LocalProvider

SECOND_MS = 1_000


def _metas(b: Broker, topic: str) -> dict[str, bytes]:
    """The metadata of ``topic``'s queues a mount reads: of each queue's copy in the tier
    and what the lease carries, the newer (``tiered.carried``)."""
    prefix = f"{meta_prefix(b.config.tier.broker_name)}{topic}/"
    lease = {p: m for p, m in carried(b.tier, b.config.tier.broker_name).items()
             if p.startswith(prefix)}
    copies = {p: b.tier.read(p) for p in b.tier.list(prefix)}
    both = {p: freshest(copies.get(p), lease.get(p)) for p in {*lease, *copies}}
    return {p: m for p, m in both.items() if m is not None}


def _put_back(tier: Provider, broker: str, metas: dict[str, bytes]) -> None:
    """What a mount reads of these queues as ``metas`` again: the copies, and the lease
    carrying none of them (a broker lost before its writes of them)."""
    for path, data in metas.items():
        tier.write(path, data)
    lease = json.loads(tier.read(lease_path(broker)))
    lease["meta"] = {k: v for k, v in lease.get("meta", {}).items()
                     if f"{meta_prefix(broker)}{k}" not in metas}
    tier.write(lease_path(broker), json.dumps(lease).encode())


def _with_one_delivered(root: Path, clock: ManualClock, brokers: list[Broker]
                        ) -> tuple[Broker, list[str], int]:
    """A with ten delayed messages due in 5 s, in the tier, and one delivered before (so
    both of its queues have uploads)."""
    a = _open(root, "a", clock, brokers)
    a.create_topic(Topic("t", 2))
    start = clock.now_ms()
    _send_delayed(a, ["early"], start + SECOND_MS)
    ids = [f"d-{i}" for i in range(10)]
    _send_delayed(a, ids, start + 5 * SECOND_MS)
    clock.advance(SECOND_MS)
    _tick(a, clock)
    _caught_up(a)
    return a, ids, start


def _gone(root: Path, a: Broker, brokers: list[Broker]) -> None:
    a.stop()
    brokers.remove(a)
    shutil.rmtree(root / "a")


def _each_once(root: Path, clock: ManualClock, brokers: list[Broker], ids: list[str],
               start: int) -> None:
    """B takes A over; each message comes exactly once, none early."""
    b = _open(root, "b", clock, brokers)
    assert b.takeover("a", force=True).done
    got, when = _run(b, clock, start + 60 * SECOND_MS, step_ms=SECOND_MS)
    assert dict(got) == dict.fromkeys(["early", *ids], 1), got
    assert min(when[i] for i in ids) >= start + 5 * SECOND_MS


def _delivered_and_their_record_lost(root: Path, clock: ManualClock, brokers: list[Broker]
                                     ) -> tuple[list[str], int]:
    """A's ten messages delivered and in the tier, but the timer stream's metadata copy in
    the tier as it was before (A died before that write: it goes last); A gone."""
    a, ids, start = _with_one_delivered(root, clock, brokers)
    before = _metas(a, TIMER_STREAM)
    clock.advance(4 * SECOND_MS)
    _tick(a, clock)
    assert a.timer.statistics().delivered == 11
    _caught_up(a)
    assert _metas(a, TIMER_STREAM) != before
    _gone(root, a, brokers)
    _put_back(a.tier, "a", before)
    return ids, start


def test_a_delivery_whose_record_never_reached_the_tier_is_not_delivered_again(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A's ten messages delivered, their record not in the tier
    ids, start = _delivered_and_their_record_lost(tmp_path, manual_clock, brokers)
    # When B takes A over, then each message comes once: the copies in A's queues
    _each_once(tmp_path, manual_clock, brokers, ids, start)


def test_what_a_successor_found_delivered_stays_delivered_once_its_snapshot_folds_it_in(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A's ten messages delivered, their record not in the tier, and B, taking A
    # over, found their copies in A's queues and did not schedule them
    ids, start = _delivered_and_their_record_lost(tmp_path, manual_clock, brokers)
    b = _open(tmp_path, "b", manual_clock, brokers)
    assert b.compactor is not None
    assert b.takeover("a", force=True).pending == 0
    got, _ = _run(b, manual_clock, start + 60 * SECOND_MS, step_ms=SECOND_MS)
    assert dict(got) == dict.fromkeys(["early", *ids], 1), got

    # When B's timer snapshot folds what it adopted in (A no longer named), and B is lost
    _caught_up(b)
    assert b.compactor.step(force=True)
    pointer = read_pointer(b.tier, "b")
    assert pointer is not None and pointer.folded and pointer.records == 0
    b.stop()
    brokers.remove(b)
    shutil.rmtree(tmp_path / "b")

    # Then C, taking B over, does not schedule them again: B's journal said so
    c = _open(tmp_path, "c", manual_clock, brokers)
    assert c.takeover("b", force=True).pending == 0
    again, _ = _run(c, manual_clock, start + 120 * SECOND_MS, step_ms=SECOND_MS)
    assert not again, again


def test_the_record_of_a_delivery_never_reaches_the_tier_before_the_message(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a tier that refuses every upload of topic t's data, the rest going in
    faulty = Faulty(LocalProvider(str(tmp_path / "tier")))
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: faulty)
    a, ids, start = _with_one_delivered(tmp_path, manual_clock, brokers)
    before = _metas(a, TIMER_STREAM)
    faulty.refuse = "a/data/t/"

    # When A's timer delivers the ten (their copies cannot reach the tier, the timer
    # stream's record can) and A dies
    tiered = a.tiered
    assert tiered is not None
    timer_stream = tiered.queue(TIMER_STREAM, 0)
    assert timer_stream is not None
    committed = timer_stream.committed_queue_offset
    manual_clock.advance(4 * SECOND_MS)
    _tick(a, manual_clock)
    assert a.timer.statistics().delivered == 11
    deadline = time.monotonic() + 20  # the tier's own thread commits, and fails, t's
    while time.monotonic() < deadline and (tiered.statistics().failed_uploads < 2
                                           or timer_stream.committed_queue_offset
                                           == committed):
        time.sleep(0.01)
    assert tiered.statistics().failed_uploads >= 2
    assert timer_stream.committed_queue_offset > committed  # the record went up
    # Then the timer stream's copy in the tier still ends before the record
    assert _metas(a, TIMER_STREAM) == before
    _gone(tmp_path, a, brokers)
    faulty.refuse = ""

    # and B, taking A over, delivers each message once
    _each_once(tmp_path, manual_clock, brokers, ids, start)
