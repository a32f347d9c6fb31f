"""The Broker API over real gRPC on 127.0.0.1, against a real store."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.metrics import families
from chronomq.v1 import broker_pb2 as pb
from testkit.wait import wait_until
from tests.conftest import RunningServer, broker_config

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_send_pop_ack_round_trip(client: ChronomqClient) -> None:
    assert client.create_topic("orders", queue_count=2)
    out = client.send([message("orders", b"a", key="k1", tag="x", properties={"p": "1"}),
                       message("orders", b"b")])
    assert all(o.ok for o in out) and len({o.message_id for o in out}) == 2
    got = client.pop("orders", "billing", max_messages=10, invisible_time_s=30)
    assert sorted(m.body for m in got) == [b"a", b"b"]
    a = next(m for m in got if m.body == b"a")
    assert (a.key, a.tag, dict(a.properties), a.delivery_attempt) == ("k1", "x", {"p": "1"}, 1)
    assert a.message_id in {o.message_id for o in out}
    assert client.ack("billing", [m.receipt_handle for m in got]) == ["", ""]
    assert client.pop("orders", "billing") == []
    assert len(client.pop("orders", "audit")) == 2  # another group sees everything


def test_send_stream_answers_every_batch_in_order(client: ChronomqClient) -> None:
    client.create_topic("s")
    batches = [[message("s", f"{b}-{i}".encode()) for i in range(50)] for b in range(20)]
    answers = list(client.send_stream(batches))
    assert [len(a) for a in answers] == [50] * 20
    assert all(o.ok for a in answers for o in a)
    seen = 0
    while got := client.pop("s", "g", max_messages=32):
        seen += len(got)
        client.ack("g", [m.receipt_handle for m in got])
    assert seen == 1000


def test_per_message_errors_do_not_fail_the_batch(client: ChronomqClient,
                                                  server: RunningServer) -> None:
    client.create_topic("t")
    too_big = b"x" * (server.config.store.max_body_bytes + 1)
    out = client.send([message("t", b"ok"), message("nope", b"x"), message("t", b""),
                       message("t", too_big), message("t", b"x", delay_ms=-1),
                       message("t", b"x", delay_ms=11 * 366 * 86_400_000),
                       message("", b"x"),
                       message("t", b"x", properties={"big": "v" * (65 << 10)})])
    assert out[0].ok
    codes = [o.error_code for o in out[1:]]
    assert codes == [grpc.StatusCode.NOT_FOUND.value[0]] + [INVALID.value[0]] * 6
    assert "properties take" in out[7].error
    assert "does not exist" in out[1].error and "over the maximum" in out[3].error
    assert "maximum delay" in out[5].error
    assert len(client.pop("t", "g")) == 1  # only the good one was stored


def _code(fn: object, *args: object, **kw: object) -> grpc.StatusCode:
    with pytest.raises(RpcError) as err:
        fn(*args, **kw)  # type: ignore[operator]
    assert err.value.details  # every error says something a user can act on
    return err.value.code


def test_bad_input_on_every_rpc(client: ChronomqClient) -> None:
    client.create_topic("t")
    assert _code(client.create_topic, "") == INVALID
    assert _code(client.create_topic, "has space") == INVALID
    assert _code(client.create_topic, "t", queue_count=7) == grpc.StatusCode.ALREADY_EXISTS
    assert _code(client.create_topic, "q", queue_count=5000) == INVALID
    assert _code(client.delete_topic, "missing") == grpc.StatusCode.NOT_FOUND
    assert _code(client.send, []) == INVALID
    assert _code(client.pop, "", "g") == INVALID  # no topic can have that name
    assert _code(client.pop, "missing", "g") == grpc.StatusCode.NOT_FOUND
    assert _code(client.pop, "t", "") == INVALID
    assert _code(client.pop, "t", "g", max_messages=0) == INVALID
    assert _code(client.pop, "t", "g", max_messages=1000) == INVALID
    assert _code(client.pop, "t", "g", invisible_time_s=0) == INVALID
    assert _code(client.pop, "t", "g", tag_expression="a ||") == INVALID
    assert _code(client.ack, "g", []) == INVALID
    errors = client.ack("g", ["not-a-handle", "", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"])
    assert all("receipt handle" in e for e in errors)
    assert _code(client.query, "t") == INVALID
    assert _code(client.query, "missing", key="k") == grpc.StatusCode.NOT_FOUND
    assert _code(client.query, message_id="\x01bad") == INVALID
    assert _code(client.change_invisible_time, "g", "x", 10) == INVALID
    assert _code(client.change_invisible_time, "g", "x", 12 * 3600 + 1) == INVALID
    assert _code(client.nack, "g", []) == INVALID
    assert "receipt handle" in client.nack("g", ["junk"])[0]
    assert _code(client.dead_letter, "g", []) == INVALID
    assert _code(client.cancel, "") == INVALID
    assert _code(client.cancel, "bad\x01id") == INVALID
    assert _code(client.reschedule, "x") == INVALID  # no time given
    assert _code(client.reschedule, "x", delay_ms=-5) == INVALID
    assert _code(client.reschedule, "x", delay_ms=11 * 366 * 86_400_000) == INVALID
    # the broker still works after all of that
    client.send_one("t", b"still fine")
    assert len(client.pop("t", "g")) == 1


def test_cross_group_and_expired_acks(client: ChronomqClient) -> None:
    client.create_topic("t")
    client.send_one("t", b"x")
    (m,) = client.pop("t", "g1", invisible_time_s=1)
    (err,) = client.ack("g2", [m.receipt_handle])
    assert "another group" in err


def test_query_by_key_and_id(client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("t")
    mid = client.send_one("t", b"one", key="order-9")
    client.send_one("t", b"two", key="order-9")
    dispatcher = server.server.broker.store.dispatcher
    assert dispatcher is not None
    assert dispatcher.wait_dispatched(server.server.broker.store.commitlog.confirmed_offset, 5)
    assert [m.body for m in client.query("t", key="order-9")] == [b"one", b"two"]
    assert [m.body for m in client.query(message_id=mid)] == [b"one"]
    assert client.query(message_id="0" * 32) == []


def test_long_poll_wakes_on_send(client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("lp")
    result: list[pb.ReceivedMessage] = []

    def consumer() -> None:
        with server.client() as c:
            result.extend(c.pop("lp", "g", wait_ms=5000))

    t = threading.Thread(target=consumer)
    t.start()
    wait_until(lambda: client.stats()["rpc.parked_long_polls"] == 1, 5, "the Pop to park",
               show=lambda: client.stats()["rpc.parked_long_polls"])
    client.send_one("lp", b"wake")
    t.join(10)
    assert [m.body for m in result] == [b"wake"]


def test_long_poll_returns_empty_at_its_deadline(client: ChronomqClient) -> None:
    client.create_topic("lp2")
    assert client.pop("lp2", "g", wait_ms=200) == []


def test_stats_health_and_reflection(client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("t")
    client.send_one("t", b"x")
    figures = client.stats()
    assert figures["store.topics"] == 1 and figures["rpc.sent"] == 1
    with grpc.insecure_channel(server.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        resp = health.Check(health_pb2.HealthCheckRequest(service="chronomq.v1.Broker"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        answers = list(refl.ServerReflectionInfo(iter(
            [reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in answers[0].list_services_response.service}
        assert "chronomq.v1.Broker" in names


def test_bearer_token_auth(tmp_path: Path) -> None:
    srv = RunningServer(broker_config(tmp_path / "d", auth_token="s3cret"))
    try:
        with srv.client() as anon:
            assert _code(anon.list_topics) == grpc.StatusCode.UNAUTHENTICATED
        with srv.client(token="wrong") as bad:
            assert _code(bad.list_topics) == grpc.StatusCode.UNAUTHENTICATED
        with srv.client(token="s3cret") as good:
            assert good.create_topic("t")
            assert [t.name for t in good.list_topics()] == ["t"]
    finally:
        srv.stop()


def test_graceful_restart_keeps_everything(tmp_path: Path) -> None:
    srv = RunningServer(broker_config(tmp_path / "d"))
    with srv.client() as c:
        c.create_topic("t")
        ids = {c.send_one("t", f"{i}".encode()) for i in range(20)}
    srv.stop()
    srv = RunningServer(broker_config(tmp_path / "d"))
    try:
        with srv.client() as c:
            got = c.pop("t", "g", max_messages=32)
            assert {m.message_id for m in got} == ids
    finally:
        srv.stop()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    srv = RunningServer(broker_config(tmp_path / "d", tls_cert_file=str(cert),
                                      tls_key_file=str(key)))
    try:
        with ChronomqClient(srv.target, tls_ca_file=str(cert)) as c:
            assert c.create_topic("t")
        with ChronomqClient(srv.target, timeout_s=2) as plain, pytest.raises(RpcError):
            plain.list_topics()
    finally:
        srv.stop()


def test_prometheus_metrics_endpoint(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = RunningServer(broker_config(tmp_path / "d", metrics_port=port))
    try:
        with srv.client() as c:
            c.create_topic("t")
            c.create_topic("u")
            c.send_one("t", b"x")
            c.send_one("u", b"y")
            for group in ("g1", "g2"):
                got = c.pop("t", group, 1, 30, 0)
                c.ack(group, [m.receipt_handle for m in got])
            c.pop("u", "g1", 1, 30, 0)  # left in flight
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in text.splitlines() if line and not line.startswith("#")}
        # counters end in _total; gauges do not
        assert samples["chronomq_rpc_sent_total"] == 2
        assert re.search(r"# TYPE chronomq_rpc_sent(_total)? counter", text)
        assert samples["chronomq_store_topics"] == 2
        # one family per quantity, group and topic as labels
        assert samples['chronomq_group_in_flight_messages{group="g1",topic="u"}'] == 1
        assert samples['chronomq_group_lag_messages{group="g2",topic="t"}'] == 0
        assert text.count("# TYPE chronomq_group_lag_messages gauge") == 1
        assert not any("g1" in name.split("{")[0] for name in samples)
        # the timer's lateness is one cumulative histogram in seconds
        assert 'chronomq_timer_lateness_seconds_bucket{le="+Inf"}' in samples
        assert "# TYPE chronomq_timer_lateness_seconds histogram" in text
        assert not any(name.endswith("_ms") for name in samples)
    finally:
        srv.stop()


def test_takeover_and_mount_figures_are_families_with_the_broker_as_a_label() -> None:
    """Seen on /metrics: a family per departed or mounted broker
    (``chronomq_takeover_broker_a_pending``), which no dashboard can sum or alert on
    across brokers."""
    figures = {"takeover.broker-a.pending": 5, "takeover.broker-b.pending": 7,
               "takeover.broker-a.journal_seconds": 1.5, "takeover.broker-a.seconds": 3,
               "mount.old.topics": 2}
    by_name = {m.name: m for m in families(figures)}
    assert set(by_name) == {"chronomq_takeover_pending", "chronomq_takeover_journal_seconds",
                            "chronomq_takeover_seconds", "chronomq_mount_topics"}
    pending = by_name["chronomq_takeover_pending"]
    assert sorted((s.labels["broker"], s.value) for s in pending.samples) == [
        ("broker-a", 5), ("broker-b", 7)]
    assert by_name["chronomq_mount_topics"].samples[0].labels == {"broker": "old"}


def test_a_topic_created_again_accepts_the_ids_the_deleted_one_had(
        client: ChronomqClient, server: RunningServer) -> None:
    """A purge (DeleteTopic, CreateTopic): the new topic is not the old one, so an id
    the old one accepted is a new message there, whether remembered in memory or found
    in the key index (after a restart)."""
    client.create_topic("p")
    assert not client.send([message("p", b"old", message_id="purged-1")])[0].duplicate
    assert server.server.broker.store.wait_visible(5)
    client.delete_topic("p")
    client.create_topic("p")
    (again,) = client.send([message("p", b"new", message_id="purged-1")])
    assert again.ok and not again.duplicate
    assert [m.body for m in client.pop("p", "g", 32)] == [b"new"]
    store = server.server.broker.store
    assert store.wait_visible(5)
    # the key index has both records: only the new topic's counts
    client.delete_topic("p")
    client.create_topic("p")
    assert store.stored_at([("p", "purged-1")]) == [None]


def test_a_client_chosen_id_sent_again_within_the_window_is_dropped(
        client: ChronomqClient, server: RunningServer) -> None:
    client.create_topic("d")
    first = client.send([message("d", b"a", message_id="replay-1"),
                         message("d", b"later", message_id="replay-2", delay_ms=60_000),
                         message("d", b"c")])
    assert [(o.ok, o.duplicate) for o in first] == [(True, False)] * 3
    again = client.send([message("d", b"a", message_id="replay-1"),
                         message("d", b"later", message_id="replay-2", delay_ms=60_000),
                         message("d", b"new", message_id="replay-3")])
    assert [(o.message_id, o.duplicate) for o in again] == [
        ("replay-1", True), ("replay-2", True), ("replay-3", False)]
    got = client.pop("d", "g", max_messages=32)
    assert sorted(m.body for m in got) == [b"a", b"c", b"new"]  # the delayed one is not due
    assert [o.duplicate for o in client.send(  # twice in one request: once
        [message("d", b"x", message_id="replay-4")] * 2)] == [False, True]
    # the ids are in the key index too, which outlives the in-memory set (restarts)
    broker = server.server.broker
    assert broker.store.wait_visible(5)
    stored = broker.store.stored_at([("d", "replay-2"), ("d", "replay-4"),
                                     ("d", "never-sent"), ("other", "replay-4")])
    assert stored[0] is not None and stored[1] is not None  # replay-2 is delayed
    assert stored[2] is None and stored[3] is None
    # ids are per topic: the same id sent to another topic is a new message
    client.create_topic("d2")
    assert [o.duplicate for o in client.send([message("d2", b"a", message_id="replay-1")])] \
        == [False]


def test_pop_with_a_tag_expression(client: ChronomqClient) -> None:
    client.create_topic("tags")
    client.send([message("tags", t.encode() or b"none", tag=t) for t in ("a", "b", "c", "")])
    got = client.pop("tags", "ab", max_messages=10, tag_expression="a || b")
    assert sorted(m.tag for m in got) == ["a", "b"]
    assert len(client.pop("tags", "all", max_messages=10, tag_expression="*")) == 4
