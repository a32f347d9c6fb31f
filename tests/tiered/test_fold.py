"""Folds of small tier objects (``tiered.fold``) on a real store, dispatcher and
local-directory tier: the metadata of a queue that commits one message at a time stays
small, every reader (the owner, a mount, a Spark plan) reads the same records, and the
replaced objects go only once they are kept long enough and the tier's metadata no
longer names them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from store.clock import ManualClock
from store.message import Message, decode_record
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tests.tiered.conftest import s3_provider
from tests.tiered.faults import FaultyProvider
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.flatfile import Segment
from tiered.fold import FOLD_BYTES, runs
from tiered.mount import MountedBroker
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.scan import Selection, decode_slice, plan

N = 300  # messages, one commit each


def test_runs_take_alike_objects_by_the_fanin_and_a_sealed_segment_whole() -> None:
    def seg(sizes: list[int], levels: dict[int, int] | None = None,
            sealed: bool = False) -> Segment:
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return Segment(0, sum(sizes), sealed, starts,
                       folds={starts[k]: lv for k, lv in (levels or {}).items()})

    assert runs(seg([10] * 3), 4) == []  # too few
    assert runs(seg([10] * 9), 4) == [(0, 9, 1)]  # all alike at once
    # a fold of level 1, then 4 commits: the commits alone are folded (never it again)
    assert runs(seg([40, 10, 10, 10, 10], {0: 1}), 4) == [(1, 5, 1)]
    assert runs(seg([40] * 4 + [10] * 2, dict.fromkeys(range(4), 1)), 4) == [(0, 4, 2)]
    # cut by FOLD_BYTES: the large ones stay as they are
    big = FOLD_BYTES // 2 + 1
    assert runs(seg([big] * 6), 4) == []
    # a sealed segment: everything that fits, whatever the levels
    assert runs(seg([40, 10, 10], {0: 1}, sealed=True), 4) == [(0, 3, 2)]
    assert runs(seg([big, big, 10], sealed=True), 4) == [(1, 3, 1)]


def _open(root: Path, clock: ManualClock, provider: Provider, fanin: int, keep_s: float
          ) -> tuple[MessageStore, TieredDispatcher]:
    store = MessageStore(StoreConfig(str(root / "data")), clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, provider, "b0", str(root / "data" / "tiered"),
                            TierConfig(fold_objects=fanin, fold_keep_s=keep_s,
                                       segment_bytes=64 << 10), clock)
    tier.open()
    store.create_topic(Topic("t", 1))
    return store, tier


def _send_one_commit_each(store: MessageStore, tier: TieredDispatcher, n: int,
                          fold_every: int) -> None:
    for i in range(n):
        store.put([Message("", "t", f"m{i}".encode() * 20)]).result(10)
        while tier.step():
            pass
        tier.commit()
        if fold_every and i % fold_every == fold_every - 1:
            tier.run_retention()


def _meta(tier: TieredDispatcher) -> tuple[int, int]:
    """The queue's metadata size, and the objects it lists."""
    q = tier.queue("t", 0)
    assert q is not None
    raw = json.loads(q.to_json())
    objects = sum(len(s["objects"]) for stream in ("log", "cq")
                  for s in json.loads(raw[stream])["segments"])
    return len(q.to_json()), objects


def _expected() -> list[bytes]:
    return [f"m{i}".encode() * 20 for i in range(N)]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_queue_of_one_message_commits_keeps_a_small_metadata_and_reads_the_same(
        tmp_path: Path, manual_clock: ManualClock, kind: str,
        request: pytest.FixtureRequest) -> None:
    plain_store, plain = _open(tmp_path / "plain", manual_clock,
                               LocalProvider(str(tmp_path / "tier")), 0, 0)
    folded: Provider = LocalProvider(str(tmp_path / "tier2"))
    if kind == "s3":  # moto's S3 server
        folded = s3_provider(request.getfixturevalue("s3_endpoint"), "fold")
    store, tier = _open(tmp_path / "folded", manual_clock, folded, 8, 0)
    try:
        _send_one_commit_each(plain_store, plain, N, 0)
        _send_one_commit_each(store, tier, N, 25)
        tier.run_retention()
        plain_size, plain_objects = _meta(plain)
        size, objects = _meta(tier)
        assert plain_objects == 2 * N  # one log and one cq object a commit
        assert objects < 60 and size * 3 < plain_size, (size, objects, plain_size)
        assert tier.folding.folds > 0
        # the owner reads every record, in order
        assert [decode_record(e.record).body for e in tier.read("t", 0, 0, 10_000)] \
            == _expected()
        tier.commit()  # the metadata copy in the tier
    finally:
        tier.stop()
        store.stop()
        plain.stop()
        plain_store.stop()
    # a mount (a takeover's reader) reads every record
    mounted = MountedBroker(folded, "b0", str(tmp_path / "work"))
    assert mounted.bounds("t", 0) == (0, N)
    assert [decode_record(e.record).body for e in mounted.read("t", 0, 0, 10_000)] \
        == _expected()
    # a Spark plan too, and it reads folds
    slices = plan(folded, "b0", Selection())
    assert any(_is_fold(path) for s in slices for path in s.paths)
    rows: list[dict[str, Any]] = [r for s in slices for b in decode_slice(folded, s)
                                  for r in b.to_pylist()]
    assert [r["body"] for r in rows] == _expected()


