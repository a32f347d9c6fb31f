"""The RocketMQ 5 protocol on the front's side of the wire: statuses and codes, the
conversions between RocketMQ's protobuf messages (timestamps, durations, messages, tag
filters, GZIP bodies) and chronomq's, and what is refused as unsupported.

Everything here is a pure function of its arguments (no broker state), so the servicer in
``chronomq.rocketmq.front`` reads as the mapping of each RPC onto the broker, and these
rules can be tested on their own.  ``Refused`` carries a RocketMQ status code: the
servicer turns it into the answer's status.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, TypeAlias

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from chronomq.rocketmq.pb import definition as rd
from pop.handle import InvalidReceiptHandle
from pop.service import (
    AlreadyDone,
    HandleSuperseded,
    ReceiptHandleExpired,
    TagFilter,
)
from store.errors import (
    ChronomqError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TopicNotFound,
)

Context: TypeAlias = grpc.ServicerContext
Code = rd.Code

PROP_KEYS = "rocketmq.keys"  # all keys of a message with more than one, space-separated
MS_SECONDS_BOUND = 10_000_000_000  # "seconds" above this (year 2286) can only be ms
LITE_CLIENTS = {rd.LITE_PUSH_CONSUMER: "LITE_PUSH_CONSUMER",
                 rd.LITE_SIMPLE_CONSUMER: "LITE_SIMPLE_CONSUMER"}


def lite_refusal(client_type: int) -> str:
    """Why a lite consumer cannot start here ("" for every other client type)."""
    kind = LITE_CLIENTS.get(client_type)
    return (f"lite topics are not supported by chronomq's RocketMQ front: a {kind} "
            "cannot subscribe; use a PushConsumer or SimpleConsumer on a normal topic"
            if kind else "")


UNSUPPORTED_TYPES = {rd.FIFO: "FIFO", rd.TRANSACTION: "transactional", rd.LITE: "lite",
                      rd.PRIORITY: "priority"}


class Refused(Exception):
    """An answer with a RocketMQ status code other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def ok_status() -> Any:
    return rd.Status(code=Code.OK, message="OK")


def status_of(code: int, message: str) -> Any:
    return rd.Status(code=code, message=message)


def code_of(exc: BaseException) -> int:
    """The RocketMQ code for a chronomq error raised outside a more specific check."""
    if isinstance(exc, TopicNotFound):
        return int(Code.TOPIC_NOT_FOUND)
    if isinstance(exc, InvalidReceiptHandle | ReceiptHandleExpired | HandleSuperseded
                  | AlreadyDone):
        return int(Code.INVALID_RECEIPT_HANDLE)
    if isinstance(exc, NotFound):
        return int(Code.NOT_FOUND)
    if isinstance(exc, InvalidArgument | FailedPrecondition):
        return int(Code.BAD_REQUEST)
    if isinstance(exc, ResourceExhausted):  # the volume is full: back off and retry
        return int(Code.TOO_MANY_REQUESTS)
    if isinstance(exc, ChronomqError):
        return int(Code.INTERNAL_SERVER_ERROR)
    return int(Code.INTERNAL_ERROR)


def inflate(body: bytes, limit: int) -> bytes:
    """A GZIP body inflated, stopping (refused) as soon as it passes ``limit`` bytes: a
    compression bomb costs at most ``limit`` bytes of memory."""
    d = zlib.decompressobj(zlib.MAX_WBITS | 32)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise Refused(Code.MESSAGE_CORRUPTED,
                       f"the body is marked GZIP but does not inflate: {exc}") from exc
    if len(out) > limit:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE,
                       f"the body inflates to over {limit} bytes (store.max_body_bytes)")
    if not d.eof:
        raise Refused(Code.MESSAGE_CORRUPTED, "the body is marked GZIP but is cut short")
    return out


def summary(statuses: list[Any]) -> Any:
    """A response's own status from its entries': OK, the one error, or MULTIPLE_RESULTS."""
    failed = [s for s in statuses if s.code != Code.OK]
    if not failed:
        return ok_status()
    if len(statuses) == 1:
        return failed[0]
    return status_of(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(statuses)} entries failed; "
                   "see each entry's status")


def timestamp_ms(ts: Any) -> int:
    """Epoch ms of a protobuf Timestamp.  Some clients put milliseconds into the seconds
    field; a value above 1e10 seconds (the year 2286) can only be that."""
    if ts.seconds > MS_SECONDS_BOUND:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def duration_s(d: Any) -> int:
    """Whole seconds of a protobuf Duration, rounded up: never shorter than asked."""
    return math.ceil(int(d.seconds) + int(d.nanos) / 1e9)


def tag_filter(expression: Any) -> TagFilter:
    if expression.type == rd.SQL:
        raise Refused(Code.ILLEGAL_FILTER_EXPRESSION,
                       "SQL92 filter expressions are not supported; use a TAG expression "
                       "('*' or 'a || b')")
    try:
        return TagFilter.parse(expression.expression)
    except InvalidArgument as exc:
        raise Refused(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from exc


def duration_pb(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)



def client_id(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


def unsupported(rpc: str) -> Any:
    return status_of(Code.UNSUPPORTED, f"{rpc} is not supported by chronomq: consume with a "
                   "SimpleConsumer (or PushConsumer), which pops with an invisible time")


def timestamp_pb(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


def endpoints_pb(address: str) -> Any:
    """``host:port`` as RocketMQ Endpoints (IPv4, IPv6 or a domain name)."""
    host, _, port = address.rpartition(":")
    scheme = rd.DOMAIN_NAME if any(c.isalpha() for c in host) else rd.IPv4
    if ":" in host:
        scheme = rd.IPv6
    return rd.Endpoints(scheme=scheme, addresses=[rd.Address(host=host, port=int(port))])
