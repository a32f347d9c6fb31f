"""Hostile sends on the RocketMQ front: a compression bomb is refused before it is
inflated past the body limit, and a message with an impossible timestamp is refused before
any queue offset is taken (no hole, nothing of it anywhere)."""

from __future__ import annotations

import resource
import zlib
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from tests.rocketmq.conftest import RocketMQEnv

C = rd.Code


def _msg(body: bytes, mid: str, topic: str = "orders", **system: Any) -> Any:
    return rd.Message(topic=rd.Resource(name=topic), body=body,
                      system_properties=rd.SystemProperties(
                          message_id=mid, message_type=rd.NORMAL,
                          body_encoding=system.pop("body_encoding", rd.IDENTITY), **system))


def _gzip(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return c.compress(data) + c.flush()


def test_a_gzip_bomb_is_refused_without_inflating_it(rmq: RocketMQEnv) -> None:
    bomb = _gzip(b"\0" * (512 << 20))  # 512 MiB of zeros in about 0.5 MB
    assert len(bomb) < 1 << 20
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = rmq.stub.SendMessage(rs.SendMessageRequest(messages=[
        _msg(bomb, "bomb", body_encoding=rd.GZIP)]))
    assert r.entries[0].status.code == C.MESSAGE_BODY_TOO_LARGE, r
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kb < 64 << 10  # far below the 512 MiB it would inflate to
    cut = rmq.stub.SendMessage(rs.SendMessageRequest(messages=[
        _msg(_gzip(b"fine body")[:-6], "cut", body_encoding=rd.GZIP)]))
    assert cut.entries[0].status.code == C.MESSAGE_CORRUPTED  # a stream cut short
    ok = rmq.stub.SendMessage(rs.SendMessageRequest(messages=[
        _msg(_gzip(b"fine body"), "fine", body_encoding=rd.GZIP)]))
    assert ok.entries[0].status.code == C.OK


def test_an_impossible_born_timestamp_takes_no_queue_offset(rmq: RocketMQEnv) -> None:
    bad = [_msg(b"secret-body", f"b{i}", born_timestamp=Timestamp(seconds=s, nanos=n))
           for i, (s, n) in enumerate(((-1, 0), (0, -500_000_000)))]
    r = rmq.stub.SendMessage(rs.SendMessageRequest(messages=bad))
    assert [e.status.code for e in r.entries] == [C.BAD_REQUEST] * 2, r
    good = rmq.stub.SendMessage(rs.SendMessageRequest(messages=[_msg(b"ok", "k", keys=["a"])]))
    assert good.entries[0].status.code == C.OK
    rmq.broker.store.wait_visible()  # dispatched: its ConsumeQueue entry is written
    qid = next(q for q in range(4) if rmq.broker.store.queues.queue("orders", q).max_offset)
    assert good.entries[0].offset == 0  # the refused ones took no offset
    popped = rmq.broker.pop.pop("orders", "g", 32, 30)
    assert [p.message.body for p in popped] == [b"ok"] and popped[0].message.queue_id == qid
    assert rmq.broker.pop.pop("other", "g", 32, 30) == []
