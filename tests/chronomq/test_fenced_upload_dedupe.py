"""A resend is a duplicate at a successor only when a broker serves its message (finding 7
of issue 51), on real brokers in one process, a real local-directory tier (durable-ack),
RocksDB, a manual clock.

Broker A's commit is still on its way when B claims A's lease: its objects are plain
PUTs, so they land in the tier after the claim, and the lease write that would confirm
them fails (A answers no OK, and is fenced).  B read A's metadata before: the ends B took
leave that message out, and B's own messages take its queue offset.  No broker serves
it, so a resend of its id must be stored, not answered ``duplicate``.  Before the commit
record (``tiered.carried``) the commit's queue metadata copy landed too, so a later
mount of A (B restarted) saw the message, and B had to cut its mounts at the ends it
took; now the metadata rides only in the refused lease write and a copy goes in only
after a record confirmed it, so no mount of A sees the message at all.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from store.clock import ManualClock
from store.errors import FailedPrecondition
from store.message import Draft
from store.names import DELAYED_STREAM
from store.store import StoreConfig
from store.topics import Topic
from testkit.wait import wait_until
from tests.conftest import run_timer
from tiered.config import TierConfig
from tiered.mount import MountedBroker
from tiered.providers.local import LocalProvider

HOUR_MS = 3_600_000


def _broker(root: Path, name: str, clock: ManualClock, upload_thread: bool = True) -> Broker:
    tier = TierConfig(provider="local", local_dir=str(root / "tier"), broker_name=name,
                      upload=True, durable_ack=True, durable_ack_ms=1, upload_timeout_s=5)
    b = Broker(BrokerConfig(store=StoreConfig(str(root / name)), tier=tier), clock)
    b.open()
    b.start(timer_thread=False)
    assert b.tiered is not None
    if upload_thread:
        b.tiered.start()
    return b


def _draft(mid: str, now_ms: int, due_ms: int = 0, flags: int = 0) -> Draft:
    return Draft(mid, "t", "", "", mid.encode(), b"", now_ms, due_ms or now_ms, flags, 0)


def _delayed(b: Broker, mid: str, now_ms: int) -> Draft:
    """``mid`` due an hour from now: it waits in the delayed stream (and the timer)."""
    due, flags = b.sender.resolve_deliver_at(now_ms + HOUR_MS, 0, now_ms)
    return _draft(mid, now_ms, due, flags)


def _committed_at_a(root: Path, topic: str) -> int:
    """Where A's queue ``topic``/0 ends in the tier, as a fresh mount reads it (0: it
    has none)."""
    bounds = MountedBroker(LocalProvider(str(root / "tier")), "a",
                           str(root / "probe")).bounds(topic, 0)
    return 0 if bounds is None else bounds[1]


def _pop_ids(b: Broker) -> list[str]:
    """Pop and ack everything group g can have of t (the mount's part, then B's own)."""
    ids: list[str] = []
    while got := b.pop.pop("t", "g", 32, 60):
        b.pop.ack_many("g", [p.receipt_handle for p in got])
        ids += (p.message.message_id for p in got)
    return sorted(ids)


@pytest.mark.parametrize("delayed", [False, True])
def test_a_resend_of_a_message_uploaded_after_the_claim_is_stored_again(
        tmp_path: Path, manual_clock: ManualClock, delayed: bool) -> None:
    # Given A, its dispatcher driven by hand: m0 confirmed in the tier, x stored locally
    a = _broker(tmp_path, "a", manual_clock, upload_thread=False)
    assert a.tiered is not None
    a.create_topic(Topic("t", 1))
    now = manual_clock.now_ms()
    first = a.sender.submit([_draft("m0", now)], now)
    with ThreadPoolExecutor(1) as waiter:
        stored = waiter.submit(a.sender.stored, first)
        while not stored.done():  # what A's upload thread would do
            a.tiered.step()
            a.tiered.commit()
            time.sleep(0.01)
        stored.result()
    x = _delayed(a, "x", now) if delayed else _draft("x", now)
    pending = a.sender.submit([x], now)
    b = _broker(tmp_path, "b", manual_clock)
    try:
        # When B takes A over, and only then A's commit of x lands in the tier (its
        # lease write fails: A is fenced and answers no OK for x)
        assert b.takeover("a", force=True).done
        assert a.store.dispatcher is not None
        assert a.store.dispatcher.wait_dispatched(a.store.commitlog.confirmed_offset, 10)
        a.tiered.step()
        a.tiered.commit()
        wait_until(lambda: a.tiered is not None and a.tiered.fenced, 10, "A fenced")
        with pytest.raises(FailedPrecondition):
            a.sender.stored(pending)
        stream = DELAYED_STREAM if delayed else "t"
        assert _committed_at_a(tmp_path, stream) == (not delayed), \
            "x's upload is in what a mount of A reads: a commit no record confirmed"
        # and B starts again (it mounts A's tier anew)
        b.stop()
        b = _broker(tmp_path, "b", manual_clock)
        # Then a resend of x is stored at B and served, not answered duplicate
        now = manual_clock.now_ms()
        again = b.sender.submit([_delayed(b, "x", now) if delayed else _draft("x", now)], now)
        assert again.duplicate == [False], "x answered duplicate: no broker serves it"
        b.sender.stored(again)
        if delayed:  # it comes at its time
            manual_clock.advance(HOUR_MS)
            run_timer(b, manual_clock.now_ms())
        assert _pop_ids(b) == ["m0", "x"]
        # while a resend of m0 (below the ends B took) is still a duplicate
        repeat = b.sender.submit([_draft("m0", now)], now)
        assert repeat.duplicate == [True]
    finally:
        b.stop()
        a.stop()
