"""A takeover's look for the copies a departed broker delivered (``cluster.delivered``)
begins when the broker is mounted, on a thread of its own (``Prefetch``), not at the
timer step: in the failover chaos that look took 0.1-1.6 s of a takeover's timer step,
waited for after the journal's replay and the positions.  What it read ahead answers the
timer step's questions without reading again.  Real brokers in one process, a real
local-directory tier, a manual clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from chronomq.broker import Broker
from cluster.delivered import PREFETCH_MS, SLACK_MS, DeliveredCopies, Prefetch
from store.clock import ManualClock
from tests.chronomq.test_takeover_adoption import _open
from tests.chronomq.test_takeover_adoption import brokers as brokers
from tests.chronomq.test_takeover_last_moments import (
    _delivered_and_their_record_lost,
    _each_once,
)
from tiered.errors import TierUnavailable
from tiered.mount import MountedBroker
from tiered.provider import Provider


class _Blockable:
    """A real provider whose reads of queue data fail once ``blocked``."""

    def __init__(self, inner: Provider) -> None:
        self.inner, self.name, self.blocked = inner, "blockable", False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if self.blocked and "/data/" in path:
            raise TierUnavailable(f"{path}: blocked (injected)")
        return self.inner.read(path, offset, length)


def test_the_copies_read_ahead_answer_without_another_read(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A's ten messages delivered into topic t (their record not in the tier), A gone
    ids, start = _delivered_and_their_record_lost(tmp_path, manual_clock, brokers)
    b = _open(tmp_path, "b", manual_clock, brokers)
    tier = _Blockable(b.tier)
    mounted = MountedBroker(tier, "a", str(tmp_path / "mount"),  # type: ignore[arg-type]
                            empty=True)
    # When the copies are read ahead, and then the tier's queue data cannot be read
    copies = Prefetch(mounted).get()
    tier.blocked = True
    # Then every delivered message is found, within the window read ahead, without a read
    assert isinstance(copies, DeliveredCopies)
    due = start + 5_000
    assert due - SLACK_MS >= copies.delivered_until_ms - SLACK_MS - PREFETCH_MS
    assert all(copies.has("t", i.encode(), due) for i in ids)
    assert not copies.has("t", b"never-sent", due)
    assert not copies.has("t", ids[0].encode(), due + 1)  # another due time: not it
    # (the window began before the queues' first record: an earlier due time reads
    # nothing more either)
    assert not copies.has("t", ids[0].encode(), start - 10 * PREFETCH_MS)


def test_a_takeover_takes_the_copies_it_read_ahead(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker],
        caplog: pytest.LogCaptureFixture) -> None:
    # Given A's ten messages delivered, their record not in the tier, A gone
    ids, start = _delivered_and_their_record_lost(tmp_path, manual_clock, brokers)
    # When B takes A over, each message comes once, from the copies read ahead
    with caplog.at_level(logging.INFO, "cluster.adoption"):
        _each_once(tmp_path, manual_clock, brokers, ids, start)
    assert "the delivered copies of a read ahead" in caplog.text
