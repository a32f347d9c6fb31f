"""MountIndex reads the queues' unsealed tails at once: the same index as one read queue
after queue, its reads overlapping, bounded by one budget for all, a failed read failing
it.  What it read of the last records is kept in the tier for the next broker of a chain
(``tiered.recentids``), used only where it covers the read.  A real store and
TieredDispatcher write the tier (a local directory); a mount reads it while the
dispatcher still holds its open key-index file (as a kill -9 leaves it)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.clock import ManualClock
from store.message import Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered import mountindex
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.errors import TierError, TierUnavailable
from tiered.index import IndexHit, id_digest
from tiered.mount import MountedBroker
from tiered.providers.local import LocalProvider
from tiered.recentids import decode, encode, path_of

TOPICS = ("a", "b", "c")
QUEUES = 3
PER_STEP = 30  # messages per topic a minute, for six minutes


class Tier:
    def __init__(self, root: Path, ids: list[str], step_ms: list[int]) -> None:
        self.root = root
        self.ids = ids
        self.step_ms = step_ms  # the store time of each minute's messages

    def mount(self, work: Path, provider: LocalProvider | None = None,
              threads: int = mountindex.TAIL_THREADS) -> MountedBroker:
        return MountedBroker(provider or LocalProvider(str(self.root / "tier")), "b0",
                             str(work), index_threads=threads)


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    """Three topics of three queues, six minutes of keyed messages: the first three in a
    sealed key-index file, the rest in the open one (no sealed file covers them)."""
    root = tmp_path_factory.mktemp("mountindex")
    clock = ManualClock()
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    dispatcher = TieredDispatcher(store, LocalProvider(str(root / "tier")), "b0",
                                  str(root / "data" / "tiered"),
                                  TierConfig(index_ms=3_600_000), clock)
    dispatcher.open()
    ids: list[str] = []
    step_ms: list[int] = []
    try:
        for t in TOPICS:
            store.create_topic(Topic(t, QUEUES))
        for step in range(6):
            step_ms.append(clock.now_ms())
            for t in TOPICS:
                batch = [Message(f"{t}-{step}-{i}", t, b"x" * 50, key=f"k{i % 4}")
                         for i in range(PER_STEP)]
                store.put(batch).result(10)
                ids += [m.message_id for m in batch]
            clock.advance(60_000)
            while dispatcher.step():
                pass
            dispatcher.commit(force=step == 2)  # the key index sealed once
        clock.advance(TierConfig().upload_batch_ms)
        dispatcher.commit(force=False)  # the last minute's batch (not the index: 1 h)
        yield Tier(root, ids, step_ms)
    finally:
        dispatcher.stop()
        store.stop()


@pytest.fixture(autouse=True)
def _no_kept_ids(tier: Tier) -> None:
    """Each test starts with no recent ids kept in the (module's) tier."""
    (tier.root / "tier" / path_of("b0")).unlink(missing_ok=True)


class _Slow(LocalProvider):
    """A local tier whose reads each take ``delay_s``, and that records how many queues'
    data were being read at once (or fails the reads of queue ``fail``)."""

    def __init__(self, root: str, delay_s: float, fail: str = "") -> None:
        super().__init__(root)
        self.delay_s = delay_s
        self.fail = fail
        self.max_queues = 0
        self._reading: dict[str, int] = {}
        self._lock = threading.Lock()

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        parts = path.split("/")
        if parts[1] != "data":
            return super().read(path, offset, length)
        queue = "/".join(parts[2:5])  # topic/generation/queue
        if queue == self.fail:
            raise TierUnavailable(f"{path}: injected")
        with self._lock:
            self._reading[queue] = self._reading.get(queue, 0) + 1
            self.max_queues = max(self.max_queues, len(self._reading))
        try:
            time.sleep(self.delay_s)
            return super().read(path, offset, length)
        finally:
            with self._lock:
                self._reading[queue] -= 1
                if not self._reading[queue]:
                    del self._reading[queue]


@pytest.mark.parametrize("since_step", [None, 1, 4])
def test_the_tails_read_at_once_are_the_tail_read_queue_after_queue(
        tier: Tier, tmp_path: Path, since_step: int | None) -> None:
    # Given two mounts of the tier, one reading a queue at a time, one eight
    since_ms = 0 if since_step is None else tier.step_ms[since_step]
    serial = tier.mount(tmp_path / "serial", threads=1)
    parallel = tier.mount(tmp_path / "parallel")
    # When each indexes the tail (of everything, or of what was stored since a time)
    tail = parallel.index.tail(since_ms)
    # Then the tails are the same, entry for entry, every queue in it
    assert tail == serial.index.tail(since_ms)
    minutes = 3 if since_step in (None, 1) else 2  # the tail starts after the sealed file
    assert tail.records == minutes * PER_STEP * len(TOPICS)
    assert sorted(tail.names) == sorted((t, q, 0) for t in TOPICS for q in range(QUEUES))
    # and each id is found, by a lookup since the time too when stored since (a lookup
    # gives candidates: an entry's hash is shorter than the digest)
    for mid in tier.ids[:: 7]:
        (found,) = parallel.query_by_message_id(mid)
        assert found.message_id == mid
        hits = parallel.index.lookup_since(id_digest(mid), found.topic, since_ms or 1)
        where = (found.topic, found.queue_id, found.queue_offset)
        assert (where in [(h.topic, h.queue_id, h.queue_offset) for h in hits]) is \
            (found.store_at_ms >= since_ms)


@pytest.mark.parametrize(("threads", "overlap"), [(1, False), (8, True)])
def test_the_queues_are_read_at_once(tier: Tier, tmp_path: Path, threads: int,
                                     overlap: bool) -> None:
    # Given a tier whose reads take 20 ms each
    slow = _Slow(str(tier.root / "tier"), 0.02)
    mounted = tier.mount(tmp_path, slow, threads)
    # When a takeover warms the mount's index of the last minutes
    mounted.warm(tier.step_ms[4])
    # Then several queues were read at once (one at a time with one thread)
    assert (slow.max_queues > 1) is overlap
    assert slow.max_queues <= threads


def test_one_budget_bounds_the_records_of_all_the_queues(
        tier: Tier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a bound below the records no sealed file covers (270)
    monkeypatch.setattr(mountindex, "_TAIL_MAX_RECORDS", 100)
    # When the queues' tails are read at once (or one after another)
    with caplog.at_level(logging.ERROR, "tiered.mountindex"):
        tail = tier.mount(tmp_path / "parallel").index.tail()
    serial = tier.mount(tmp_path / "serial", threads=1).index.tail()
    # Then 100 records are indexed, no more, and the cut is logged
    assert tail.records == serial.records == 100
    assert sum(len(body) for _, body in tail.entries) == 100 * 2 * 36  # an id and a key
    assert "QueryMessages will not find the rest" in caplog.text


def test_a_failed_read_fails_the_index(tier: Tier, tmp_path: Path) -> None:
    # Given a tier that fails the reads of one queue
    failing = _Slow(str(tier.root / "tier"), 0.0, fail="b/0/1")
    mounted = tier.mount(tmp_path, failing)
    # When the index is built, Then the read's error is the lookup's
    with pytest.raises(TierError, match="injected"):
        mounted.warm(tier.step_ms[4])
    with pytest.raises(TierError, match="injected"):
        mounted.query_by_message_id(tier.ids[0])



class _NoData(LocalProvider):
    """A local tier whose queue data cannot be read."""

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if path.split("/")[1] == "data":
            raise TierUnavailable(f"{path}: injected")
        return super().read(path, offset, length)


def _hits(mounted: MountedBroker, ids: list[str], since_ms: int) -> list[list[IndexHit]]:
    return [sorted(mounted.index.lookup_since(id_digest(mid), mid[0], since_ms))
            for mid in ids]


def test_a_takeover_keeps_what_it_read_and_the_next_reads_no_queue(
        tier: Tier, tmp_path: Path) -> None:
    # Given a successor that indexed the departed broker's last minutes
    since_ms = tier.step_ms[4]
    first = tier.mount(tmp_path / "first")
    first.warm(since_ms)
    kept = decode((tier.root / "tier" / path_of("b0")).read_bytes())
    assert kept.since_ms == since_ms and kept.records == 2 * PER_STEP * len(TOPICS)
    # When the next broker of the chain mounts it from a tier whose queue data it
    # cannot read
    second = tier.mount(tmp_path / "second", _NoData(str(tier.root / "tier")))
    # Then it finds the same candidates for the ids as the first, without those reads
    assert second.index.tail(since_ms) == first.index.tail(since_ms)
    sample = tier.ids[:: 11]
    assert _hits(second, sample, since_ms) == _hits(first, sample, since_ms)
    assert sum(map(len, _hits(second, sample, since_ms))) >= len(sample) // 3
    # and a later time is covered too (a lookup keeps what was stored since then)
    assert _hits(second, sample, tier.step_ms[5]) == _hits(first, sample, tier.step_ms[5])


def _served(mounted: MountedBroker, short: int) -> dict[str, dict[int, int]]:
    """The ends a takeover took of every queue, ``short`` records before queue a/0's
    committed end (a commit the departed broker had on its way landed after)."""
    ends: dict[str, dict[int, int]] = {}
    for t in TOPICS:
        for q in range(QUEUES):
            bounds = mounted.bounds(t, q)
            assert bounds is not None
            ends.setdefault(t, {})[q] = bounds[1] - (short if (t, q) == ("a", 0) else 0)
    return ends


def test_kept_ids_read_to_the_ends_served_are_used_past_a_late_commit(
        tier: Tier, tmp_path: Path) -> None:
    # Given a successor that serves queue a/0 up to 5 records before its end in the tier
    # (the departed broker's last commit landed after the takeover took its ends)
    since_ms = tier.step_ms[4]
    first = tier.mount(tmp_path / "first")
    served = _served(first, 5)
    first.serve_below(served)
    first.warm(since_ms)
    # Then it read and kept the queue's tail up to the end it serves, not past it
    kept = decode((tier.root / "tier" / path_of("b0")).read_bytes())
    assert kept.ends[("a", 0, 0)] == served["a"][0]
    assert kept.records == 2 * PER_STEP * len(TOPICS) - 5
    # When the next broker of the chain, serving the same ends, mounts it from a tier
    # whose queue data it cannot read
    second = tier.mount(tmp_path / "second", _NoData(str(tier.root / "tier")))
    second.serve_below(served)
    # Then it uses the kept ids (was: read the queues again, their committed end past
    # what the kept ids were read to), and finds what the first finds
    assert second.index.tail(since_ms) == first.index.tail(since_ms)
    sample = tier.ids[:: 11]
    assert _hits(second, sample, since_ms) == _hits(first, sample, since_ms)


def test_kept_ids_cover_a_queue_they_do_not_name_with_nothing_to_read(
        tier: Tier, tmp_path: Path) -> None:
    # Given recent ids kept without topic c's queues (their metadata landed after that
    # read: a topic the departed broker deleted in its last moments)
    since_ms = tier.step_ms[4]
    first = tier.mount(tmp_path / "first")
    first.warm(since_ms)
    path = tier.root / "tier" / path_of("b0")
    kept = decode(path.read_bytes())
    path.write_bytes(encode(kept._replace(
        ends={r: e for r, e in kept.ends.items() if r[0] != "c"},
        bodies={r: b for r, b in kept.bodies.items() if r[0] != "c"})))
    # When the next broker of the chain serves topics a and b only (c is not served: its
    # queues end at 0 for it), from a tier whose queue data it cannot read
    second = tier.mount(tmp_path / "second", _NoData(str(tier.root / "tier")))
    second.serve_below({t: e for t, e in _served(first, 0).items() if t != "c"})
    # Then it uses the kept ids (was: read the queues again, a queue the kept ids do not
    # name counted as read short even with nothing to read), and finds what the first
    # finds of a and b
    sample = [i for i in tier.ids[:: 11] if i[0] != "c"]
    assert _hits(second, sample, since_ms) == _hits(first, sample, since_ms)
    assert sum(map(len, _hits(second, sample, since_ms))) >= len(sample) // 3


@pytest.mark.parametrize("why", ["earlier", "damaged", "short"])
def test_kept_ids_that_do_not_cover_the_read_are_not_used(
        tier: Tier, tmp_path: Path, why: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given recent ids kept from a later time, or damaged, or read short of a queue's end
    path = tier.root / "tier" / path_of("b0")
    tier.mount(tmp_path / "first").warm(tier.step_ms[5])
    kept = decode(path.read_bytes())
    if why == "damaged":
        path.write_bytes(path.read_bytes()[:-7])
    elif why == "short":
        short = {**kept.ends, ("a", 0, 0): kept.ends[("a", 0, 0)] - 1}
        path.write_bytes(encode(kept._replace(ends=short)))
    # When a mount looks up what was stored since a time
    since_ms = tier.step_ms[4] if why == "earlier" else tier.step_ms[5]
    slow = _Slow(str(tier.root / "tier"), 0.0)
    with caplog.at_level(logging.WARNING, "tiered.mountindex"):
        tail = tier.mount(tmp_path / "second", slow).index.tail(since_ms)
    # Then it read the queues itself: the tail is the one a read of them makes
    assert slow.max_queues > 0
    assert tail == tier.mount(tmp_path / "serial", threads=1).index.tail(since_ms)
    assert ("unusable" in caplog.text) is (why == "damaged")
    # and what it read is kept now in place of what was there
    now = decode(path.read_bytes())
    assert now.since_ms == since_ms and now.ends == decode(encode(kept)).ends


class _SlowMeta(LocalProvider):
    """A local tier whose queue metadata reads each take 20 ms; counts those at once."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.at_once = self.most = 0
        self._lock = threading.Lock()

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if path.split("/")[1] != "meta":
            return super().read(path, offset, length)
        with self._lock:
            self.at_once += 1
            self.most = max(self.most, self.at_once)
        try:
            time.sleep(0.02)
            return super().read(path, offset, length)
        finally:
            with self._lock:
                self.at_once -= 1


def test_a_mount_reads_the_queues_metadata_at_once_and_skips_a_damaged_one(
        tier: Tier, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a copy of the tier in which one queue's metadata copy is damaged
    shutil.copytree(tier.root / "tier", tmp_path / "tier")
    (tmp_path / "tier" / "b0" / "meta" / "b" / "1.json").write_bytes(b'{"generation": ')
    slow = _SlowMeta(str(tmp_path / "tier"))
    # When a takeover mounts it
    with caplog.at_level(logging.ERROR, "tiered.mount"):
        mounted = MountedBroker(slow, "b0", str(tmp_path / "work"))
    # Then the copies were read several at once, and every queue but that one is served
    assert 1 < slow.most <= mountindex.TAIL_THREADS
    assert mounted.bounds("b", 1) is None and "skipping b0/meta/b/1.json" in caplog.text
    whole = tier.mount(tmp_path / "whole")
    others = [(t, q) for t in TOPICS for q in range(QUEUES) if (t, q) != ("b", 1)]
    assert [mounted.bounds(*k) for k in others] == [whole.bounds(*k) for k in others]
    assert mounted.messages() == whole.messages() - whole.bounds("b", 1)[1] > 0


class _Threads(LocalProvider):
    """A local tier that notes which threads read queue data."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.names: set[str] = set()

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if path.split("/")[1] == "data":
            self.names.add(threading.current_thread().name.rsplit("_", 1)[0])
        return super().read(path, offset, length)


def test_the_index_reads_on_threads_of_its_own_not_ahead_of_a_replay(
        tier: Tier, tmp_path: Path) -> None:
    """A takeover's ids indexing and its journal replay shared the readers of many
    objects: the replay's reads queued behind the index's (a timer stream of 105 records
    read in 1.8 s in the failover chaos)."""
    # Given a mount whose tier notes the reading threads
    provider = _Threads(str(tier.root / "tier"))
    mounted = tier.mount(tmp_path, provider)
    # When its index of the last minutes is built, Then its reads of many objects ran on
    # its own readers (one object: on its queue's thread), none on the shared ones
    mounted.warm(tier.step_ms[4])
    assert "index-read" in provider.names and "tier-read" not in provider.names
    # and a scan of a queue (a replay's) on the shared ones
    provider.names.clear()
    assert len(list(mounted.scan("a", 0, 0))) > 1
    assert "tier-read" in provider.names and "index-read" not in provider.names
