"""One contract for every tier Provider: memory, a local directory, and S3 over HTTP on
127.0.0.1 against moto's server and against SeaweedFS (a real S3 server, whose
conditional PUTs are atomic: one winner of a race is proven there, not just exercised).
Then the S3 provider's conditional writes when S3 misbehaves, through a fault proxy in
front of SeaweedFS: a lost answer, 409 ConditionalRequestConflict."""

from __future__ import annotations

import contextlib
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from testkit.proxy import _CHUNK, FaultProxy, _hard_close
from tests.conftest import CREDS
from tests.tiered.conftest import s3_provider
from tiered.errors import (
    TierBadPath,
    TierError,
    TierNotFound,
    TierOutcomeUnknown,
    TierUnavailable,
)
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider
from tiered.providers.s3 import DELETE_BATCH, S3Provider, S3Settings


@pytest.fixture(params=["memory", "local", "s3", "seaweed"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Provider:
    """``tests/tiered/conftest.py``'s providers (``s3``: moto), and S3 on SeaweedFS."""
    if request.param == "memory":
        return MemoryProvider()
    if request.param == "local":
        return LocalProvider(str(tmp_path / "tier"))
    if request.param == "seaweed":
        return S3Provider(S3Settings(bucket=request.getfixturevalue("seaweed_bucket"),
                                     prefix="broker-a",
                                     endpoint_url=request.getfixturevalue("seaweed_endpoint"),
                                     **CREDS))
    endpoint = request.getfixturevalue("s3_endpoint")
    return s3_provider(endpoint, f"b-{zlib.crc32(request.node.nodeid.encode())}")


def _atomic(request: pytest.FixtureRequest) -> bool:
    """Are this provider's conditional writes atomic?  Not moto's: it checks the
    condition and writes in two steps, so two racers can both win there."""
    return bool(request.node.callspec.params["provider"] != "s3")


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
    assert provider.list("t1/q") == ["t1/q0/0", "t1/q0/1", "t1/q1/2"]  # part of a name
    assert provider.list("t") == provider.list()
    assert provider.list("t1/q0/1") == ["t1/q0/1"]


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


def test_delete_many_removes_each_in_batches_and_ignores_missing(provider: Provider) -> None:
    paths = [f"d/{i:05d}" for i in range(DELETE_BATCH + 5)]  # two requests on S3
    for p in paths[::7]:  # some only: the others are missing
        provider.write(p, b"x")
    provider.write("keep", b"k")
    provider.delete_many(paths)
    provider.delete_many([])
    assert provider.list("d/") == [] and provider.read("keep") == b"k"


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
    """The conditional replace broker leases are made of (``cluster.lease``)."""
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


def test_list_versions_names_the_version_a_read_gives(provider: Provider) -> None:
    """One listing tells which objects changed since a read (the lease watch reads
    only those again): its version of each object is the one ``read_versioned`` and
    ``swap`` give, and a swap from it succeeds."""
    assert provider.list_versions("brokers/") == {}
    first = provider.swap("brokers/a.json", b"a1", "")
    second = provider.swap("brokers/b.json", b"b1", "")
    provider.write("brokers2/c.json", b"c")  # outside the prefix
    assert first is not None and second is not None
    assert provider.list_versions("brokers/") == {"brokers/a.json": first,
                                                  "brokers/b.json": second}
    data, version = provider.read_versioned("brokers/a.json")
    assert data == b"a1"
    assert provider.list_versions("brokers/")["brokers/a.json"] == version
    renewed = provider.swap("brokers/a.json", b"a2", version)
    assert renewed is not None
    listed = provider.list_versions("brokers/")
    assert listed["brokers/a.json"] == renewed != version
    assert listed["brokers/b.json"] == second
    assert provider.swap("brokers/b.json", b"b2", listed["brokers/b.json"]) is not None
    # a listing from a key on names only the keys that sort after it (the tail of a
    # stream of objects: ``cluster.warmup``)
    assert list(provider.list_versions("brokers/", "brokers/a.json")) == ["brokers/b.json"]
    assert list(provider.list_versions("brokers/", "brokers/a")) == ["brokers/a.json",
                                                                     "brokers/b.json"]
    assert provider.list_versions("brokers/", "brokers/b.json") == {}


def test_of_racing_swaps_from_one_version_one_wins(provider: Provider,
                                                   request: pytest.FixtureRequest) -> None:
    for r in range(3):
        provider.write("brokers/b.json", b"base %d" % r)
        _, version = provider.read_versioned("brokers/b.json")

        def swap(n: int, r: int = r, version: str = version) -> bool:
            return provider.swap("brokers/b.json", b"%d by %d" % (r, n), version) is not None
        won = _race(8, swap)
        assert len(won) == 1 if _atomic(request) else len(won) >= 1
        assert provider.read("brokers/b.json") in [b"%d by %d" % (r, n) for n in won]


def test_delete_if_removes_only_the_version_it_read(provider: Provider) -> None:
    """The conditional delete an owner's release is made of (``cluster.ownership``):
    a claim another broker made meanwhile is never removed."""
    provider.write("owners/t.json", b"mine")
    _, mine = provider.read_versioned("owners/t.json")
    # Given another writer replaced the object since it was read
    provider.write("owners/t.json", b"theirs")
    # Then a delete at the version read removes nothing
    assert provider.delete_if("owners/t.json", mine) is False
    assert provider.read("owners/t.json") == b"theirs"
    # and one at the current version removes it, once
    _, theirs = provider.read_versioned("owners/t.json")
    assert provider.delete_if("owners/t.json", theirs) is True
    assert not provider.exists("owners/t.json")
    assert provider.delete_if("owners/t.json", theirs) is False  # gone: not at it
    assert provider.delete_if("owners/none.json", "") is False
    assert provider.list("owners/") == []  # no lock files listed
    # a version a swap returned is one too
    new = provider.swap("owners/t.json", b"again", "")
    assert new is not None and provider.delete_if("owners/t.json", new) is True


def test_of_a_racing_delete_if_and_swap_from_one_version_one_wins(
        provider: Provider, request: pytest.FixtureRequest) -> None:
    for r in range(3):
        provider.write("owners/r.json", b"base %d" % r)
        _, version = provider.read_versioned("owners/r.json")

        def attempt(n: int, version: str = version) -> bool:
            if n % 2:
                return provider.delete_if("owners/r.json", version)
            return provider.swap("owners/r.json", b"by %d" % n, version) is not None
        won = _race(6, attempt)
        assert len(won) == 1 if _atomic(request) else len(won) >= 1
        if _atomic(request):
            assert provider.exists("owners/r.json") == (won[0] % 2 == 0)


def test_of_racing_creates_one_wins(provider: Provider, request: pytest.FixtureRequest) -> None:
    """What topic ownership is made of (``cluster.ownership``)."""
    for r in range(3):

        def create(n: int, r: int = r) -> bool:
            return provider.create(f"owners/t{r}", b"by %d" % n)
        won = _race(8, create)
        assert len(won) == 1 if _atomic(request) else len(won) >= 1
        assert provider.read(f"owners/t{r}") in [b"by %d" % n for n in won]


def _race(racers: int, attempt: Callable[[int], bool]) -> list[int]:
    """Start ``attempt(n)`` in ``racers`` threads at once; the ``n`` that got True."""
    won: list[int] = []
    gate = threading.Barrier(racers)

    def race(n: int) -> None:
        gate.wait()
        if attempt(n):
            won.append(n)
    threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


# ---------------------------------------------------------------- S3 servers differ


@pytest.mark.parametrize("server, status, code", [("moto", 404, "NoSuchKey"),
                                                  ("seaweed", 412, "PreconditionFailed")])
def test_if_match_on_a_missing_key(server: str, status: int, code: str,
                                   request: pytest.FixtureRequest) -> None:
    """AWS answers 404 NoSuchKey (moto too), SeaweedFS 412: either is "not at that
    version" to the provider."""
    if server == "moto":
        endpoint, bucket = request.getfixturevalue("s3_endpoint"), "if-match-missing"
        s3_provider(endpoint, bucket)  # creates the bucket
    else:
        endpoint = request.getfixturevalue("seaweed_endpoint")
        bucket = request.getfixturevalue("seaweed_bucket")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=CREDS["access_key_id"],
                      aws_secret_access_key=CREDS["secret_access_key"])
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="none", Body=b"x", IfMatch='"0123"')
    error, meta = refused.value.response["Error"], refused.value.response["ResponseMetadata"]
    assert (meta["HTTPStatusCode"], error.get("Code")) == (status, code)
    tier = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint, **CREDS))
    assert tier.swap("none", b"x", '"0123"') is None
    assert not tier.exists("none")


