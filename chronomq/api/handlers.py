"""gRPC method handlers for a servicer, built from its service descriptor, that never let
a hostile request end as INTERNAL or UNKNOWN before the servicer sees it.

grpcio's generated ``add_*Servicer_to_server`` parse requests with ``FromString``: bytes
that do not decode end the call with INTERNAL ("Exception deserializing request!"), and
on a stream they leave the call half-broken.  Here:

- a request that does not decode becomes ``Malformed``: a unary call answers
  INVALID_ARGUMENT naming the message type; on a client stream the servicer sees the
  stream end there (as if the client had closed it) and the call then ends with
  INVALID_ARGUMENT, after the answers it already gave;
- the credential check (``allow(metadata)``) runs inside every method, streams included,
  so each kind of call is refused the same way: UNAUTHENTICATED.  Health and reflection
  are separate services and stay open;
- a project error (``ChronomqError``) that a servicer method lets out still gets its own
  status (``chronomq.api.errors``), never UNKNOWN.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from chronomq.api.errors import abort
from store.errors import ChronomqError

Metadata = Sequence[tuple[str, str | bytes]]
Allow = Callable[[Metadata], bool]


class Malformed:
    """A request whose bytes did not decode as its message type."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as exc:  # DecodeError, and anything a broken buffer raises
            return Malformed(f"the request is not a valid {cls.DESCRIPTOR.full_name}: {exc}")
    return parse


class _Checked:
    """A request stream that ends at the first malformed request (kept in ``error``)."""

    def __init__(self, requests: Iterator[Any]) -> None:
        self._requests = requests
        self.error = ""

    def __iter__(self) -> _Checked:
        return self

    def __next__(self) -> Any:
        if self.error:
            raise StopIteration
        request = next(self._requests)
        if type(request) is Malformed:
            self.error = request.error
            raise StopIteration
        return request


def one_header(metadata: Metadata, name: str) -> str | None:
    """The value of header ``name`` when the call has it exactly once, else None."""
    values = [v for k, v in metadata if k == name]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    return values[0]


def bearer(token: str) -> Allow:
    """Calls must carry exactly one ``authorization: Bearer <token>`` (constant-time
    compare)."""
    expected = f"Bearer {token}".encode()

    def allow(metadata: Metadata) -> bool:
        value = one_header(metadata, "authorization")
        return value is not None and hmac.compare_digest(value.encode(), expected)
    return allow


def _wrap(method: MethodDescriptor, behavior: Callable[..., Any], allow: Allow | None,
          denied: str) -> grpc.RpcMethodHandler:
    def check(request: Any, context: grpc.ServicerContext) -> None:
        if allow is not None and not allow(context.invocation_metadata() or ()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, denied)
        if type(request) is Malformed:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)

    def unary_in(request: Any, context: grpc.ServicerContext) -> Any:
        check(request, context)
        try:
            return behavior(request, context)
        except ChronomqError as exc:
            abort(context, exc)

    def unary_in_stream_out(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        check(request, context)
        try:
            yield from behavior(request, context)
        except ChronomqError as exc:
            abort(context, exc)

    def stream_in(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        check(None, context)
        checked = _Checked(requests)
        try:
            answer = behavior(checked, context)
        except ChronomqError as exc:
            abort(context, exc)
        check(Malformed(checked.error) if checked.error else None, context)
        return answer

    def stream_in_stream_out(requests: Iterator[Any],
                             context: grpc.ServicerContext) -> Iterator[Any]:
        check(None, context)
        checked = _Checked(requests)
        try:
            yield from behavior(checked, context)
        except ChronomqError as exc:
            abort(context, exc)
        check(Malformed(checked.error) if checked.error else None, context)

    parse = _parser(message_factory.GetMessageClass(method.input_type))
    serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
    kind = (method.client_streaming, method.server_streaming)
    if kind == (False, False):
        return grpc.unary_unary_rpc_method_handler(unary_in, parse, serialize)
    if kind == (False, True):
        return grpc.unary_stream_rpc_method_handler(unary_in_stream_out, parse, serialize)
    if kind == (True, False):
        return grpc.stream_unary_rpc_method_handler(stream_in, parse, serialize)
    return grpc.stream_stream_rpc_method_handler(stream_in_stream_out, parse, serialize)


def add_service(server: grpc.Server, servicer: Any, service: ServiceDescriptor,
                allow: Allow | None = None,
                denied: str = "missing or wrong credentials") -> None:
    """Serve ``servicer``'s methods of ``service`` on ``server`` (see the module doc)."""
    handlers = {m.name: _wrap(m, getattr(servicer, m.name), allow, denied)
                for m in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