def test_replaced_objects_go_once_kept_long_enough_and_unnamed_in_the_tier(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    faulty = FaultyProvider(LocalProvider(str(tmp_path / "tier")))
    store, tier = _open(tmp_path, manual_clock, faulty, 8, 60)
    try:
        _send_one_commit_each(store, tier, 16, 0)
        before = _log_objects(tmp_path)
        faulty.refuse = "/meta/"  # the folded metadata's copy cannot go up
        assert tier.run_retention() == 0 and tier.folding.folds >= 2
        tier.commit()
        # the replaced objects stay while they are kept, and while the tier's copy of
        # the metadata (what a takeover reads) still names them
        manual_clock.advance(61_000)
        tier.run_retention()
        assert set(before) <= set(_log_objects(tmp_path)) and tier.folding.deleted == 0
        # the copy goes up: now they go
        faulty.refuse = ""
        store.put([Message("", "t", b"one more")]).result(10)
        while tier.step():
            pass
        tier.commit()
        tier.run_retention()
        q = tier.queue("t", 0)
        assert q is not None
        listed = {p for seg in q.log.segments() for p in seg.paths(q.log.prefix)}
        replaced = set(before) - listed
        assert replaced and tier.folding.deleted > 0
        assert not replaced & set(_log_objects(tmp_path))  # gone from the tier
        assert listed <= set(_log_objects(tmp_path))
        assert [decode_record(e.record).body for e in tier.read("t", 0, 0, 100)] \
            == [f"m{i}".encode() * 20 for i in range(16)] + [b"one more"]
    finally:
        tier.stop()
        store.stop()


def _log_objects(root: Path) -> list[str]:
    base = root / "tier"
    return sorted(str(p.relative_to(base)) for p in base.glob("b0/data/t/*/0/log/*/*"))


def _is_fold(path: str) -> bool:
    return "-" in path.rsplit("/", 1)[-1]


def test_what_a_fold_replaced_before_a_restart_goes_after_it(
        tmp_path: Path, manual_clock: ManualClock) -> None:
    """The replaced objects waiting for their keep are known in memory only: a crash
    (here a stop) left them for good.  The first pass after the start finds them in the
    listed folds' ranges and deletes them like any replaced."""
    store, tier = _open(tmp_path, manual_clock, LocalProvider(str(tmp_path / "tier")), 8, 60)
    try:
        _send_one_commit_each(store, tier, 16, 0)
        before = set(_log_objects(tmp_path))
        tier.run_retention()
        tier.commit()  # the folded metadata's copy in the tier
    finally:
        tier.stop()
        store.stop()
    assert before <= set(_log_objects(tmp_path))  # kept: none was due
    store = MessageStore(StoreConfig(str(tmp_path / "data")), manual_clock)
    store.open()
    store.start()
    tier = TieredDispatcher(store, LocalProvider(str(tmp_path / "tier")), "b0",
                            str(tmp_path / "data" / "tiered"),
                            TierConfig(fold_objects=8, fold_keep_s=60), manual_clock)
    tier.open()
    try:
        tier.run_retention()
        assert before <= set(_log_objects(tmp_path))  # kept their time again
        manual_clock.advance(61_000)
        tier.run_retention()
        q = tier.queue("t", 0)
        assert q is not None
        listed = {p for seg in q.log.segments() for p in seg.paths(q.log.prefix)}
        assert set(_log_objects(tmp_path)) == listed and before - listed
        assert tier.folding.deleted >= len(before - listed)
        assert [decode_record(e.record).body for e in tier.read("t", 0, 0, 100)] \
            == [f"m{i}".encode() * 20 for i in range(16)]
    finally:
        tier.stop()
        store.stop()
