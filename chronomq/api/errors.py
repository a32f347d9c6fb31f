"""The one place project errors become gRPC status codes.

``abort`` is called by the method handlers (``chronomq.api.handlers``) for every method of
every service, unary and streaming: servicers raise project errors and never map them
themselves.  ``code_number`` gives the same code for per-item errors inside a response
(a batch Send's ``Error``, a Subscribe settlement's).
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

from access.errors import AccessDenied, Unauthenticated
from store.errors import (
    AlreadyExists,
    ChronomqError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StoreError,
    Unavailable,
)

# Most specific first: TopicNotFound is both NotFound and InvalidArgument -> NOT_FOUND.
_CODES: list[tuple[type[ChronomqError], grpc.StatusCode]] = [
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (AccessDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreError, grpc.StatusCode.INTERNAL),
]


def status_of(exc: BaseException) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def code_number(exc: BaseException) -> int:
    """The numeric google.rpc.Code, for per-item errors inside a response."""
    value: tuple[int, str] = status_of(exc).value
    return value[0]


log = logging.getLogger(__name__)


def abort(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    """End the call with ``exc``'s status and message (an INTERNAL one is logged with its
    traceback: it is the broker's fault, not the caller's)."""
    code = status_of(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("internal error", exc_info=exc)
    context.abort(code, str(exc))
    raise AssertionError("context.abort returns only by raising")
