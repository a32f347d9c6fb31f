"""The batching Producer and the Consumer iterator against a real broker: many single
sends share SendStream batches, a future resolves only once its message is durable (kill
-9 in the middle), idempotent producers resend across a broker restart and store each
message once, acks on the Subscribe stream resolve only once durable, and failures come
back with the broker's reason."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError, SendOutcome, message
from chronomq.client.consumer import Consumer
from chronomq.client.producer import BufferFull, Producer
from chronomq.v1 import broker_pb2 as pb
from testkit.process import ServerProcess
from tests.conftest import RunningServer


def _drain(c: ChronomqClient, topic: str, group: str) -> dict[str, bytes]:
    """Every visible message of ``topic`` for a fresh ``group``: id -> body."""
    out: dict[str, bytes] = {}
    while got := c.pop(topic, group, max_messages=32, invisible_time_s=300):
        for m in got:
            assert m.message_id not in out, "a message stored twice"
            out[m.message_id] = m.body
    return out


def test_single_sends_share_batches_and_resolve_with_their_ids(
        client: ChronomqClient) -> None:
    client.create_topic("p", queue_count=2)
    with Producer(client, linger_ms=500, batch_messages=100) as producer:
        futures = [producer.send("p", f"m{i}".encode(), key=f"k{i}") for i in range(100)]
        outcomes = [f.result(30) for f in futures]
        assert producer.batches_sent == 1  # the linger gathered all hundred
    assert all(isinstance(o, SendOutcome) and o.ok for o in outcomes)
    stored = _drain(client, "p", "G")
    assert stored == {o.message_id: f"m{i}".encode() for i, o in enumerate(outcomes)}


def test_concurrent_senders_and_a_refused_message(client: ChronomqClient) -> None:
    client.create_topic("p")
    results: dict[bytes, Future[SendOutcome]] = {}
    with Producer(client, in_flight=2) as producer:
        def send(t: int) -> None:
            for i in range(300):
                body = f"t{t}-{i}".encode()
                results[body] = producer.send("p", body)

        threads = [threading.Thread(target=send, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        refused = producer.send("no-such-topic", b"x")
        assert producer.flush(60)
        assert producer.batches_sent < 1800  # batches formed while others were in flight
    with pytest.raises(RpcError) as e:
        refused.result(0)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    stored = _drain(client, "p", "G")
    assert {results[b].result(0).message_id: b for b in results} == stored


def test_send_after_close_and_a_full_buffer_are_refused(tmp_path: Path) -> None:
    # a long linger holds the messages: the buffer fills
    with ChronomqClient("127.0.0.1:1", timeout_s=1) as c:
        producer = Producer(c, max_pending=3, block_s=0.2, linger_ms=60_000)
        futures = [producer.send("p", b"x") for _ in range(3)]
        with pytest.raises(BufferFull):
            producer.send("p", b"y")
        producer.close(timeout_s=0.5)
        for f in futures:
            with pytest.raises(RpcError):
                f.result(5)
        with pytest.raises(Exception, match="closed"):
            producer.send("p", b"z")


def _send_until_killed(srv: ServerProcess, producer: Producer, n: int, kill_after: int
                       ) -> list[tuple[bytes, Future[SendOutcome]]]:
    sent: list[tuple[bytes, Future[SendOutcome]]] = []
    for i in range(n):
        body = f"m{i:06d}".encode()
        sent.append((body, producer.send("p", body)))
        if i == kill_after:
            wait([f for _, f in sent[: kill_after // 2]], 60)
            srv.kill9()
    return sent


def test_a_resolved_future_survives_kill9(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    port = srv.target.rsplit(":", 1)[1]
    with ChronomqClient(srv.target) as c:
        c.create_topic("p")
        producer = Producer(c, in_flight=4, batch_messages=50, block_s=60,
                            delivery_timeout_s=5)
        try:
            sent = _send_until_killed(srv, producer, 4000, kill_after=3000)
            wait([f for _, f in sent], 60)
        finally:
            producer.close(timeout_s=1)
        assert all(f.done() for _, f in sent), "a future left hanging"
        ok = {f.result().message_id: body for body, f in sent if f.exception() is None}
        failed = [f.exception() for _, f in sent if f.exception() is not None]
        assert len(ok) >= 1500 and failed  # the kill came mid-stream
        assert all(isinstance(e, RpcError) for e in failed)
    srv = ServerProcess(tmp_path / "data", f"server.port={port}")
    try:
        with ChronomqClient(srv.target) as c:
            stored = _drain(c, "p", "G")
    finally:
        srv.terminate()
    assert {mid: stored.get(mid) for mid in ok} == ok  # every OK answer kept


def test_an_idempotent_producer_resends_across_a_restart_and_stores_each_once(
        tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    port = srv.target.rsplit(":", 1)[1]
    with ChronomqClient(srv.target) as c:
        c.create_topic("p")
        producer = Producer(c, in_flight=4, batch_messages=50, idempotent=True, retries=50,
                            block_s=120)
        try:
            sent = _send_until_killed(srv, producer, 3000, kill_after=2000)
            srv = ServerProcess(tmp_path / "data", f"server.port={port}")
            outcomes = [(body, f.result(120)) for body, f in sent]  # every one answered OK
            assert producer.streams_opened >= 2
        finally:
            producer.close(timeout_s=5)
        stored = _drain(c, "p", "G")
        srv.terminate()
    assert len(stored) == 3000  # once each, though some were sent twice
    assert {o.message_id: body for body, o in outcomes} == stored


def _subscribe_raw(c: ChronomqClient, requests: list[pb.SubscribeRequest]
                   ) -> list[pb.SubscribeResponse]:
    return list(c.stub.Subscribe(iter(requests), metadata=c.metadata, timeout=30))


def test_settled_through_is_answered_even_when_the_client_half_closes_at_once(
        client: ChronomqClient) -> None:
    client.create_topic("s")
    client.send_one("s", b"a")
    (m,) = client.pop("s", "G", invisible_time_s=60)
    responses = _subscribe_raw(client, [
        pb.SubscribeRequest(topic="s", group="G", invisible_time_s=60, max_outstanding=1),
        pb.SubscribeRequest(ack=[m.receipt_handle, "garbage"], settle_id=7)])
    assert [r.settled_through for r in responses if r.settled_through] == [7]
    errors = [e.receipt_handle for r in responses for e in r.errors]
    assert errors == ["garbage"]
    assert client.stats()["pop.acked"] == 1


def test_consumer_acks_resolve_once_durable_and_survive_kill9(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    port = srv.target.rsplit(":", 1)[1]
    with ChronomqClient(srv.target) as c:
        c.create_topic("s", queue_count=2)
        with Producer(c) as producer:
            sent = {f.result(30).message_id
                    for f in [producer.send("s", f"m{i}".encode()) for i in range(600)]}
        acked: list[tuple[str, Future[None]]] = []
        consumer = Consumer(c, "s", "G", invisible_time_s=2, prefetch=64)
        for m in consumer:
            acked.append((m.message_id, consumer.ack(m)))
            if len(acked) == 400:
                break
        wait([f for _, f in acked[:300]], 30)
        srv.kill9()
        wait([f for _, f in acked], 30)
        assert all(f.done() for _, f in acked)
        durable = {mid for mid, f in acked if f.exception() is None}
        unknown = {mid for mid, _ in acked} - durable  # the kill took the answer: the ack
        # may or may not have been applied (seen in CI: 7 of 23 such did not come back)
        assert len(durable) >= 300
        consumer.close(timeout_s=1)
    srv = ServerProcess(tmp_path / "data", f"server.port={port}")
    try:
        with ChronomqClient(srv.target) as c:
            seen: set[str] = set()
            deadline = time.monotonic() + 30  # leases of the killed stream run 2 s
            while not sent - durable <= seen and time.monotonic() < deadline:
                for m in c.pop("s", "G", max_messages=32, wait_ms=500, invisible_time_s=60):
                    seen.add(m.message_id)
    finally:
        srv.terminate()
    assert not seen & durable  # nothing redelivered after an OK ack
    assert seen <= sent - durable
    assert sent - durable - unknown <= seen  # and every message never acked comes back


def test_consumer_loop_nack_close_and_refusals(client: ChronomqClient,
                                               server: RunningServer) -> None:
    client.create_topic("s")
    for i in range(20):
        client.send_one("s", f"m{i}".encode())
    with Consumer(client, "s", "G", invisible_time_s=60, prefetch=8) as consumer:
        first = consumer.receive(10)
        assert first is not None
        consumer.nack(first, delay_ms=0).result(10)
        bodies: list[bytes] = []
        attempts: dict[bytes, int] = {}
        for m in consumer:
            bodies.append(m.body)
            attempts[m.body] = m.delivery_attempt
            consumer.ack(m).result(10)
            if len(bodies) == 20:
                break
        assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(20))
        assert attempts[first.body] == 2  # it came back after the nack
        with pytest.raises(RpcError) as e:
            consumer.ack("not-a-handle").result(10)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(RpcError):  # acked already
            consumer.ack(first).result(10)
        client.send_one("s", b"held")
        held = consumer.receive(10)
        assert held is not None and held.body == b"held"
    assert consumer.receive(0) is None
    # closing gave back what was handed out and not settled: visible at once
    (again,) = client.pop("s", "G", invisible_time_s=60, wait_ms=5000)
    assert again.body == b"held" and again.delivery_attempt == 2
    figures = client.stats()
    assert figures["group.G.s.in_flight"] == 1  # just `again`
    with Consumer(client, "missing", "G") as bad, pytest.raises(RpcError) as e:
        bad.receive(10)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_a_consumer_takes_and_acks_a_large_backlog_with_every_ack_answered(
        tmp_path: Path) -> None:
    # Seen in the durable-ack benchmark: a Subscribe stream that leased another batch in
    # the same turn as it took a report of settled requests dropped that report; with at
    # most four settlement requests unanswered the consumer's acks then waited for ever
    # and its leases ran out again and again
    srv = ServerProcess(tmp_path / "data")
    try:
        with ChronomqClient(srv.target, timeout_s=30) as c:
            c.create_topic("big", queue_count=4)
            for _ in range(100):
                assert all(o.ok for o in c.send([message("big", b"x" * 100)] * 1000))
            futures = []
            deadline = time.monotonic() + 90  # ~5 s on this machine
            with Consumer(c, "big", "G", prefetch=4096, invisible_time_s=300) as consumer:
                for i in range(100_000):  # (Pops of 256: several a turn of the stream)
                    m = consumer.receive(timeout_s=max(0.1, deadline - time.monotonic()))
                    assert m is not None, f"the stream stalled after {i} messages"
                    futures.append(consumer.ack(m))
                for f in futures:
                    f.result(max(0.1, deadline - time.monotonic()))  # every ack answered
            stats = c.stats()
            assert stats["pop.acked"] == 100_000 and stats["pop.revived"] == 0
    finally:
        srv.terminate()