def test_seaweed_refuses_a_put_to_a_missing_bucket_with_403(seaweed_endpoint: str) -> None:
    """AWS (and moto): 404 NoSuchBucket.  Either is a TierError, not a missing object."""
    tier = S3Provider(S3Settings(bucket="no-such-bucket", endpoint_url=seaweed_endpoint,
                                 **CREDS))
    with pytest.raises(TierError) as refused:
        tier.write("a", b"x")
    assert "AccessDenied" in str(refused.value)
    assert not isinstance(refused.value, TierNotFound | TierUnavailable)


# ---------------------------------------------------- conditional writes under faults


class PutFaults(FaultProxy):
    """The fault proxy (``testkit/proxy.py``) with two faults for the next ``n``
    PutObject requests that open a connection (a new provider's first request does;
    requests on a connection open before are not looked at); every other request goes
    through:

    ``lose_answers(n)``          the PUT goes through and is applied, its answer is
                                 dropped and the connection reset: a lost response,
                                 which botocore retries;
    ``refuse(n, status, code)``  the PUT is answered at once with that S3 error and
                                 never forwarded.

    (A subclass here, not modes of ``FaultProxy``: that file has another owner.)"""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._faults: list[tuple[int, str]] = []  # (0, "") loses an answer
        self.methods = (b"PUT ",)  # the requests the faults are for (b"DELE": DELETEs)
        self.lost = 0
        self.refused = 0

    def lose_answers(self, n: int) -> None:
        with self._lock:
            self._faults = [(0, "")] * n

    def refuse(self, n: int, status: int, code: str) -> None:
        with self._lock:
            self._faults = [(status, code)] * n

    def _pipe(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            start = client.recv(4, socket.MSG_PEEK | socket.MSG_WAITALL)
            with self._lock:
                fault = self._faults.pop(0) if start in self.methods and self._faults \
                    else None
            if fault is None:
                super()._pipe(client)
            elif fault[0]:
                self._refuse(client, *fault)
            else:
                self._lose_answer(client)
        _hard_close(client)

    def _lose_answer(self, client: socket.socket) -> None:
        """Forward the request and any "100 Continue"; drop the final answer."""
        upstream = socket.create_connection(self._upstream, timeout=10)
        self._track(client, upstream)
        threading.Thread(target=self._pump, args=(client, upstream), name="proxy-pump",
                         daemon=True).start()
        answer = b""
        while data := upstream.recv(_CHUNK):
            answer += data
            while answer.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in answer:
                interim, _, answer = answer.partition(b"\r\n\r\n")
                client.sendall(interim + b"\r\n\r\n")
            if len(answer) >= 10 and not answer.startswith(b"HTTP/1.1 1"):
                with self._lock:
                    self.lost += 1  # S3 answered: the PUT was applied (or refused)
                break
        # SHUT_RD wakes the pump reading the client (a close alone would wait for it);
        # the close with SO_LINGER 0 then resets the connection
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RD)
        _hard_close(client)
        _hard_close(upstream)

    def _refuse(self, client: socket.socket, status: int, code: str) -> None:
        """Read the request head (and its body, unless it waits for 100-continue) and
        answer it with an S3 error."""
        head = b""
        while b"\r\n\r\n" not in head and (data := client.recv(_CHUNK)):
            head += data
        head, _, body = head.partition(b"\r\n\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(b":") for line in head.split(b"\r\n")[1:])}
        if fields.get(b"expect", b"").lower() != b"100-continue":
            left = int(fields.get(b"content-length", b"0")) - len(body)
            while left > 0 and (data := client.recv(min(left, _CHUNK))):
                left -= len(data)
        text = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                "<Message>injected by the fault proxy</Message></Error>").encode()
        client.sendall(b"HTTP/1.1 %d Refused\r\nContent-Type: application/xml\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                       % (status, len(text), text))
        with self._lock:
            self.refused += 1


@pytest.fixture
def faults(seaweed_endpoint: str) -> Iterator[PutFaults]:
    proxy = PutFaults(seaweed_endpoint)
    yield proxy
    proxy.close()


@pytest.fixture
def direct(seaweed_endpoint: str, seaweed_bucket: str) -> S3Provider:
    """The bucket straight, not through the proxy: to set up and to look."""
    return S3Provider(S3Settings(bucket=seaweed_bucket, endpoint_url=seaweed_endpoint,
                                 access_key_id=CREDS["access_key_id"],
                                 secret_access_key=CREDS["secret_access_key"]))


def _behind(faults: PutFaults, direct: S3Provider,
            max_attempts: int = 3) -> tuple[S3Provider, list[str]]:
    """A new provider (no connection open yet) reaching ``direct``'s bucket through the
    proxy, and the S3 calls it makes."""
    tier = S3Provider(replace(direct.settings, endpoint_url=faults.endpoint,
                              max_attempts=max_attempts))
    calls: list[str] = []
    tier.on_request(calls.append)
    return tier, calls


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_a_swap_whose_answer_was_lost_is_an_unknown_outcome(
        faults: PutFaults, direct: S3Provider, max_attempts: int) -> None:
    direct.write("brokers/a.json", b"epoch 1")
    _, version = direct.read_versioned("brokers/a.json")
    # Given S3 applies the next swap but its answer never arrives
    faults.lose_answers(1)
    tier, calls = _behind(faults, direct, max_attempts)
    # When the swap is made: botocore retries it (If-Match: the version it replaced) and
    # gets 412, or with no retries left gets no answer at all
    with pytest.raises(TierOutcomeUnknown, match="read it back and compare"):
        tier.swap("brokers/a.json", b"epoch 2", version)
    # Then it is not reported as a swap lost to another writer: it was this one
    assert (faults.lost, calls) == (1, ["PutObject"])
    assert direct.read_versioned("brokers/a.json")[0] == b"epoch 2"


def test_a_create_whose_answer_was_lost_is_an_unknown_outcome(
        faults: PutFaults, direct: S3Provider) -> None:
    faults.lose_answers(1)
    with pytest.raises(TierOutcomeUnknown):
        _behind(faults, direct)[0].create("owners/orders", b"broker-a")
    assert faults.lost == 1 and direct.read("owners/orders") == b"broker-a"
    assert _behind(faults, direct)[0].create("owners/orders", b"broker-b") is False


def test_conditional_request_conflict_is_retried_not_taken_for_a_conflict(
        faults: PutFaults, direct: S3Provider) -> None:
    """S3 answers 409 ConditionalRequestConflict to concurrent conditional writes; AWS
    says retry."""
    direct.write("brokers/a.json", b"epoch 1")
    _, version = direct.read_versioned("brokers/a.json")
    faults.refuse(2, 409, "ConditionalRequestConflict")
    tier, calls = _behind(faults, direct)
    new = tier.swap("brokers/a.json", b"epoch 2", version)
    assert new is not None and calls == ["PutObject"] * 3 and faults.refused == 2
    assert direct.read_versioned("brokers/a.json") == (b"epoch 2", new)
    # a 409 that persists is S3 unavailable (retry later), still not a conflict
    faults.refuse(10, 409, "ConditionalRequestConflict")
    tier, calls = _behind(faults, direct)
    with pytest.raises(TierUnavailable, match="ConditionalRequestConflict") as busy:
        tier.swap("brokers/a.json", b"epoch 3", new)
    assert type(busy.value) is TierUnavailable and calls == ["PutObject"] * 4
    assert direct.read_versioned("brokers/a.json") == (b"epoch 2", new)


def test_a_delete_if_whose_answer_was_lost_is_an_unknown_outcome(
        faults: PutFaults, direct: S3Provider) -> None:
    """A conditional delete S3 applied, its answer lost: botocore's retry finds the
    object gone (412), which is no refusal of this delete; the owner reads it back."""
    direct.write("owners/orders.json", b"broker-a")
    _, version = direct.read_versioned("owners/orders.json")
    faults.methods = (b"DELE",)
    faults.lose_answers(1)
    tier, calls = _behind(faults, direct)
    with pytest.raises(TierOutcomeUnknown):
        tier.delete_if("owners/orders.json", version)
    assert faults.lost == 1 and calls == ["DeleteObject"]
    assert not direct.exists("owners/orders.json")
