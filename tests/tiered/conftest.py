"""Fixtures of the tier tests: one real provider of each kind."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from tests.conftest import CREDS, create_bucket
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider
from tiered.providers.s3 import S3Provider, S3Settings


def s3_provider(endpoint: str, bucket: str, prefix: str = "broker-a") -> S3Provider:
    """A new bucket on ``endpoint`` (moto's S3 server) and a provider for it."""
    create_bucket(endpoint, bucket)
    return S3Provider(S3Settings(bucket=bucket, prefix=prefix, endpoint_url=endpoint, **CREDS))


@pytest.fixture(params=["memory", "local", "s3"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Provider:
    if request.param == "memory":
        return MemoryProvider()
    if request.param == "local":
        return LocalProvider(str(tmp_path / "tier"))
    endpoint = request.getfixturevalue("s3_endpoint")
    return s3_provider(endpoint, f"b-{zlib.crc32(request.node.nodeid.encode())}")
