"""A broker taken over restarts under its name, from outside: broker processes on
SeaweedFS's S3 with ``tier.failover`` and ``tier.durable_ack``.

Broker A owns topic ``pay``; kill -9 A; B takes A over by itself; A is started again with
its data directory on its old port while a client sends ``pay`` to that port from the
moment it can.  No send of ``pay`` is ever answered OK there (was: the gRPC server, the
timer and the revive threads started and topics were claimed before the lease existed;
in 5 of 6 runs A answered OK to a send before it exited, and that message was at no
broker).  A serves again under its name as a new incarnation (was: it exited 2, "start
this broker with an empty data directory under a new tier.broker_name", a crash loop
under a supervisor with fixed names): killed again and started with an empty data
directory, it waits for B to take its second life over and serves a third time; every
send either life answered OK is at B.  A broker started while S3 does not answer starts
once it does, within ``tier.start_timeout_s`` (was: it exited after the first lease
write timed out).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.v1 import broker_pb2 as pb
from cluster.lease import successor
from testkit.process import ServerProcess
from testkit.proxy import FaultProxy
from testkit.wait import wait_until
from tests.chronomq.test_failover import _settings
from tests.conftest import CREDS
from tiered.providers.s3 import S3Provider, S3Settings

# the bucket is set up first, so it is deleted after the broker processes are gone
pytestmark = pytest.mark.usefixtures("seaweed_bucket", "no_process_left")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_broker_restarted_after_its_takeover_serves_again_under_its_name(
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

    lives = [a, b]
    try:
        with ChronomqClient(a.target) as c:
            c.create_topic("pay", queue_count=2)
            first = [o.message_id for o in c.send([message("pay", b"before")]) if o.ok]
        a.kill9()
        wait_until(lambda: (s := successor(tier, "broker-a")) is not None
                   and s.broker == "broker-b", 60, "broker-b to take broker-a over")
        with ChronomqClient(b.target) as c:
            wait_until(lambda: "pay" in {t.name for t in c.list_topics()}, 60,
                       "broker-b to serve pay")
        sender = threading.Thread(target=hammer, name="hammer")
        sender.start()
        try:  # Given A taken over, When it starts again with its data directory
            again = ServerProcess(tmp_path / "a", *a_settings)
            lives.append(again)
            time.sleep(1.0)  # (an OK for pay later than the start would show up here)
        finally:
            stop.set()
            sender.join(30)
        assert not answered_ok, f"broker-a answered OK after its takeover: {answered_ok}"
        # Then it serves again, as its second life (tier prefix broker-a--1)
        with ChronomqClient(again.target) as c:
            assert "pay" not in {t.name for t in c.list_topics()}
            c.create_topic("pay2", queue_count=1)
            second = [o.message_id for o in c.send([message("pay2", b"second life")])
                      if o.ok]
        assert second and (tmp_path / "a" / "incarnations" / "0" / "commitlog").is_dir()
        # When its machine is lost and replaced with an empty disk under its name
        again.kill9()
        third = ServerProcess(tmp_path / "a-new-disk", *a_settings)
        lives.append(third)
        # Then B took its second life over first, and every OK of both lives is at B
        assert successor(tier, "broker-a--1") is not None
        with ChronomqClient(third.target) as c:
            c.create_topic("pay3", queue_count=1)
            assert all(o.ok for o in c.send([message("pay3", b"third life")]))
        with ChronomqClient(b.target) as c:
            got = {m.message_id for topic in ("pay", "pay2")
                   for m in _drain(c, topic)}
        assert {*first, *second} <= got, f"lost: {sorted({*first, *second} - got)}"
    finally:
        for p in lives:
            if p.proc.poll() is None:
                p.kill9()


def _drain(c: ChronomqClient, topic: str) -> list[pb.ReceivedMessage]:
    got: list[pb.ReceivedMessage] = []
    while batch := c.pop(topic, "g", 32, 30, 500):
        got += batch
        c.ack("g", [m.receipt_handle for m in batch])
    return got


@pytest.mark.slow
def test_a_broker_started_while_s3_does_not_answer_starts_once_it_does(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    with FaultProxy(seaweed_endpoint) as proxy:
        proxy.set_mode("stall")  # S3 making its first volume: nothing comes back
        started: list[ServerProcess] = []
        failed: list[BaseException] = []

        def start() -> None:
            try:
                started.append(ServerProcess(
                    tmp_path / "a", *_settings(proxy.endpoint, seaweed_bucket, "broker-a")))
            except BaseException as exc:  # reported below
                failed.append(exc)
        starter = threading.Thread(target=start, name="starter")
        starter.start()
        time.sleep(4.0)  # several lease writes time out (each wait: lease_s / 6)
        assert not started and not failed, "started, or gave up, while S3 was silent"
        proxy.set_mode("pass")
        starter.join(90)
        assert not failed, f"the broker gave up: {failed[0]}"
        (a,) = started
        try:
            with ChronomqClient(a.target) as c:
                c.create_topic("t", queue_count=1)
                assert all(o.ok for o in c.send([message("t", b"x")]))
        finally:
            a.kill9()


@pytest.mark.slow
def test_a_lone_broker_replaced_with_an_empty_disk_takes_its_old_self_over(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    """One broker, no survivor to take it over: started again with an empty data
    directory it claims its old life once that lease expired (two leases unchanged) and
    takes it over itself (was: it refused, and with no survivor nothing ever took the old
    life over: a crash loop, its topics stranded)."""
    settings = _settings(seaweed_endpoint, seaweed_bucket, "broker-a")
    a = ServerProcess(tmp_path / "a", *settings)
    with ChronomqClient(a.target) as c:
        c.create_topic("pay", queue_count=1)
        sent = [o.message_id for o in c.send([message("pay", b"before")]) if o.ok]
    a.kill9()
    again = ServerProcess(tmp_path / "a-new-disk", *settings)
    try:
        with ChronomqClient(again.target) as c:
            wait_until(lambda: "pay" in {t.name for t in c.list_topics()}, 60,
                       "broker-a--1 to take its old life over")

            def popped() -> list[str] | None:
                try:
                    return [m.message_id for m in _drain(c, "pay")]
                except RpcError as exc:  # UNAVAILABLE while its leases are adopted
                    if exc.code != grpc.StatusCode.UNAVAILABLE:
                        raise
                    return None
            assert wait_until(popped, 60, "the takeover's adoption") == sent
    finally:
        again.kill9()
