"""A takeover's reads begun before its claim (``cluster.warmup``): the broker first in
line warms up when a lease is unchanged for half a lease; after the claim the takeover's
journal and delayed-stream reads are answered from it where the tier lists the object
unchanged, and read from the tier where it changed or was written after.  In the
failover chaos those reads were 0.3-1.5 s of every takeover, after the claim.  Real
brokers in one process, a real local-directory tier, a manual clock."""

from __future__ import annotations

import contextlib
import itertools
import threading
from pathlib import Path

from chronomq.broker import Broker
from cluster.layout import lease_path
from cluster.lease import claim
from cluster.leasewatch import LeaseWatch
from cluster.replay import replay
from cluster.warmup import WarmReads, Warmups, warm_up
from store.clock import ManualClock
from store.journal import JournalState
from store.names import STATE_STREAM
from store.topics import Topic
from tests.chronomq.test_bucket_fence import _broker, _send
from tests.cluster.test_lease import LEASE_S, _three
from tiered.carried import meta_prefix
from tiered.mount import MountedBroker
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.recentids import path_of


class _Counting:
    """A real provider, counting the reads of one broker's data (its queues, streams)."""

    def __init__(self, inner: Provider, broker: str) -> None:
        self.inner, self.name = inner, inner.name
        self._streams = f"{broker}/data/"
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if path.startswith(self._streams):
            self.reads += 1
        return self.inner.read(path, offset, length)


def _work(b: Broker, first: int, n: int) -> None:
    """``n`` sends, each popped and acked (durable-ack: a commit, small objects, each)."""
    for i in range(first, first + n):
        _send(b, f"m{i}")
        for m in b.pop.pop("t", "g", 4, 30):
            b.pop.ack("g", m.receipt_handle)


def _departed(root: Path, clock: ManualClock, sends: int) -> LocalProvider:
    """Broker a, ``sends`` sent, popped and acked, then stopped: its tier."""
    a = _broker(root, "a", clock)
    try:
        a.create_topic(Topic("t", 2))
        _work(a, 0, sends)
    finally:
        a.stop()
    return LocalProvider(str(root / "tier"))


def _same(x: JournalState, y: JournalState) -> None:
    assert (x.records, x.pop, x.done, x.moved, x.bad) == (y.records, y.pop, y.done,
                                                           y.moved, y.bad)


