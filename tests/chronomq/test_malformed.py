"""Requests that are not what they claim to be, on a real gRPC server: bytes that do not
decode as the method's message, on every method of ``chronomq.v1.Broker``, unary and
streaming; and the token check on every method, streams included."""

from __future__ import annotations

import time

import grpc
import pytest

from chronomq.v1 import broker_pb2
from tests.conftest import RunningServer, broker_config

SERVICE = broker_pb2.DESCRIPTOR.services_by_name["Broker"]
GARBAGE = b"\xff\xff\xff\xff\x0f\x12\x05hello"  # a varint that never ends, then junk
GOOD_FIRST = {  # a stream's valid first frame, before the bad one
    "SendStream": broker_pb2.SendRequest(messages=[broker_pb2.OutgoingMessage(
        topic="t", body=b"x")]),
    "Subscribe": broker_pb2.SubscribeRequest(topic="t", group="g"),
}


def _call(channel: grpc.Channel, method: str, client_stream: bool, server_stream: bool,
          frames: list[bytes], metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{method}"
    ident = {"request_serializer": None, "response_deserializer": None}
    try:
        if client_stream and server_stream:
            for _ in channel.stream_stream(path, **ident)(iter(frames), timeout=5,
                                                          metadata=metadata):
                pass
        elif server_stream:
            for _ in channel.unary_stream(path, **ident)(frames[0], timeout=5,
                                                         metadata=metadata):
                pass
        elif client_stream:
            channel.stream_unary(path, **ident)(iter(frames), timeout=5, metadata=metadata)
        else:
            channel.unary_unary(path, **ident)(frames[0], timeout=5, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_undecodable_bytes_are_invalid_argument_on_every_method(server: RunningServer,
                                                                method: str) -> None:
    m = SERVICE.methods_by_name[method]
    with server.client() as client:
        client.create_topic("t")
    with grpc.insecure_channel(server.target) as channel:
        code = _call(channel, method, m.client_streaming, m.server_streaming, [GARBAGE])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        if m.client_streaming:  # a bad frame after a good one ends the stream the same way
            first = GOOD_FIRST[method].SerializeToString()
            code = _call(channel, method, True, m.server_streaming, [first, GARBAGE])
            assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_stream_frames_do_not_keep_the_server_from_stopping(tmp_path: object) -> None:
    s = RunningServer(broker_config(tmp_path / "data"))  # type: ignore[operator]
    with grpc.insecure_channel(s.target) as channel:
        for method in ("SendStream", "Subscribe"):
            for _ in range(60):
                code = _call(channel, method, True, True, [GARBAGE])
                assert code == grpc.StatusCode.INVALID_ARGUMENT
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < s.config.server.shutdown_grace_s + 5


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_every_method_wants_the_token(tmp_path: object, method: str) -> None:
    s = RunningServer(broker_config(tmp_path / "data", auth_token="s3cret"))  # type: ignore[operator]
    m = SERVICE.methods_by_name[method]
    empty = m.input_type._concrete_class().SerializeToString()
    try:
        with grpc.insecure_channel(s.target) as channel:
            for metadata in ((), (("authorization", "Bearer wrong"),),
                             (("authorization", "Bearer s3cret"),
                              ("authorization", "Bearer s3cret"))):
                code = _call(channel, method, m.client_streaming, m.server_streaming, [empty],
                             metadata)
                assert code == grpc.StatusCode.UNAUTHENTICATED, metadata
    finally:
        s.stop()
