"""gRPC method handlers for a servicer, built from its service descriptor, that never let
a hostile request end as INTERNAL or UNKNOWN before the servicer sees it.

grpcio's generated ``add_*Servicer_to_server`` parse requests with ``FromString``: bytes
that do not decode end the call with INTERNAL ("Exception deserializing request!"), and
on a stream they leave the call half-broken.  Here:

- a request that does not decode becomes ``Malformed``: a unary call answers
  INVALID_ARGUMENT naming the message type; on a client stream the servicer sees the
  stream end there (as if the client had closed it) and the call then ends with
  INVALID_ARGUMENT, after the answers it already gave;
- the credentials and rights are checked inside every method, streams included, by a
  ``Gate`` (``chronomq.api.guard.Guard``, with a table of rules per service): ``open``
  at the start of a call (no credentials: ``Unauthenticated``, for each kind of call
  the same way), ``check`` on each request (a stream's as they are read: one refused
  ends the stream there, as a malformed one does, and the call ends with the refusal
  after the answers already given), ``narrow`` on a unary answer.  A refusal ends the
  call with its gRPC status (UNAUTHENTICATED, PERMISSION_DENIED), or, for a front whose
  protocol answers refusals inside its responses (``Refuse``: the RocketMQ front), is
  that answer.  Health and reflection are separate services and stay open;
- a project error (``ChronomqError``) that a servicer method lets out still gets its own
  status (``chronomq.api.errors``), never UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from chronomq.api.errors import abort
from store.errors import ChronomqError, InvalidArgument

Metadata = Sequence[tuple[str, str | bytes]]
Refuse = Callable[[Any, ChronomqError], Any]
"""``(answer class, error) -> answer | None``: a front whose protocol answers refusals in
its responses (the RocketMQ front: a status code inside every answer) gives the answer
refusing the call with this error; None: the call ends with the error's gRPC status."""


class CallGate(Protocol):
    """One call's checks (``Gate.open``)."""

    def check(self, request: Any) -> None:
        """Raise a ``ChronomqError`` (``AccessDenied``) to refuse ``request``."""
        ...

    def narrow(self, request: Any, answer: Any) -> Any:
        """``answer`` (of a unary call) cut to what the caller may see."""
        ...


class Gate(Protocol):
    def open(self, rpc: str, context: grpc.ServicerContext) -> CallGate:
        """The checks of one call of ``rpc``; raises ``Unauthenticated`` when the
        credentials name nobody."""
        ...


class _Pass:
    """Every request allowed, every answer whole."""

    def check(self, request: Any) -> None:
        pass

    def narrow(self, request: Any, answer: Any) -> Any:
        return answer


PASS = _Pass()


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
    """A request stream that ends at the first malformed or refused request (its error
    kept in ``error``)."""

    def __init__(self, requests: Iterator[Any], check: Callable[[Any], None]) -> None:
        self._requests = requests
        self._check = check
        self.error: ChronomqError | None = None

    def __iter__(self) -> _Checked:
        return self

    def __next__(self) -> Any:
        if self.error is not None:
            raise StopIteration
        request = next(self._requests)
        try:
            if type(request) is Malformed:
                raise InvalidArgument(request.error)
            self._check(request)
        except ChronomqError as exc:
            self.error = exc
            raise StopIteration from None
        return request


def one_header(metadata: Metadata, name: str) -> str | None:
    """The value of header ``name`` when the call has it exactly once, else None."""
    values = [v for k, v in metadata if k == name]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    return values[0]


def bearer_token(metadata: Metadata) -> str | None:
    """The token of the call's one ``authorization: Bearer <token>`` header; None when it
    has none (or two, or another scheme)."""
    value = one_header(metadata, "authorization")
    if value is None or not value.startswith("Bearer "):
        return None
    return value[len("Bearer "):]


def _wrap(method: MethodDescriptor, behavior: Callable[..., Any], gate: Gate | None,
          refuse: Refuse | None) -> grpc.RpcMethodHandler:
    rpc = method.name
    answer_class = message_factory.GetMessageClass(method.output_type)

    def start(request: Any, context: grpc.ServicerContext) -> CallGate:
        call = gate.open(rpc, context) if gate is not None else PASS
        if type(request) is Malformed:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        return call

    def refused(exc: ChronomqError, context: grpc.ServicerContext) -> Any:
        """The answer that refuses the call (``refuse``), else the call ends with the
        error's status."""
        answer = refuse(answer_class, exc) if refuse is not None else None
        if answer is None:
            abort(context, exc)
        return answer

    def unary_in(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            call = start(request, context)
            call.check(request)
            return call.narrow(request, behavior(request, context))
        except ChronomqError as exc:
            return refused(exc, context)

    def unary_in_stream_out(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            call = start(request, context)
            call.check(request)
            yield from behavior(request, context)
        except ChronomqError as exc:
            yield refused(exc, context)

    def stream_in(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        try:
            checked = _Checked(requests, start(None, context).check)
            answer = behavior(checked, context)
        except ChronomqError as exc:
            return refused(exc, context)
        return answer if checked.error is None else refused(checked.error, context)

    def stream_in_stream_out(requests: Iterator[Any],
                             context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            checked = _Checked(requests, start(None, context).check)
            yield from behavior(checked, context)
        except ChronomqError as exc:
            yield refused(exc, context)
            return
        if checked.error is not None:
            yield refused(checked.error, context)

    parse = _parser(message_factory.GetMessageClass(method.input_type))
    serialize = answer_class.SerializeToString
    kind = (method.client_streaming, method.server_streaming)
    if kind == (False, False):
        return grpc.unary_unary_rpc_method_handler(unary_in, parse, serialize)
    if kind == (False, True):
        return grpc.unary_stream_rpc_method_handler(unary_in_stream_out, parse, serialize)
    if kind == (True, False):
        return grpc.stream_unary_rpc_method_handler(stream_in, parse, serialize)
    return grpc.stream_stream_rpc_method_handler(stream_in_stream_out, parse, serialize)


def add_service(server: grpc.Server, servicer: Any, service: ServiceDescriptor, *,
                gate: Gate | None = None, refuse: Refuse | None = None,
                also: Sequence[Any] = ()) -> None:
    """Serve the methods of ``service`` on ``server`` (see the module doc): each from the
    first of ``also`` that has it, else from ``servicer``.  ``gate`` checks every call;
    ``refuse`` turns a refusal into an answer (see ``Refuse``)."""

    def behavior(name: str) -> Callable[..., Any]:
        owner = next((o for o in also if hasattr(o, name)), servicer)
        method: Callable[..., Any] = getattr(owner, name)
        return method

    handlers = {m.name: _wrap(m, behavior(m.name), gate, refuse) for m in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
