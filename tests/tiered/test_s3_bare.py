"""The S3 provider's reads and writes as bare signed requests
(``tiered.providers.s3bare``), against real S3 servers on 127.0.0.1 (SeaweedFS, and
moto's where it differs) and the fault proxy in front of SeaweedFS: what boto3 reads is
what was written, for every range and awkward key; the same outcomes (missing key, past
the end, a missing bucket, a refusal, an S3 that stalls, resets or answers 503); every
request counted."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import boto3
import pytest

from testkit.proxy import FaultProxy
from tests.conftest import CREDS, create_bucket
from tiered.errors import TierError, TierNotFound, TierUnavailable
from tiered.providers.s3 import S3Provider, S3Settings

KEYS = ["plain/00000000000000000001", "%RETRY%g%t/0/log/0", "a b+c=d&e;f,g@h:i$j!k'l(m)",
        "tilde~/ümlaut/日本", "q?x#y[1]{2}|3^4`5"]


def _provider(endpoint: str, bucket: str, **kw: object) -> S3Provider:
    return S3Provider(S3Settings(bucket=bucket, prefix="b0", endpoint_url=endpoint,
                                 **{**CREDS, **kw}))  # type: ignore[arg-type]


@pytest.fixture(params=["seaweed", "moto"])
def endpoint_bucket(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    if request.param == "seaweed":
        yield request.getfixturevalue("seaweed_endpoint"), \
            request.getfixturevalue("seaweed_bucket")
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"bare-{random.randrange(1 << 30)}"
    create_bucket(endpoint, bucket)
    yield endpoint, bucket


def test_reads_and_writes_are_bare_requests_for_an_s3_compatible_endpoint() -> None:
    assert _provider("http://127.0.0.1:1", "b")._bare is not None
    assert S3Provider(S3Settings(bucket="b", **CREDS))._bare is None  # AWS: boto3


def test_every_range_of_every_awkward_key_reads_as_boto3_reads_it(
        endpoint_bucket: tuple[str, str]) -> None:
    endpoint, bucket = endpoint_bucket
    p = _provider(endpoint, bucket)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=CREDS["access_key_id"],
                          aws_secret_access_key=CREDS["secret_access_key"])
    rnd = random.Random(7)
    for key in KEYS:
        data = bytes(rnd.randrange(256) for _ in range(3000))
        p.write(key, data)
        assert client.get_object(Bucket=bucket, Key=f"b0/{key}")["Body"].read() == data
        assert p.read(key) == data
        for _ in range(20):
            offset = rnd.randrange(3100)
            length = rnd.choice([-1, 0, 1, rnd.randrange(1, 4000)])
            want = data[offset:] if length < 0 else data[offset:offset + length]
            assert p.read(key, offset, length) == want, (key, offset, length)


def test_missing_keys_past_the_end_and_refusals(endpoint_bucket: tuple[str, str]) -> None:
    endpoint, bucket = endpoint_bucket
    p = _provider(endpoint, bucket)
    p.write("x", b"0123456789")
    assert p.read("x", 10) == b"" and p.read("x", 99, 5) == b""  # past the end
    with pytest.raises(TierNotFound):
        p.read("missing")
    with pytest.raises(TierNotFound):
        p.read("missing", 5, 5)
    # a bucket that is not there is a refusal, not a missing object
    with pytest.raises(TierError) as missing_bucket:
        _provider(endpoint, f"{bucket}-none").read("x")
    assert not isinstance(missing_bucket.value, TierNotFound | TierUnavailable)


def test_a_refusal_is_an_error_at_once_not_retried(seaweed_endpoint: str,
                                                   seaweed_bucket: str) -> None:
    # Given an S3 that answers 403 to every request (what bad credentials get)
    proxy = FaultProxy(seaweed_endpoint)
    try:
        p = _provider(proxy.endpoint, seaweed_bucket, max_attempts=3)
        p.write("x", b"data")
        proxy.set_mode("http", status=403)
        opened = proxy.connections
        # When a read is refused; Then it is an error naming the status, after one request
        with pytest.raises(TierError, match="403") as refused:
            p.read("x")
        assert not isinstance(refused.value, TierNotFound | TierUnavailable)
        with pytest.raises(TierError, match="403") as refused:
            p.write("x", b"other")
        assert not isinstance(refused.value, TierUnavailable)
        assert proxy.connections == opened + 2
    finally:
        proxy.close()


@pytest.mark.parametrize("mode", ["stall", "reset", "http"])
def test_an_s3_that_fails_is_unavailable_after_the_attempts(
        seaweed_endpoint: str, seaweed_bucket: str, mode: str) -> None:
    proxy = FaultProxy(seaweed_endpoint)
    try:
        p = _provider(proxy.endpoint, seaweed_bucket, read_timeout_s=0.5,
                      connect_timeout_s=0.5, max_attempts=2)
        p.write("x", b"data")
        assert p.read("x") == b"data"
        proxy.set_mode(mode)
        for request in (lambda: p.read("x"), lambda: p.write("y", b"more")):
            started = time.monotonic()
            with pytest.raises(TierUnavailable):
                request()
            assert time.monotonic() - started < 2 * 0.5 + 1 + 1  # two attempts, a back-off
        proxy.set_mode("pass")
        assert p.read("x") == b"data"  # and it reads and writes again once S3 answers
        p.write("y", b"more")
        assert p.read("y") == b"more"
    finally:
        proxy.close()


def test_every_bare_request_is_counted(seaweed_endpoint: str, seaweed_bucket: str) -> None:
    p = _provider(seaweed_endpoint, seaweed_bucket)
    seen: list[str] = []
    p.on_request(seen.append)
    p.write("x", b"data")
    p.read("x")
    p.read("x", 1, 2)
    assert seen == ["PutObject", "GetObject", "GetObject"]
