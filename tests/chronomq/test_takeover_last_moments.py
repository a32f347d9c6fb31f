"""A departed broker's last moments: its timer delivered due messages (a copy under
their topic and the timer stream's record of it, in one CommitLog write), but only one
of the two reached the tier before it died (they go up in different queues, committed
apart).  Real brokers in one process, a real local-directory tier and RocksDB, a manual
clock; the tier is left as the death left it by putting back a queue's metadata copy
as it was before the delivery (what the successor reads: the upload after it was never
committed).

Seen in the failover chaos run (bench/RESULTS.md): a delayed message due at the moment
its owner was killed came twice, from two queues, 829 ms apart, both attempt 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chronomq.broker import Broker
from store.clock import ManualClock
from store.names import TIMER_STREAM
from store.topics import Topic
from tests.chronomq.test_takeover_adoption import _open, _run
from tests.chronomq.test_takeover_adoption import brokers as brokers
from tests.chronomq.test_timer_compaction import _caught_up, _send_delayed, _tick

SECOND_MS = 1_000


def _metas(b: Broker, topic: str) -> dict[str, bytes]:
    """The tier's metadata copies of ``topic``'s queues (what a mount reads)."""
    name = b.config.tier.broker_name
    return {p: b.tier.read(p) for p in b.tier.list(f"{name}/meta/{topic}/")}


@pytest.mark.parametrize("lost_upload", ["timer-record", "copies"])
def test_a_due_message_whose_delivery_half_reached_the_tier_comes_exactly_once(
        lost_upload: str, tmp_path: Path, manual_clock: ManualClock,
        brokers: list[Broker]) -> None:
    # Given A with ten delayed messages due in 5 s, in the tier (and one delivered
    # before, so both of its queues have uploads)
    a = _open(tmp_path, "a", manual_clock, brokers)
    a.create_topic(Topic("t", 2))
    start = manual_clock.now_ms()
    _send_delayed(a, ["early"], start + SECOND_MS)
    ids = [f"d-{i}" for i in range(10)]
    _send_delayed(a, ids, start + 5 * SECOND_MS)
    manual_clock.advance(SECOND_MS)
    _tick(a, manual_clock)
    _caught_up(a)
    lost = TIMER_STREAM if lost_upload == "timer-record" else "t"
    before = _metas(a, lost)
    assert before

    # When A's timer delivers them (copies and the timer stream's record in one write),
    # the tier gets all of it, and then A dies with one of the two uploads not committed
    manual_clock.advance(4 * SECOND_MS)
    _tick(a, manual_clock)
    assert a.timer.statistics().delivered == 11
    _caught_up(a)
    assert _metas(a, lost) != before  # the upload that is taken back below
    a.stop()
    brokers.remove(a)
    shutil.rmtree(tmp_path / "a")
    for path, data in before.items():
        a.tier.write(path, data)

    # And B takes A over
    b = _open(tmp_path, "b", manual_clock, brokers)
    result = b.takeover("a", force=True)
    assert result.done

    # Then each message comes exactly once: the copy in the tier decides (served from
    # A's queue when it is there, delivered by B when only the record of it is)
    got, when = _run(b, manual_clock, start + 60 * SECOND_MS, step_ms=SECOND_MS)
    assert dict(got) == dict.fromkeys(["early", *ids], 1), got
    assert min(when[i] for i in ids) >= start + 5 * SECOND_MS
