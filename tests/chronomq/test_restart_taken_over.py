"""No OK before the lease, from outside: broker processes on SeaweedFS's S3 with
``tier.failover`` and ``tier.durable_ack``.

Broker A owns topic ``pay``; kill -9 A; B takes A over by itself; A is started again with
its data directory on its old port while a client sends to that port from the moment it
can.  A must refuse to start before it opens the port (its lease says it was taken over):
no send is ever answered OK there (was: the gRPC server, the timer and the revive
threads started and topics were claimed before the lease existed; in 5 of 6 runs A
answered OK to a send before it exited, and that message was at no broker).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError, message
from cluster.lease import successor
from tests.chronomq.process import ServerProcess
from tests.chronomq.test_failover import _settings
from tests.conftest import CREDS, wait_until
from tiered.providers.s3 import S3Provider, S3Settings

# the bucket is set up first, so it is deleted after the broker processes are gone
pytestmark = pytest.mark.usefixtures("seaweed_bucket", "no_process_left")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_broker_restarted_after_its_takeover_answers_nothing(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    port = _free_port()
    a_settings = [*_settings(endpoint, bucket, "broker-a"), f"server.port={port}"]
    a = ServerProcess(tmp_path / "a", *a_settings)
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b"))
    tier = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint, **CREDS))
    answered_ok: list[str] = []
    stop = threading.Event()

    def hammer() -> None:  # a client of A's old address, sending all along
        i = 0
        while not stop.is_set():
            i += 1
            try:
                with ChronomqClient(f"127.0.0.1:{port}", timeout_s=2) as c:
                    out = c.send([message("pay", b"x", message_id=f"H{i:06d}")])
                answered_ok.extend(o.message_id for o in out if o.ok)
            except (RpcError, OSError):
                time.sleep(0.005)

    try:
        with ChronomqClient(a.target) as c:
            c.create_topic("pay", queue_count=2)
            assert all(o.ok for o in c.send([message("pay", b"before")]))
        a.kill9()
        wait_until(lambda: (s := successor(tier, "broker-a")) is not None
                   and s.broker == "broker-b", 60, "broker-b to take broker-a over")
        with ChronomqClient(b.target) as c:
            wait_until(lambda: "pay" in {t.name for t in c.list_topics()}, 60,
                       "broker-b to serve pay")
        sender = threading.Thread(target=hammer, name="hammer")
        sender.start()
        try:
            with pytest.raises(RuntimeError, match="taken over by broker-b"):
                ServerProcess(tmp_path / "a", *a_settings)
            time.sleep(1.0)  # (a refusal later than the start would show up here)
        finally:
            stop.set()
            sender.join(30)
        assert not answered_ok, f"broker-a answered OK after its takeover: {answered_ok}"
    finally:
        for p in (a, b):
            if p.proc.poll() is None:
                p.kill9()
