"""The tier scan codec without Spark: planning slices from the tier's metadata (time
range and topic skip whole segments), decoding records into columns, damage reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store.clock import ManualClock
from store.message import Message, draft_of
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.providers.local import LocalProvider
from tiered.scan import COLUMNS, Damage, ScanSlice, Selection, decode_slice, plan


def _tiered(tmp_path: Path, clock: ManualClock) -> tuple[MessageStore, LocalProvider, int]:
    """Topics a (2 queues) and b; three minutes of a, one message a second minute."""
    store = MessageStore(StoreConfig(str(tmp_path / "data")), clock)
    store.open()
    store.start()
    provider = LocalProvider(str(tmp_path / "tier"))
    tier = TieredDispatcher(store, provider, "b0", str(tmp_path / "data" / "tiered"),
                            TierConfig(segment_ms=60_000), clock)
    tier.open()
    store.create_topic(Topic("a", 2))
    store.create_topic(Topic("b", 1))
    t0 = clock.now_ms()
    for minute in range(3):
        for i in range(20):
            store.put_drafts([draft_of(Message(
                "", "a", f"{minute}-{i}".encode(), key=f"k{i % 4}", tag="t",
                properties={"n": str(i)}))]).result(10)
            clock.advance(1000)
            if i % 5 == 4:  # several uploads per segment
                while tier.step():
                    pass
                tier.commit()
        clock.advance(40_000)
    store.put_drafts([draft_of(Message("", "b", b"other"))]).result(10)
    while tier.step():
        pass
    tier.stop()
    store.stop()
    return store, provider, t0


def test_plan_and_decode_the_selection(tmp_path: Path, manual_clock: ManualClock) -> None:
    _, provider, t0 = _tiered(tmp_path, manual_clock)
    everything = plan(provider, "b0", Selection())
    rows = [r for s in everything for r in _rows(provider, s)]
    assert len(rows) == 61
    bodies = {r["body"] for r in rows if r["topic"] == "a"}
    assert bodies == {f"{m}-{i}".encode() for m in range(3) for i in range(20)}
    first = next(r for r in rows if r["body"] == b"0-1")
    assert (first["key"], first["tag"], first["properties"]) == ("k1", "t", [("n", "1")])
    assert first["store_at_ms"] == t0 + 1000
    # the second minute only: whole segments of the other minutes are never read
    minute = Selection(frozenset({"a"}), t0 + 60_000, t0 + 120_000)
    slices = plan(provider, "b0", minute)
    assert len(slices) < len([s for s in everything if s.topic == "a"])
    picked = [r for s in slices for r in _rows(provider, s, minute)]
    assert sorted(r["body"] for r in picked) == sorted(f"1-{i}".encode() for i in range(20))
    keyed = Selection(frozenset({"a"}), key="k3")
    assert len([r for s in plan(provider, "b0", keyed) for r in _rows(provider, s, keyed)]) == 15
    assert plan(provider, "b0", Selection(frozenset({"none"}))) == []


def test_a_damaged_object_is_reported(tmp_path: Path, manual_clock: ManualClock) -> None:
    _, provider, _ = _tiered(tmp_path, manual_clock)
    s = plan(provider, "b0", Selection(frozenset({"b"})))[0]
    path = tmp_path / "tier" / s.paths[0]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    damaged: list[Damage] = []
    assert list(decode_slice(provider, s, on_damage=damaged.append)) == []
    assert [d.path for d in damaged] == [s.paths[0]]
    assert "bad record at byte 0 (CRC mismatch)" in damaged[0].reason


def _rows(provider: LocalProvider, s: ScanSlice,
          sel: Selection | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in decode_slice(provider, s, sel or Selection()):
        assert batch.schema.names == list(COLUMNS)
        out += batch.to_pylist()
    return out


def test_decode_object_columns_with_mixed_properties_and_filters() -> None:
    from store.message import encode_record
    from tiered.scan import decode_object

    props = [{}, {"a": "1"}, {"x": "", "yy": "zz", "ünï": "cödé"}, {}, {"k": "v" * 300}]
    records = [encode_record(Message(f"id{i}", "t", f"body{i}".encode() * (i + 1),
                                     key=f"k{i % 2}", tag="tg" if i else "",
                                     properties=p, queue_id=3, queue_offset=100 + i,
                                     born_at_ms=10 + i, store_at_ms=1000 + i,
                                     deliver_at_ms=2000 + i))
               for i, p in enumerate(props)]
    batch = decode_object(b"".join(records), "t")
    rows = batch.to_pylist()
    assert [dict(r["properties"]) for r in rows] == props
    assert [r["body"] for r in rows] == [f"body{i}".encode() * (i + 1) for i in range(5)]
    assert [(r["message_id"], r["key"], r["tag"], r["queue_id"], r["queue_offset"])
            for r in rows][:2] == [("id0", "k0", "", 3, 100), ("id1", "k1", "tg", 3, 101)]
    assert [(r["born_at_ms"], r["store_at_ms"], r["deliver_at_ms"]) for r in rows][4] == (
        14, 1004, 2004)
    picked = decode_object(b"".join(records), "t", selection=Selection(
        start_ms=1001, end_ms=1004, key="k0")).to_pylist()
    assert [r["message_id"] for r in picked] == ["id2"]
    assert dict(picked[0]["properties"]) == props[2]
