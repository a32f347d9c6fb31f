"""Topic ownership in the shared tier: ``Provider.create`` (a conditional put) on every
provider, including moto's S3 server, and ``TopicOwners`` on top of it."""

from __future__ import annotations

import threading

import pytest

from cluster.ownership import Owner, TopicOwners
from tiered.errors import TierError
from tiered.provider import Provider


def test_create_writes_only_when_absent(provider: Provider) -> None:
    assert provider.create("owners/orders.json", b"first") is True
    assert provider.create("owners/orders.json", b"second") is False
    assert provider.read("owners/orders.json") == b"first"
    assert provider.list("owners/") == ["owners/orders.json"]  # no temporary left
    provider.delete("owners/orders.json")
    assert provider.create("owners/orders.json", b"third") is True


def test_of_concurrent_creators_exactly_one_wins(provider: Provider) -> None:
    wins: list[int] = []
    start = threading.Barrier(8)

    def claim(n: int) -> None:
        start.wait()
        if provider.create("owners/hot.json", str(n).encode()):
            wins.append(n)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert provider.read("owners/hot.json") == str(wins[0]).encode()


def test_owners_claim_look_up_release(provider: Provider) -> None:
    a = TopicOwners(provider, Owner("broker-a", "10.0.0.1:7600", "10.0.0.1:8081"))
    b = TopicOwners(provider, Owner("broker-b", "10.0.0.2:7600"))
    assert a.claim("orders", 1000) and a.claim("orders", 2000)  # again: still ours
    assert not b.claim("orders")
    assert b.owner("orders") == Owner("broker-a", "10.0.0.1:7600", "10.0.0.1:8081", 1000)
    assert b.claim("payments")
    assert set(a.topics()) == {"orders", "payments"}
    b.release("orders")  # not b's: kept
    assert a.owner("orders") is not None
    a.release("orders")
    assert a.owner("orders") is None and b.claim("orders")
    # a restarted owner at another address points clients at the new one
    moved = TopicOwners(provider, Owner("broker-a", "10.0.0.9:7600"))
    assert moved.claim("payments") is False  # b's
    assert moved.claim("refunds") and moved.owner("refunds").address == "10.0.0.9:7600"
    again = TopicOwners(provider, Owner("broker-a", "10.0.0.3:7600"))
    assert again.claim("refunds") and again.owner("refunds").address == "10.0.0.3:7600"


def test_damaged_owner_object_is_an_error_not_a_claim(provider: Provider) -> None:
    provider.write("owners/orders.json", b"{not json")
    owners = TopicOwners(provider, Owner("broker-a", "h:1"))
    with pytest.raises(TierError, match="damaged"):
        owners.claim("orders")
