"""Topic ownership in the shared tier: ``Provider.create`` (a conditional put) on every
provider, including moto's S3 server, and ``TopicOwners`` on top of it: its release and
take-over conditional on the version read (raced on the providers whose conditional
writes are atomic, SeaweedFS's S3 among them), a successor's release of a departed
broker's unfinished claims."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cluster.ownership import Owner, TopicOwners
from tests.conftest import CREDS
from tiered.errors import TierError
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider
from tiered.providers.s3 import S3Provider, S3Settings


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


@pytest.fixture(params=["memory", "local", "seaweed"])
def atomic(request: pytest.FixtureRequest, tmp_path: Path) -> Provider:
    """A provider whose conditional writes are atomic (moto's are not): the races below
    are proven there, not just exercised."""
    if request.param == "memory":
        return MemoryProvider()
    if request.param == "local":
        return LocalProvider(str(tmp_path / "tier"))
    return S3Provider(S3Settings(bucket=request.getfixturevalue("seaweed_bucket"),
                                 endpoint_url=request.getfixturevalue("seaweed_endpoint"),
                                 **CREDS))


def test_a_release_never_deletes_a_claim_made_since_it_read(atomic: Provider) -> None:
    """Broker a releases its claim while broker b takes the topic over from it (a as the
    departed broker): whichever comes first, a record b wrote is never deleted."""
    a = TopicOwners(atomic, Owner("broker-a", "h:1"))
    b = TopicOwners(atomic, Owner("broker-b", "h:2"))
    for round_ in range(12):
        topic = f"t{round_}"
        assert a.claim(topic)
        gate = threading.Barrier(2)
        took: list[bool] = []

        def release(gate: threading.Barrier = gate, topic: str = topic) -> None:
            gate.wait()
            a.release(topic)

        def take(gate: threading.Barrier = gate, topic: str = topic,
                 took: list[bool] = took) -> None:
            gate.wait()
            took.append(b.take_over(topic, "broker-a"))

        threads = [threading.Thread(target=release), threading.Thread(target=take)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Then b's record stands once b took it over (never released by a)
        owner = a.owner(topic)
        assert took == [True] and owner is not None and owner.broker == "broker-b"


def test_a_successor_releases_the_departed_brokers_unfinished_claims(
        provider: Provider) -> None:
    departed = TopicOwners(provider, Owner("broker-a", "h:1"))
    other = TopicOwners(provider, Owner("broker-c", "h:3"))
    successor = TopicOwners(provider, Owner("broker-b", "h:2"))
    for topic in ("kept", "unfinished", "deleted"):
        assert departed.claim(topic)
    assert other.claim("elsewhere")
    # When b takes broker-a over, taking only "kept" (its catalogue's)
    assert successor.take_over("kept", "broker-a")
    released = successor.release_departed("broker-a", {"kept"})
    # Then the others a claimed are free again; nobody else's is touched
    assert sorted(released) == ["deleted", "unfinished"]
    assert {t: o.broker for t, o in successor.topics().items()} == {
        "kept": "broker-b", "elsewhere": "broker-c"}
    assert other.claim("unfinished")
