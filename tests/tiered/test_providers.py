"""One contract for every tier Provider: memory, a local directory, and S3 against moto's
S3 server over HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.conftest import CREDS
from tests.tiered.conftest import s3_provider
from tiered.errors import TierBadPath, TierNotFound, TierUnavailable
from tiered.provider import Provider
from tiered.providers.s3 import S3Provider, S3Settings


def test_write_read_ranges_size_exists(provider: Provider) -> None:
    data = bytes(range(256)) * 40
    provider.write("topic/q0/00000000000000000000", data)
    assert provider.exists("topic/q0/00000000000000000000")
    assert provider.size("topic/q0/00000000000000000000") == len(data)
    assert provider.read("topic/q0/00000000000000000000") == data
    assert provider.read("topic/q0/00000000000000000000", 100, 50) == data[100:150]
    assert provider.read("topic/q0/00000000000000000000", len(data) - 3, 10) == data[-3:]
    assert provider.read("topic/q0/00000000000000000000", 10, 0) == b""


def test_replace_is_whole(provider: Provider) -> None:
    provider.write("a/b", b"old contents")
    provider.write("a/b", b"new")
    assert provider.read("a/b") == b"new" and provider.size("a/b") == 3


def test_list_by_prefix_sorted(provider: Provider) -> None:
    for p in ["t1/q1/2", "t1/q0/1", "t2/q0/1", "t1/q0/0"]:
        provider.write(p, p.encode())
    assert provider.list("t1/") == ["t1/q0/0", "t1/q0/1", "t1/q1/2"]
    assert provider.list("t1/q0/") == ["t1/q0/0", "t1/q0/1"]
    assert provider.list("none/") == []
    assert len(provider.list()) == 4


def test_missing_objects_and_idempotent_delete(provider: Provider) -> None:
    assert not provider.exists("nope")
    with pytest.raises(TierNotFound):
        provider.size("nope")
    with pytest.raises(TierNotFound):
        provider.read("nope")
    provider.write("x", b"1")
    provider.delete("x")
    provider.delete("x")
    assert not provider.exists("x") and provider.list() == []


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "./a"])
def test_bad_paths_are_refused(provider: Provider, bad: str) -> None:
    with pytest.raises(TierBadPath):
        provider.write(bad, b"x")


def test_s3_prefix_isolates_brokers(s3_endpoint: str) -> None:
    a = s3_provider(s3_endpoint, "shared", prefix="broker-a")
    b = S3Provider(S3Settings(bucket="shared", prefix="broker-b", endpoint_url=s3_endpoint,
                              **CREDS))
    a.write("seg", b"A")
    b.write("seg", b"B")
    assert (a.read("seg"), b.read("seg")) == (b"A", b"B")
    assert a.list() == ["seg"]


def test_s3_unreachable_is_unavailable() -> None:
    dead = S3Provider(S3Settings(bucket="x", endpoint_url="http://127.0.0.1:9", timeout_s=1,
                                 **CREDS))
    with pytest.raises(TierUnavailable):
        dead.write("a", b"1")


def test_swap_replaces_only_the_version_it_read(provider: Provider) -> None:
    """The conditional replace broker leases are made of (``tiered.lease``)."""
    assert provider.swap("brokers/a.json", b"v1", "") is not None  # create if absent
    assert provider.swap("brokers/a.json", b"other", "") is None  # it exists now
    data, version = provider.read_versioned("brokers/a.json")
    assert data == b"v1"
    new = provider.swap("brokers/a.json", b"v2", version)
    assert new is not None and new != version
    assert provider.swap("brokers/a.json", b"v3", version) is None  # a stale version
    assert provider.read_versioned("brokers/a.json") == (b"v2", new)
    assert provider.list("brokers/") == ["brokers/a.json"]  # no lock files listed
    with pytest.raises(TierNotFound):
        provider.read_versioned("brokers/none.json")


def test_of_racing_swaps_from_one_version_one_wins(provider: Provider) -> None:
    import threading
    provider.write("brokers/b.json", b"base")
    _, version = provider.read_versioned("brokers/b.json")
    won: list[bytes] = []
    gate = threading.Barrier(8)

    def race(n: int) -> None:
        gate.wait()
        if provider.swap("brokers/b.json", b"by %d" % n, version) is not None:
            won.append(b"by %d" % n)
    threads = [threading.Thread(target=race, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if provider.name != "s3":  # moto checks and writes in two steps; S3 itself does not
        assert len(won) == 1
    assert len(won) >= 1 and provider.read("brokers/b.json") in won
