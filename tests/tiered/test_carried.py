"""The commit record's pieces (``tiered.carried``): which of a copy and the lease's entry
is newer, a damaged lease, the Mirror's carried set that never drops what it carried
before a copy of it is in, and a Spark plan that reads a queue known only from the
lease.  Real local-directory and in-memory tiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiered.carried import carried, carried_in, entries, freshest, has_queues, lease_path, order
from tiered.errors import TierError
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider
from tiered.queue import TieredQueue
from tiered.scan import Selection, plan, tier_prefixes
from tiered.uploads import CARRY_MAX_BYTES, Mirror


def _meta(generation: int, seq: int) -> bytes:
    return json.dumps({"version": 1, "generation": generation, "seq": seq}).encode()


def test_the_newer_of_a_copy_and_the_lease_entry_is_read() -> None:
    old, new, reborn = _meta(5, 3), _meta(5, 4), _meta(9, 1)
    assert freshest(old, new) is new and freshest(new, old) is new
    assert freshest(new, reborn) is reborn  # a topic created again: a newer generation
    assert freshest(None, old) is old and freshest(old, None) is old
    assert freshest(b"{", old) is old and freshest(old, b"{") is old
    assert order(json.dumps({"generation": 2}).encode()) == (2, 0)  # before ``seq``
    with pytest.raises(ValueError):
        order(b"[]")


def test_a_queue_counts_its_saves_across_a_restart() -> None:
    tier = MemoryProvider()
    q = TieredQueue(tier, "b0", "t", 0, generation=7)
    first, second = q.to_json(), q.to_json()
    assert order(first) == (7, 1) and order(second) == (7, 2)
    again = TieredQueue(tier, "b0", "t", 0, second)
    assert order(again.to_json()) == (7, 3)


def test_the_lease_field_round_trips_and_a_damaged_one_is_an_error() -> None:
    metas = {"b0/meta/t/0.json": _meta(1, 2), "b0/meta/x/3.json": _meta(4, 5)}
    lease = json.dumps({"broker": "b0", "meta": entries(metas, "b0")}).encode()
    assert carried_in(lease, "b0") == metas
    assert carried_in(json.dumps({"broker": "b0"}).encode(), "b0") == {}
    hostile = json.dumps({"meta": {"../../etc/passwd": "x", "t/0.json": "y"}}).encode()
    assert carried_in(hostile, "b0") == {"b0/meta/t/0.json": b"y"}
    for damaged in (b"{", json.dumps({"meta": [1]}).encode()):
        with pytest.raises(TierError):
            carried_in(damaged, "b0")
    tier = MemoryProvider()
    assert carried(tier, "b0") == {} and not has_queues(tier, "b0")
    tier.write(lease_path("b0"), lease)
    assert carried(tier, "b0") == metas and has_queues(tier, "b0")


def test_the_mirror_carries_what_it_carried_until_a_newer_one_may_be_seen() -> None:
    tier = MemoryProvider()
    mirror = Mirror(tier, None)
    mirror.carry("b0/meta/", {})
    mirror.put("b0/meta/timer/0.json", b"v1", after=100)
    assert mirror.due(50) == {}  # its records name what is not in yet
    assert mirror.due(100) == {"b0/meta/timer/0.json": b"v1"}
    mirror.put("b0/meta/timer/0.json", b"v2", after=200)
    assert mirror.due(150) == {"b0/meta/timer/0.json": b"v1"}  # (not dropped)
    assert mirror.due(200) == {"b0/meta/timer/0.json": b"v2"}
    mirror.put("b0/index/catalog.json", b"i")
    assert set(mirror.due(200)) == {"b0/meta/timer/0.json"}
    mirror.sync(1e18, lambda: 200)  # no record carried v2 yet: only the index is copied
    assert tier.list("") == ["b0/index/catalog.json"]
    mirror.confirmed({"b0/meta/timer/0.json": b"v2"})  # a record carried it: copied
    mirror.sync(1e18, lambda: 200)
    assert tier.read("b0/meta/timer/0.json") == b"v2"
    assert mirror.due(200) == {}  # in the tier: nothing left to carry


def test_what_the_lease_carried_at_start_is_carried_and_copied() -> None:
    tier = MemoryProvider()
    mirror = Mirror(tier, None)
    mirror.carry("b0/meta/", {"b0/meta/state/0.json": b"old", "b0/meta/t/0.json": b"held"})
    mirror.put("b0/meta/state/0.json", b"new", after=300)  # caught up: a newer one waits
    assert mirror.due(0) == {"b0/meta/state/0.json": b"old",
                                         "b0/meta/t/0.json": b"held"}
    assert mirror.unready_floor(0) is None  # (no floor given)
    mirror.sync(1e18, lambda: 0)  # what a record carried is copied
    assert tier.read("b0/meta/t/0.json") == b"held"
    assert tier.read("b0/meta/state/0.json") == b"old"
    assert mirror.due(0) == {}  # the older is in; the newer is not seen yet
    assert mirror.due(300) == {"b0/meta/state/0.json": b"new"}


def test_what_a_published_position_counted_on_is_carried_whatever_comes_after() -> None:
    # Given the state stream's metadata a reader may see when a position is published
    mirror = Mirror(MemoryProvider(), None)
    mirror.carry("b0/meta/", {})
    mirror.put("b0/meta/state/0.json", b"p1", floor=(10, 0.0), after=100)
    assert mirror.unready_floor(100) is None  # (so the position may pass 10)
    # When a newer one its records do not let a reader see yet comes before the record
    mirror.put("b0/meta/state/0.json", b"p2", floor=(20, 0.0), after=200)
    # Then the record carries the first (it was dropped: the position confirmed without
    # it), and the next position stays below the second's floor
    assert mirror.due(150) == {"b0/meta/state/0.json": b"p1"}
    assert mirror.unready_floor(150) == (10, 0.0)


def test_a_copy_too_large_to_carry_is_written_first_and_holds_the_position() -> None:
    tier = MemoryProvider()
    mirror = Mirror(tier, None)
    mirror.carry("b0/meta/", {})
    mirror.put("b0/meta/t/0.json", b"small", floor=(5, 1.0))
    assert mirror.due(0) == {"b0/meta/t/0.json": b"small"} and not mirror.copying()
    big = b"x" * (CARRY_MAX_BYTES + 1)
    mirror.put("b0/meta/t/0.json", big, floor=(7, 2.0))
    assert mirror.due(0) == {"b0/meta/t/0.json": b"small"}  # (what it carried: kept)
    assert mirror.copying() and mirror.unready_floor(0) == (5, 1.0)
    mirror.sync(1e18, lambda: 0)  # written without a record
    assert tier.read("b0/meta/t/0.json") == big
    assert mirror.due(0) == {} and mirror.unready_floor(0) is None


def test_a_spark_plan_reads_a_queue_known_only_from_the_lease(tmp_path: Path) -> None:
    tier = LocalProvider(str(tmp_path / "tier"))
    q = TieredQueue(tier, "b0", "t", 0)
    q.append(0, b"record", 0, 1_000)
    assert q.log.commit() and q.cq.commit()
    lease = {"broker": "b0", "meta": entries({"b0/meta/t/0.json": q.to_json().encode()},
                                              "b0")}
    tier.write(lease_path("b0"), json.dumps(lease).encode())
    slices = plan(tier, "b0", Selection())
    assert [(s.topic, s.queue_id) for s in slices] == [("t", 0)]
    assert tier_prefixes(tier) == ["b0"]
