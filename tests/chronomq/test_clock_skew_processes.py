"""One broker's wall clock 30 s ahead, from outside (issue 51, 4 and 5): two broker
processes on SeaweedFS's S3 with ``tier.durable_ack``, one of them under Debian's
libfaketime (``ServerProcess(clock_ahead_s=30)``), a client over gRPC.

Broker A: a consumer group leases 8 messages for 40 s; delayed messages were delivered
and acked; others wait 10 h (in A's TimerFlatFiles).  kill -9 A; B takes it over at
once.  Whichever of the two runs ahead:

- no lease ends early: for 36 s after the Pop (measured here, on the test's monotonic
  clock) none of the 8 is given again, and acks with the handles A gave succeed at B
  15 s in (B 30 s ahead ended them 10 s after the Pop: revived, acks refused as
  expired); the 4 not acked come back later, once;
- no delivered message is delivered again;
- the far-future messages B adopted answer QueryMessages by id (they answered nothing).

The unit-level logic, on two manual clocks: ``test_takeover_clocks.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, message
from testkit.process import LIBFAKETIME, ServerProcess, wait_tier_caught_up
from testkit.wait import wait_until
from tests.tiered.test_mount import _tier

AHEAD_S = 30
INVISIBLE_S = 40
HOUR_MS = 3_600_000

# the bucket is set up first, so it is deleted after the broker processes are gone
pytestmark = [pytest.mark.usefixtures("seaweed_bucket", "no_process_left"),
              pytest.mark.skipif(not LIBFAKETIME, reason="libfaketime is missing "
                                 "(apt-get install faketime; scripts/test installs it)")]


def _settings(endpoint: str, bucket: str, name: str) -> list[str]:
    return [*_tier(endpoint, bucket, name), "tier.upload=true", "tier.durable_ack=true",
            "timer.flat_batch_ms=100"]


def _drain(c: ChronomqClient, topic: str, group: str, quiet: int = 2) -> list[str]:
    """Pop and ack until ``quiet`` empty answers in a row: the ids, in order."""
    got: list[str] = []
    empty = 0
    while empty < quiet:
        batch = c.pop(topic, group, 32, 60, 200)
        empty = empty + 1 if not batch else 0
        got += [m.message_id for m in batch]
        if batch:
            assert c.ack(group, [m.receipt_handle for m in batch]) == [""] * len(batch)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("ahead", ["successor", "departed"])
def test_a_clock_30s_ahead_ends_no_lease_early_and_delivers_nothing_twice(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str, ahead: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a"),
                      clock_ahead_s=AHEAD_S if ahead == "departed" else 0)
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b"),
                      clock_ahead_s=AHEAD_S if ahead == "successor" else 0)
    with ChronomqClient(a.target) as c:
        # Given A: 20 messages, 5 delayed ones delivered and acked, 3 due in 10 h
        c.create_topic("t", queue_count=2)
        c.create_topic("late", queue_count=1)
        sent = [o.message_id for o in c.send([message("t", f"m{i}".encode())
                                              for i in range(20)])]
        soon = [o.message_id for o in c.send([message("late", f"d{i}".encode(), delay_ms=500)
                                              for i in range(5)])]
        far = [o.message_id for o in c.send([message("late", f"f{i}".encode(),
                                                     delay_ms=10 * HOUR_MS)
                                             for i in range(3)])]
        delivered: list[str] = []
        wait_until(lambda: bool(delivered.extend(_drain(c, "late", "d", 1)))
                   or sorted(delivered) == sorted(soon), 30, "A to deliver the delayed ones")
        # and a group leasing 8 for 40 s
        leased = c.pop("t", "g", 8, INVISIBLE_S, 1000)
        popped_at = time.monotonic()
        assert len(leased) == 8
        wait_tier_caught_up(c)

    # When A is lost and B takes it over at once
    a.kill9()
    with ChronomqClient(b.target) as c:
        assert c.takeover("broker-a", force=True).pending == len(far)

        # Then the far-future messages B adopted are found by id
        for mid in far:
            assert [m.message_id for m in c.query(message_id=mid)] == [mid]
        # and 15 s after the Pop, acks with A's handles succeed at B
        time.sleep(max(0.0, popped_at + 15 - time.monotonic()))
        acked = [m.message_id for m in leased[:4]]
        assert c.ack("g", [m.receipt_handle for m in leased[:4]]) == [""] * 4
        # and until 36 s after the Pop none of the 8 comes again
        got: list[str] = []
        while time.monotonic() < popped_at + INVISIBLE_S - 4:
            got += _drain(c, "t", "g", 1)
            time.sleep(0.5)
        early = [m for m in got if m in {x.message_id for x in leased}]
        assert not early, f"leases ended early at B: {early}"
        assert sorted(got) == sorted(set(sent) - {x.message_id for x in leased})

        # and the 4 not acked come back once their time is over, once; the acked never
        back: list[str] = []
        wait_until(lambda: bool(back.extend(_drain(c, "t", "g", 1))) or len(back) >= 4,
                   60 + AHEAD_S, "the unacked leases to come back")
        back += _drain(c, "t", "g", 3)
        assert sorted(back) == sorted(m.message_id for m in leased[4:])
        assert not set(back) & set(acked)
        # and no delayed message A delivered comes again
        assert _drain(c, "late", "d", 3) == []
