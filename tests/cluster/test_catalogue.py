"""The topic catalogue's copy in the tier (``cluster.catalogue``): its codec round-trips
(hypothesis), version 1 still reads, which queues in the tier it keeps live, and the
copy a broker writes on every provider: a publish returns with the change in the tier,
deletions carried over a restart."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.catalogue import (
    Catalogue,
    CatalogueCopy,
    CatalogueError,
    decode,
    encode,
    read_catalogue,
)
from store.topics import Topic
from tiered.provider import Provider

_names = st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True)
_made = st.builds(lambda p, g, t: f"{p}{g}%{t}", st.sampled_from(["%RETRY%", "%DLQ%"]),
                  _names, _names)
_counts = st.integers(0, 2**53)
_topics = st.builds(lambda n, q, r, b, tr, g: Topic(n, q, r, b, g, tr),
                    st.one_of(_names, _made), st.integers(1, 1024), _counts, _counts,
                    _counts, _counts)


@given(st.lists(_topics, unique_by=lambda t: t.name),
       st.dictionaries(st.one_of(_names, _made), _counts))
def test_a_copy_round_trips(topics: list[Topic], deleted: dict[str, int]) -> None:
    by_name = {t.name: t for t in topics}
    # (a deletion the listed generation is past is dropped: it rules nothing out)
    kept = {n: at for n, at in deleted.items()
            if n not in by_name or by_name[n].since_offset < at}
    assert decode(encode(Catalogue(by_name, deleted))) == Catalogue(by_name, kept)


def test_version_1_reads_and_is_not_authoritative() -> None:
    raw = json.dumps({"version": 1, "topics": [
        {"name": "orders", "queue_count": 4, "retention_ms": 0, "retention_bytes": 0,
         "tier_retention_ms": 0}]}).encode()
    c = decode(raw)
    assert c.topics == {"orders": Topic("orders", 4)} and not c.authoritative
    assert c.live("gone", 5)  # every queue is, as before copies were authoritative


@pytest.mark.parametrize("raw", [b"{", b'{"version": 3, "topics": [], "deleted": {}}',
                                 b'{"version": 2, "topics": []}',
                                 b'{"version": 2, "topics": [{"name": "../x"}], "deleted": {}}',
                                 b'{"version": 2, "topics": [], "deleted": {"t": -1}}'])
def test_a_damaged_copy_is_an_error(raw: bytes) -> None:
    with pytest.raises(CatalogueError):
        decode(raw)


def test_which_queues_are_live() -> None:
    c = Catalogue({"orders": Topic("orders", since_offset=500),
                   "%DLQ%g%gone": Topic("%DLQ%g%gone", since_offset=90)},
                  {"gone": 300})
    assert c.live("orders", 500) and c.live("orders", 900)
    assert not c.live("orders", 100)  # a deleted generation of a name created again
    assert not c.live("gone", 200) and c.live("gone", 300)  # deleted; created since
    assert not c.live("%RETRY%g%gone", 250)  # a retry topic of a deleted topic
    assert c.live("%DLQ%g%gone", 90)  # listed: dead letters outlive their topic
    assert not c.live("%RETRY%g%orders", 100) and c.live("%RETRY%g%orders", 600)
    assert c.live("fresh", 0)  # created, not in the copy yet: its queues count


class _Local:
    """A broker's topics and CommitLog end, as the copy sees them."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}
        self.end = 0

    def create(self, name: str) -> None:
        self.topics[name] = Topic(name, 2, since_offset=self.end)
        self.end += 100  # messages sent to it

    def delete(self, name: str) -> None:
        del self.topics[name]


def _copy(provider: Provider, local: _Local) -> CatalogueCopy:
    return CatalogueCopy(provider, "broker-a", lambda: list(local.topics.values()),
                         lambda: local.end)


def test_a_publish_returns_with_the_change_in_the_tier(provider: Provider) -> None:
    local = _Local()
    copy = _copy(provider, local)
    assert copy.open() == []
    copy.publish()
    local.create("orders")
    copy.publish()
    assert set(read_catalogue(provider, "broker-a").topics) == {"orders"}  # type: ignore[union-attr]
    local.delete("orders")
    copy.deleted(["orders"])
    copy.publish()
    assert read_catalogue(provider, "broker-a") == Catalogue({}, {"orders": 100})
    local.create("orders")  # created again: a later generation
    copy.publish()
    c = read_catalogue(provider, "broker-a")
    assert c is not None and c.topics["orders"].since_offset == 100 and c.deleted == {}


def test_a_restart_keeps_deletions_and_finishes_one_cut_short(provider: Provider) -> None:
    local = _Local()
    copy = _copy(provider, local)
    copy.open()
    for name in ("a", "b", "c"):
        local.create(name)
    copy.publish()
    local.delete("a")
    copy.deleted(["a"])
    copy.publish()
    local.delete("b")  # then the broker died before its copy named the deletion
    again = _copy(provider, local)
    assert again.open() == ["a", "b"]  # what it may keep of them is to be dropped
    again.publish()
    c = read_catalogue(provider, "broker-a")
    assert c is not None and set(c.topics) == {"c"} and set(c.deleted) == {"a", "b"}
    assert not c.live("b", 100)


def test_concurrent_publishes_share_writes(provider: Provider) -> None:
    local = _Local()
    copy = _copy(provider, local)
    copy.open()
    writes: list[bytes] = []
    write = provider.write

    def counted(path: str, data: bytes) -> None:
        writes.append(data)
        write(path, data)
    provider.write = counted  # type: ignore[method-assign]
    gate = threading.Barrier(8)
    missing: list[str] = []

    def create(n: int) -> None:
        gate.wait()
        local.create(f"t{n}")
        copy.publish()
        c = read_catalogue(provider, "broker-a")
        if c is None or f"t{n}" not in c.topics:  # in the tier when it returned
            missing.append(f"t{n}")
    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert missing == [] and 1 <= len(writes) <= 8
    copy.publish()  # nothing changed: nothing written
    assert set(json.loads(writes[-1])["topics"][i]["name"] for i in range(8)) == {
        f"t{n}" for n in range(8)}