def test_a_takeover_after_a_warm_up_reads_only_what_came_after_it(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a broker whose journal is many one-commit objects, warmed up for a takeover
    a = _broker(tmp_path, "a", manual_clock)
    b = None
    try:
        a.create_topic(Topic("t", 2))
        _work(a, 0, 30)
        b = _broker(tmp_path, "b", manual_clock)
        counting = _Counting(b.tier, "a")
        b.tier = counting  # type: ignore[assignment]  # (what the takeover reads through)
        b.takeovers.warmups.begin("a")
        # ... and a goes on a little before it is lost (what the warm-up cannot have read)
        _work(a, 30, 5)
        a.stop()
        assert b.takeovers.warmups.ended("a", 30)
        reads_before_claim = counting.reads
        assert reads_before_claim > 30  # the journal's objects, one each at least

        # When b takes a over
        result = b.takeover("a", force=True)

        # Then the takeover read again only what the warm-up had not: the last commits
        # (its journal, the pending messages, the delivered copies, the recent ids)
        b.takeovers.ids.warm(manual_clock.now_ms())  # (the resends' index: built)
        after = counting.reads - reads_before_claim
        assert result.done
        assert 0 < after <= 60, after  # (126 without the warm-up)
        # and what it replayed is what a plain read of the tier gives
        tier = counting.inner
        plain = replay(tier, MountedBroker(tier, "a", str(tmp_path / "m"), empty=True))
        assert plain.records > 30
        warm = WarmReads(tier, "a")
        warm_up(warm, str(tmp_path / "w"))
        warm.serve()
        _same(replay(warm, MountedBroker(warm, "a", str(tmp_path / "m2"), empty=True)),
              plain)
        assert warm.served > 0 and warm.missed == 0
        # and the acked messages are not delivered again by b
        assert b.pop.pop("t", "g", 32, 30) == []
    finally:
        for x in (a, b):
            if x is not None:
                with contextlib.suppress(Exception):  # stopped already
                    x.stop()


def test_an_object_changed_after_the_warm_up_is_read_from_the_tier(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a warm-up of a broker's journal
    tier = _departed(tmp_path, manual_clock, 10)
    warm = WarmReads(tier, "a")
    warm_up(warm, str(tmp_path / "w"))
    assert not tier.exists(path_of("a"))  # its recent ids read, and nothing written
    objects = sorted(p for p in tier.list(f"a/data/{STATE_STREAM}/") if "/log/" in p)
    assert len(objects) >= 10
    changed, kept = objects[-2], objects[-3]
    # When one of its objects is written again with other bytes before the claim
    new = bytes(b ^ 0xFF for b in tier.read(changed))
    tier.write(changed, new)
    warm.serve()
    # Then a read of it gives the tier's bytes now; an unchanged one comes from the warm-up
    served = warm.served
    assert warm.read(changed, 0, len(new)) == new
    assert warm.served == served and warm.missed == 1
    assert warm.read(kept, 0, 8) == tier.read(kept, 0, 8)
    assert warm.served == served + 1
    # and once closed, nothing is answered from it
    warm.close()
    assert warm.read(kept, 0, 8) == tier.read(kept, 0, 8)
    assert warm.served == served + 1


def test_the_first_in_line_warms_up_at_half_a_lease_once_per_version(
        tmp_path: Path) -> None:
    # Given a, b (least loaded) and c holding leases, b and c watching
    tier, clock, (a, b, c) = _three(tmp_path)
    suspected: dict[str, list[str]] = {"b": [], "c": []}
    watches = [LeaseWatch(tier, x, lambda _: None, suspected[x.broker].append)
               for x in (b, c)]

    def look(seconds: float) -> None:
        end = clock.t + seconds
        while clock.t < end:
            clock.t += 0.5
            b.renew()
            c.renew()
            for w in watches:
                w.step()
    look(0.5)  # first sight of a's version
    # When a writes its lease no more: nothing before half a lease
    look(LEASE_S / 2 - 1)
    assert suspected == {"b": [], "c": []}
    # Then at half a lease the first in line (b) suspects a, once; c never does
    look(1.5)
    assert suspected == {"b": ["a"], "c": []}
    look(LEASE_S / 4)
    assert suspected == {"b": ["a"], "c": []}
    # and a's lease written again, then unchanged again: b suspects it again
    assert a.renew()
    look(LEASE_S / 2 + 1)
    assert suspected == {"b": ["a", "a"], "c": []}


def test_a_takeover_without_a_finished_warm_up_reads_everything_itself(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a warm-up that cannot finish (its tier blocks), and one never begun
    _departed(tmp_path, manual_clock, 5)
    gate = threading.Event()

    class _Stuck(LocalProvider):
        def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
            gate.wait(30)
            raise OSError("stuck (injected)")

    warmups = Warmups(lambda: _Stuck(str(tmp_path / "tier")), str(tmp_path / "warm"))
    warmups.begin("a")
    # When the takeover takes them
    try:
        # Then it gets none: it reads the tier itself
        assert warmups.take("a") is None
        assert warmups.take("never-begun") is None
    finally:
        gate.set()


def test_a_warm_up_cut_short_serves_what_it_read(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a warm-up that fails after six objects of the journal
    tier = _departed(tmp_path, manual_clock, 10)

    reads, back = itertools.count(), threading.Event()

    class _CutShort(LocalProvider):
        def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
            if not back.is_set() and f"{STATE_STREAM}/" in path and "/log/" in path \
                    and next(reads) >= 6:
                raise RuntimeError(f"{path}: cut off (injected)")
            return super().read(path, offset, length)

    warmups = Warmups(lambda: _CutShort(str(tmp_path / "tier")), str(tmp_path / "warm"))
    warmups.begin("a")
    assert warmups.ended("a", 30)
    # When the takeover takes it (the tier back)
    warm = warmups.take("a")
    back.set()
    # Then what it read of the journal answers the takeover's replay, the rest is read
    assert warm is not None
    mounted = MountedBroker(warm, "a", str(tmp_path / "m"), empty=True)
    _same(replay(warm, mounted), replay(tier, MountedBroker(tier, "a", str(tmp_path / "p"),
                                                             empty=True)))
    assert warm.served > 0 and warm.missed > 0


def test_a_takeover_ends_a_warm_up_still_reading_and_uses_what_it_read(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a warm-up held up after six objects of the journal (a slow tier)
    tier = _departed(tmp_path, manual_clock, 10)
    reads, held, gate = itertools.count(), threading.Event(), threading.Event()

    class _Slow(LocalProvider):
        def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
            if f"{STATE_STREAM}/" in path and "/log/" in path and next(reads) >= 6:
                held.set()
                gate.wait(30)
            return super().read(path, offset, length)

    warmups = Warmups(lambda: _Slow(str(tmp_path / "tier")), str(tmp_path / "warm"))
    warmups.begin("a")
    assert held.wait(30)
    # When the takeover comes meanwhile
    warm = warmups.take("a")
    # Then it did not wait for the warm-up, which ends at its next read
    assert warm is not None and not warmups.ended("a", 0)
    gate.set()
    assert warmups.ended("a", 30)
    # and what it had read answers the takeover's replay, the rest is read
    mounted = MountedBroker(warm, "a", str(tmp_path / "m"), empty=True)
    _same(replay(warm, mounted), replay(tier, MountedBroker(tier, "a", str(tmp_path / "p"),
                                                             empty=True)))
    assert warm.served > 0 and warm.missed > 0


class _ClaimWatch(_Counting):
    """``_Counting``, noting how many of the data reads came before the claim (the
    first conditional write of ``broker``'s lease by another)."""

    def __init__(self, inner: Provider, broker: str) -> None:
        super().__init__(inner, broker)
        self._lease = lease_path(broker)
        self.before_claim: int | None = None

    def swap(self, path: str, data: bytes, version: str | None) -> str | None:
        if path == self._lease and self.before_claim is None:
            self.before_claim = self.reads
        return self.inner.swap(path, data, version)


def test_a_forced_claim_reads_none_of_the_departed_brokers_streams_before_it(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a departed broker with a journal in the tier (one read of its streams' last
    # records would tell how long ago it wrote: what an unforced claim checks)
    tier = _departed(tmp_path, manual_clock, 5)
    b = _broker(tmp_path, "b", manual_clock)
    try:
        watch = _ClaimWatch(tier, "a")
        b.tier = watch  # type: ignore[assignment]  # (what the takeover reads through)
        # When b takes it over with force (the lease watch's way)
        result = b.takeover("a", force=True)
        # Then nothing of its streams was read before the claim (the claim comes sooner)
        assert result.done
        assert watch.before_claim == 0, watch.before_claim
        assert watch.reads > 0  # (after it: its journal)
    finally:
        b.stop()


class _Listings(_Counting):
    """``_Counting``, counting the listings of ``broker``'s queue metadata (one per
    mount of it) too."""

    def __init__(self, inner: Provider, broker: str) -> None:
        super().__init__(inner, broker)
        self._meta = meta_prefix(broker)
        self.meta_listings = 0

    def list(self, prefix: str = "") -> list[str]:
        if prefix == self._meta:
            self.meta_listings += 1
        return self.inner.list(prefix)


def test_a_takeover_of_a_lease_the_watch_claimed_mounts_the_departed_broker_once(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    # Given a departed broker whose lease the lease watch of b has claimed (the claim
    # comes first on that path: every look of the takeover is after it)
    tier = _departed(tmp_path, manual_clock, 5)
    b = _broker(tmp_path, "b", manual_clock)
    try:
        assert claim(tier, "a", "b", manual_clock.now_ms()) == "b"
        listings = _Listings(tier, "a")
        b.tier = listings  # type: ignore[assignment]  # (what the takeover reads through)
        # When b takes it over
        result = b.takeover("a", force=True)
        # Then it mounted a once, after the claim (before: once to look, once again);
        # the other listing is the look for any queue at all
        assert result.done and result.topics == ["t"]
        assert listings.meta_listings == 2, listings.meta_listings
    finally:
        b.stop()
