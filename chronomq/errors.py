"""The one place project errors become gRPC status codes."""

from __future__ import annotations

import grpc

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
