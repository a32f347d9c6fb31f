"""The RocketMQ 5 front: ``apache.rocketmq.v2.MessagingService`` over gRPC, mapped onto the
same Broker as the chronomq API.  Official RocketMQ 5 clients (Producer, SimpleConsumer,
PushConsumer) connect to it unchanged.

How the protocol maps onto the core:

- QueryRoute answers one queue per chronomq queue of the topic, all on this broker
  (broker id 0, READ_WRITE, NORMAL and DELAY messages), at ``rocketmq.advertise_address``
  or else the address the client dialled.
- SendMessage stores each message under the client's own message id (a retried send is
  recognised by that id and stored once) and answers one entry per message.  A
  ``delivery_timestamp`` makes it a delayed message; ``recall_handle`` is its id.
- ReceiveMessage is a Pop over every queue of the topic (the queue named in the request
  does not narrow it) with a TAG filter, long-polling until the client's deadline.  Its
  stream is a status, the messages, then the delivery timestamp.
- AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue are Ack,
  ChangeInvisibleTime and DeadLetter; RecallMessage is Cancel.  Leases of ``auto_renew``
  receives (push consumers) are renewed while the client lives (``LeaseRenewer``).
- Telemetry answers each settings command with the client's settings completed, once the
  client has fetched the routes of the topics they name (``chronomq.rocketmq_startup``).
- FIFO, transactional, lite and priority messages, lite consumers (their settings and
  heartbeats), SQL92 filters and the pull API answer with a clear UNSUPPORTED status.

Every unary answer carries ``status.code = OK (20000)`` on success; errors are RocketMQ
codes with chronomq's message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from chronomq.broker import Broker
from chronomq.budget import LONG_POLL, STREAM, CallBudget
from chronomq.handlers import Metadata, one_header
from chronomq.notify import ArrivalNotifier
from chronomq.rocketmq_pb import definition as rd
from chronomq.rocketmq_pb import service as rs
from chronomq.rocketmq_pb import service_grpc as rs_grpc
from chronomq.rocketmq_startup import RouteWatch
from pop.handle import InvalidReceiptHandle
from pop.service import (
    MAX_INVISIBLE_TIME_S,
    AlreadyDone,
    HandleSuperseded,
    PoppedMessage,
    PopService,
    ReceiptHandleExpired,
    TagFilter,
    check_group,
)
from store.errors import (
    ChronomqError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TopicNotFound,
)
from store.message import (
    FLAG_TIMER_DELIVERY,
    MAX_KEY_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TAG_BYTES,
    MAX_TIME_MS,
    Draft,
    Message,
    encode_properties,
    validate_message_id,
)
from store.topics import Topic
from timer.service import TimerOutcome

log = logging.getLogger(__name__)
Context: TypeAlias = grpc.ServicerContext
Code = rd.Code

PROP_KEYS = "rocketmq.keys"  # all keys of a message with more than one, space-separated
MAX_SEND_BATCH = 1000
DEFAULT_INVISIBLE_S = 30  # a ReceiveMessage without invisible_duration (push consumers)
ANSWER_MARGIN_S = 0.5  # a long poll answers this long before the client's deadline
MS_SECONDS_BOUND = 10_000_000_000  # "seconds" above this (year 2286) can only be ms
# Producers retry a failed send this often, waiting 10 ms, 20 ms, ... up to 1 s.
PRODUCER_ATTEMPTS, PRODUCER_BACKOFF_MS = 3, (10, 1000)
CLIENT_GONE_MS = 120_000  # a client not heard of for this long is gone (heartbeats: 10 s)
RENEW_AHEAD_MS = 10_000  # an auto_renew lease is renewed when it has this little left ...
MAX_RENEW_MS = 3_600_000  # ... for at most this long after its receive
_LITE_CLIENTS = {rd.LITE_PUSH_CONSUMER: "LITE_PUSH_CONSUMER",
                 rd.LITE_SIMPLE_CONSUMER: "LITE_SIMPLE_CONSUMER"}


def _lite_refusal(client_type: int) -> str:
    """Why a lite consumer cannot start here ("" for every other client type)."""
    kind = _LITE_CLIENTS.get(client_type)
    return (f"lite topics are not supported by chronomq's RocketMQ front: a {kind} "
            "cannot subscribe; use a PushConsumer or SimpleConsumer on a normal topic"
            if kind else "")


_UNSUPPORTED_TYPES = {rd.FIFO: "FIFO", rd.TRANSACTION: "transactional", rd.LITE: "lite",
                      rd.PRIORITY: "priority"}


class _Refused(Exception):
    """An answer with a RocketMQ status code other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _ok() -> Any:
    return rd.Status(code=Code.OK, message="OK")


def _status(code: int, message: str) -> Any:
    return rd.Status(code=code, message=message)


def _code_of(exc: BaseException) -> int:
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


def _inflate(body: bytes, limit: int) -> bytes:
    """A GZIP body inflated, stopping (refused) as soon as it passes ``limit`` bytes: a
    compression bomb costs at most ``limit`` bytes of memory."""
    d = zlib.decompressobj(zlib.MAX_WBITS | 32)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Refused(Code.MESSAGE_CORRUPTED,
                       f"the body is marked GZIP but does not inflate: {exc}") from exc
    if len(out) > limit:
        raise _Refused(Code.MESSAGE_BODY_TOO_LARGE,
                       f"the body inflates to over {limit} bytes (store.max_body_bytes)")
    if not d.eof:
        raise _Refused(Code.MESSAGE_CORRUPTED, "the body is marked GZIP but is cut short")
    return out


def _summary(statuses: list[Any]) -> Any:
    """A response's own status from its entries': OK, the one error, or MULTIPLE_RESULTS."""
    failed = [s for s in statuses if s.code != Code.OK]
    if not failed:
        return _ok()
    if len(statuses) == 1:
        return failed[0]
    return _status(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(statuses)} entries failed; "
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
        raise _Refused(Code.ILLEGAL_FILTER_EXPRESSION,
                       "SQL92 filter expressions are not supported; use a TAG expression "
                       "('*' or 'a || b')")
    try:
        return TagFilter.parse(expression.expression)
    except InvalidArgument as exc:
        raise _Refused(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from exc


def _duration_ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


class RocketMQServicer(rs_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, broker: Broker, notifier: ArrivalNotifier, max_wait_ms: int,
                 endpoint: str, budget: CallBudget | None = None) -> None:
        """``endpoint``: host:port handed out by QueryRoute when the client's own access
        point is unknown (or always, when ``rocketmq.advertise_address`` is set)."""
        self._broker = broker
        self._notifier = notifier
        self._max_wait_ms = max_wait_ms
        self._endpoint = endpoint
        self._budget = budget or CallBudget(1000, 1000, 200, "rocketmq")
        self._lock = threading.Lock()
        self.clients: dict[str, int] = {}  # client id -> last heard of (broker clock, ms)
        self.sent = self.received = self.acked = 0
        self.leases = LeaseRenewer(broker.pop, self.alive)
        self.routes = RouteWatch()  # when to answer a starting client's settings

    def figures(self) -> dict[str, float]:
        """``rocketmq.*`` figures for Stats and /metrics."""
        now = self._broker.clock.now_ms()
        with self._lock:
            for client, seen in list(self.clients.items()):
                if now - seen > CLIENT_GONE_MS:
                    del self.clients[client]
                    self.routes.forget(client)
            return {"rocketmq.clients": len(self.clients), "rocketmq.sent": self.sent,
                    "rocketmq.received": self.received, "rocketmq.acked": self.acked,
                    "rocketmq.renewing": self.leases.count(),
                    **self._budget.figures("rocketmq")}

    def alive(self, client: str) -> bool:
        """Whether a client was heard of lately (one without an id counts as alive)."""
        if not client:
            return True
        with self._lock:
            seen = self.clients.get(client)
        return seen is not None and self._broker.clock.now_ms() - seen <= CLIENT_GONE_MS

    def renew_leases(self, now_ms: int | None = None) -> int:
        """Renew the auto_renew leases close to their deadline (a scheduled job)."""
        return self.leases.renew_due(self._broker.clock.now_ms() if now_ms is None
                                     else now_ms)

    def _count(self, sent: int = 0, received: int = 0, acked: int = 0) -> None:
        with self._lock:
            self.sent += sent
            self.received += received
            self.acked += acked

    # ------------------------------------------------------------------ helpers

    def _heard_from(self, context: Context) -> None:
        client = _client_id(context)
        if client:
            with self._lock:
                self.clients[client] = self._broker.clock.now_ms()

    def _endpoints(self, asked: Any) -> Any:
        """Where clients reach this broker: the advertised address, else the address the
        client used (it knows how to reach us), else the bound host and port."""
        if not self._broker.config.rocketmq.advertise_address and asked.addresses:
            return asked
        host, _, port = self._endpoint.rpartition(":")
        scheme = rd.DOMAIN_NAME if any(c.isalpha() for c in host) else rd.IPv4
        if ":" in host:
            scheme = rd.IPv6
        return rd.Endpoints(scheme=scheme, addresses=[rd.Address(host=host, port=int(port))])

    def _topic(self, name: str) -> Topic:
        if not name:
            raise _Refused(Code.ILLEGAL_TOPIC, "the request names no topic")
        topic = self._broker.store.topics.get(name)
        if topic is None:
            if not self._broker.config.store.auto_create_topics:
                raise _Refused(Code.TOPIC_NOT_FOUND,
                               f"topic {name!r} does not exist (create it first: "
                               "chronomq topic create)")
            topic, _ = self._broker.create_topic(
                Topic(name, self._broker.config.store.default_queue_count))
        return topic

    @staticmethod
    def _group(resource: Any) -> str:
        try:
            check_group(resource.name)
        except InvalidArgument as exc:
            raise _Refused(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from exc
        return str(resource.name)

    # ------------------------------------------------------------------ route / session

    def QueryRoute(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            topic = self._topic(request.topic.name)
        except _Refused as exc:
            return rs.QueryRouteResponse(status=_status(exc.code, str(exc)))
        broker = rd.Broker(name=self._broker.config.tier.broker_name, id=0,
                           endpoints=self._endpoints(request.endpoints))
        queues = [rd.MessageQueue(topic=request.topic, id=qid, permission=rd.READ_WRITE,
                                  broker=broker, accept_message_types=[rd.NORMAL, rd.DELAY])
                  for qid in range(topic.queue_count)]
        client, name = _client_id(context), topic.name
        if client:  # counted once the answer has left (see chronomq.rocketmq_startup)
            context.add_callback(lambda: self.routes.fetched(client, name))
        return rs.QueryRouteResponse(status=_ok(), message_queues=queues)

    def QueryAssignment(self, request: Any, context: Context) -> Any:
        """Push consumers ask which queues to read: one is enough, as a receive pops every
        queue of the topic."""
        self._heard_from(context)
        try:
            self._group(request.group)
            self._topic(request.topic.name)
        except _Refused as exc:
            return rs.QueryAssignmentResponse(status=_status(exc.code, str(exc)))
        broker = rd.Broker(name=self._broker.config.tier.broker_name, id=0,
                           endpoints=self._endpoints(request.endpoints))
        queue = rd.MessageQueue(topic=request.topic, id=0, permission=rd.READ_WRITE,
                                broker=broker, accept_message_types=[rd.NORMAL, rd.DELAY])
        return rs.QueryAssignmentResponse(status=_ok(),
                                          assignments=[rd.Assignment(message_queue=queue)])

    def Heartbeat(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        refused = _lite_refusal(request.client_type)
        if refused:
            return rs.HeartbeatResponse(status=_status(Code.UNSUPPORTED, refused))
        if request.HasField("group"):
            try:
                self._group(request.group)
            except _Refused as exc:
                return rs.HeartbeatResponse(status=_status(exc.code, str(exc)))
        return rs.HeartbeatResponse(status=_ok())

    def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        with self._lock:
            self.clients.pop(_client_id(context), None)
        self.routes.forget(_client_id(context))
        return rs.NotifyClientTerminationResponse(status=_ok())

    def Telemetry(self, request_iterator: Iterable[Any], context: Context) -> Iterator[Any]:
        """Answer every settings command with the client's settings completed by the
        broker's (clients wait for this reply before they start); a starting client's
        answer waits for its route queries (``chronomq.rocketmq_startup``)."""
        self._heard_from(context)
        client = _client_id(context)
        try:
            with self._budget.hold(STREAM, context.peer()):
                for command in request_iterator:
                    if command.HasField("settings"):
                        asked = command.settings
                        self.routes.wait_for_routes(client, [
                            *(t.name for t in asked.publishing.topics),
                            *(e.topic.name for e in asked.subscription.subscriptions)])
                        settings = self._settings(command.settings)
                        refused = _lite_refusal(command.settings.client_type)
                        yield rs.TelemetryCommand(
                            status=_status(Code.UNSUPPORTED, refused) if refused else _ok(),
                            settings=settings)
                    # thread stack traces and verify results are never asked for: ignored
        except ResourceExhausted as exc:
            yield rs.TelemetryCommand(status=_status(Code.TOO_MANY_REQUESTS, str(exc)))

    def _settings(self, asked: Any) -> Any:
        out = rd.Settings()
        out.CopyFrom(asked)
        config = self._broker.config
        initial, most = PRODUCER_BACKOFF_MS
        out.backoff_policy.CopyFrom(rd.RetryPolicy(  # every client reads one: never absent
            max_attempts=PRODUCER_ATTEMPTS,
            exponential_backoff=rd.ExponentialBackoff(
                initial=_duration_ms(initial), max=_duration_ms(most), multiplier=2.0)))
        if asked.HasField("publishing") or asked.client_type == rd.PRODUCER:
            out.publishing.max_body_size = config.store.max_body_bytes
            out.publishing.validate_message_type = True
        if asked.HasField("subscription"):
            sub = out.subscription
            sub.fifo = False
            sub.receive_batch_size = config.pop.max_messages_cap
            lpt = asked.subscription.long_polling_timeout
            asked_ms = lpt.seconds * 1000 + lpt.nanos // 1_000_000
            sub.long_polling_timeout.CopyFrom(_duration_ms(
                min(asked_ms or self._max_wait_ms, self._max_wait_ms)))
            policy = self._broker.pop.policy(asked.subscription.group.name)
            out.backoff_policy.CopyFrom(rd.RetryPolicy(
                max_attempts=policy.max_attempts,
                customized_backoff=rd.CustomizedBackoff(
                    next=[_duration_ms(ms) for ms in policy.backoff_ms])))
        out.metric.on = False
        return out

    # ------------------------------------------------------------------ send

    def _draft(self, m: Any, now: int) -> Draft:
        sp = m.system_properties
        if sp.message_type in _UNSUPPORTED_TYPES or sp.message_group:
            kind = _UNSUPPORTED_TYPES.get(sp.message_type, "FIFO")
            raise _Refused(Code.UNSUPPORTED if kind != "FIFO"
                           else Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED,
                           f"{kind} messages are not supported by chronomq; send NORMAL or "
                           "DELAY messages")
        topic = self._topic(m.topic.name)
        limit = self._broker.config.store.max_body_bytes
        body = bytes(m.body)
        if sp.body_encoding == rd.GZIP:
            body = _inflate(body, limit)
        if not body:
            raise _Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
        if len(body) > limit:
            raise _Refused(Code.MESSAGE_BODY_TOO_LARGE,
                           f"the body is {len(body)} bytes, over the maximum of {limit} "
                           "(store.max_body_bytes)")
        try:
            validate_message_id(sp.message_id)
        except InvalidArgument as exc:
            raise _Refused(Code.ILLEGAL_MESSAGE_ID, str(exc)) from exc
        due, flags = now, 0
        if sp.HasField("delivery_timestamp"):
            try:
                due, flags = self._broker.resolve_deliver_at(
                    timestamp_ms(sp.delivery_timestamp), 0, now)
            except ChronomqError as exc:
                raise _Refused(Code.ILLEGAL_DELIVERY_TIME, str(exc)) from exc
        elif sp.message_type == rd.DELAY:
            raise _Refused(Code.ILLEGAL_DELIVERY_TIME,
                           "a DELAY message needs system_properties.delivery_timestamp")
        if len(sp.tag.encode()) > MAX_TAG_BYTES or "|" in sp.tag:
            raise _Refused(Code.ILLEGAL_MESSAGE_TAG,
                           f"a tag has at most {MAX_TAG_BYTES} bytes and no '|'")
        keys = list(sp.keys)
        if any(not k or k.split() != [k] for k in keys):
            raise _Refused(Code.ILLEGAL_MESSAGE_KEY, "a key is empty or contains whitespace")
        if len(" ".join(keys).encode()) > MAX_KEY_BYTES:
            raise _Refused(Code.ILLEGAL_MESSAGE_KEY,
                           f"the keys are longer than {MAX_KEY_BYTES} bytes together")
        props = dict(m.user_properties)
        if len(keys) > 1:
            props[PROP_KEYS] = " ".join(keys)
        try:
            encoded = encode_properties(props, MAX_PROPERTIES_BYTES)
        except InvalidArgument as exc:
            raise _Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, str(exc)) from exc
        born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now
        if not 0 <= born < MAX_TIME_MS:
            raise _Refused(Code.BAD_REQUEST, f"born_timestamp is out of range ({born} ms)")
        draft = Draft(sp.message_id, topic.name, keys[0] if keys else "", sp.tag, body,
                      encoded, born or now, due, flags)
        try:
            self._broker.check(draft)
        except ChronomqError as exc:
            raise _Refused(_code_of(exc), str(exc)) from exc
        return draft

    def SendMessage(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        n = len(request.messages)
        if not 1 <= n <= MAX_SEND_BATCH:
            return rs.SendMessageResponse(status=_status(
                Code.BAD_REQUEST, f"SendMessage takes 1 to {MAX_SEND_BATCH} messages"))
        now = self._broker.clock.now_ms()
        refused: dict[int, Any] = {}
        drafts: list[Draft] = []
        for i, m in enumerate(request.messages):
            try:
                drafts.append(self._draft(m, now))
            except _Refused as exc:
                refused[i] = _status(exc.code, str(exc))
        try:
            submission = self._broker.submit(drafts, now)
            stored = iter(self._broker.stored(submission))
        except ChronomqError as exc:
            status = _status(_code_of(exc), str(exc))
            return rs.SendMessageResponse(status=status, entries=[
                rs.SendResultEntry(status=refused.get(i, status),
                                   message_id=m.system_properties.message_id)
                for i, m in enumerate(request.messages)])
        self._count(sent=len(submission.duplicate) - sum(submission.duplicate))
        dup = iter(submission.duplicate)
        entries = []
        for i, m in enumerate(request.messages):
            mid = m.system_properties.message_id
            if i in refused:
                entries.append(rs.SendResultEntry(status=refused[i], message_id=mid))
                continue
            offset = 0
            if not next(dup):  # a repeat was stored before: same answer, no offset
                info = next(stored)
                mid, offset = info.message_id, info.queue_offset  # the broker's if none
            delayed = m.system_properties.HasField("delivery_timestamp")
            entries.append(rs.SendResultEntry(status=_ok(), message_id=mid, offset=offset,
                                              recall_handle=mid if delayed else ""))
        return rs.SendMessageResponse(status=_summary([e.status for e in entries]),
                                      entries=entries)

    def RecallMessage(self, request: Any, context: Context) -> Any:
        """Cancel a delayed message before its delivery time (the handle is its id)."""
        self._heard_from(context)
        mid = request.recall_handle
        try:
            validate_message_id(mid)
            if not mid:
                raise InvalidArgument("the recall handle is empty")
            outcome = self._broker.timer.cancel(mid, request.topic.name)
        except ChronomqError as exc:
            return rs.RecallMessageResponse(status=_status(_code_of(exc), str(exc)))
        if outcome is TimerOutcome.CANCELLED:
            return rs.RecallMessageResponse(status=_ok(), message_id=mid)
        if outcome is TimerOutcome.ALREADY_DELIVERED:
            return rs.RecallMessageResponse(status=_status(
                Code.BAD_REQUEST, f"message {mid!r} was already delivered: a recall must "
                "come before its delivery time"))
        return rs.RecallMessageResponse(status=_status(
            Code.NOT_FOUND, f"message {mid!r} is not a pending delayed message"))

    # ------------------------------------------------------------------ receive

    def ReceiveMessage(self, request: Any, context: Context) -> Iterator[Any]:
        self._heard_from(context)
        try:
            got, invisible_s = self._receive(request, context)
        except _Refused as exc:
            yield rs.ReceiveMessageResponse(status=_status(exc.code, str(exc)))
            return
        except ChronomqError as exc:
            yield rs.ReceiveMessageResponse(status=_status(_code_of(exc), str(exc)))
            return
        if not got:
            yield rs.ReceiveMessageResponse(status=_status(
                Code.MESSAGE_NOT_FOUND, "no message became visible before the long-polling "
                "timeout"))
            return
        self._count(received=len(got))
        if request.auto_renew:
            self.leases.track(request.group.name, _client_id(context), got,
                              self._broker.clock.now_ms(), invisible_s)
        yield rs.ReceiveMessageResponse(status=_ok())
        for p in got:
            yield rs.ReceiveMessageResponse(message=_message(p, request.message_queue,
                                                             invisible_s))
        yield rs.ReceiveMessageResponse(delivery_timestamp=_timestamp(
            self._broker.clock.now_ms()))

    def _receive(self, request: Any, context: Context) -> tuple[list[PoppedMessage], int]:
        group = self._group(request.group)
        topic = self._topic(request.message_queue.topic.name).name
        tf = tag_filter(request.filter_expression)
        cap = self._broker.config.pop.max_messages_cap
        if request.batch_size < 1:
            raise _Refused(Code.BAD_REQUEST, "batch_size must be at least 1")
        invisible_s = duration_s(request.invisible_duration) \
            if request.HasField("invisible_duration") else DEFAULT_INVISIBLE_S
        if not 1 <= invisible_s <= MAX_INVISIBLE_TIME_S:
            raise _Refused(Code.ILLEGAL_INVISIBLE_TIME,
                           f"invisible_duration must be 1 s to {MAX_INVISIBLE_TIME_S} s")
        pop = self._broker.pop
        want = min(request.batch_size, cap)
        pop.validate(topic, group, want, invisible_s)
        wait_s = self._max_wait_ms / 1000
        if request.HasField("long_polling_timeout"):
            lpt = request.long_polling_timeout
            wait_s = min(wait_s, lpt.seconds + lpt.nanos / 1e9)
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client gives up
            wait_s = min(wait_s, max(remaining - ANSWER_MARGIN_S, 0.0))
        got = pop.pop(topic, group, want, invisible_s, tf)
        if not got and wait_s > 0:  # a long poll: it waits on a place of its own
            with self._budget.hold(LONG_POLL, context.peer()):
                got = list(self._notifier.poll(
                    topic, wait_s, lambda: pop.pop(topic, group, want, invisible_s, tf),
                    context.is_active))
        return got, invisible_s

    # ------------------------------------------------------------------ settle

    def AckMessage(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            group = self._group(request.group)
        except _Refused as exc:
            return rs.AckMessageResponse(status=_status(exc.code, str(exc)))
        if not request.entries:
            return rs.AckMessageResponse(status=_status(
                Code.BAD_REQUEST, "AckMessage needs at least one entry"))
        with self.leases.settling([e.receipt_handle for e in request.entries]) as current:
            outcomes = self._broker.pop.ack_many(group, current)
        self._count(acked=outcomes.count(None))
        entries = [rs.AckMessageResultEntry(
            message_id=e.message_id, receipt_handle=e.receipt_handle,
            status=_ok() if err is None else _status(_code_of(err), str(err)))
            for e, err in zip(request.entries, outcomes, strict=True)]
        return rs.AckMessageResponse(status=_summary([e.status for e in entries]),
                                     entries=entries)

    def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            group = self._group(request.group)
            seconds = duration_s(request.invisible_duration)
            if not 0 <= seconds <= MAX_INVISIBLE_TIME_S:
                raise _Refused(Code.ILLEGAL_INVISIBLE_TIME,
                               f"invisible_duration must be 0 s to {MAX_INVISIBLE_TIME_S} s")
            with self.leases.settling([request.receipt_handle]) as (current,):
                handle = self._broker.pop.change_invisible_time(group, current, seconds)
        except _Refused as exc:
            return rs.ChangeInvisibleDurationResponse(status=_status(exc.code, str(exc)))
        except ChronomqError as exc:
            return rs.ChangeInvisibleDurationResponse(status=_status(_code_of(exc), str(exc)))
        return rs.ChangeInvisibleDurationResponse(status=_ok(), receipt_handle=handle)

    def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            group = self._group(request.group)
        except _Refused as exc:
            return rs.ForwardMessageToDeadLetterQueueResponse(
                status=_status(exc.code, str(exc)))
        reason = (f"forwarded by the client after {request.delivery_attempt} of "
                  f"{request.max_delivery_attempts} attempts")
        with self.leases.settling([request.receipt_handle]) as (current,):
            (err,) = self._broker.pop.dead_letter_many(group, [(current, reason)])
        status = _ok() if err is None else _status(_code_of(err), str(err))
        return rs.ForwardMessageToDeadLetterQueueResponse(status=status)

    # ------------------------------------------------------------------ not supported

    def PullMessage(self, request: Any, context: Context) -> Iterator[Any]:
        yield rs.PullMessageResponse(status=_unsupported("PullMessage"))

    def UpdateOffset(self, request: Any, context: Context) -> Any:
        return rs.UpdateOffsetResponse(status=_unsupported("UpdateOffset"))

    def GetOffset(self, request: Any, context: Context) -> Any:
        return rs.GetOffsetResponse(status=_unsupported("GetOffset"))

    def QueryOffset(self, request: Any, context: Context) -> Any:
        return rs.QueryOffsetResponse(status=_unsupported("QueryOffset"))

    def EndTransaction(self, request: Any, context: Context) -> Any:
        return rs.EndTransactionResponse(status=_status(
            Code.UNSUPPORTED, "transactional messages are not supported by chronomq"))

    def SyncLiteSubscription(self, request: Any, context: Context) -> Any:
        return rs.SyncLiteSubscriptionResponse(status=_unsupported("SyncLiteSubscription"))


@dataclass(slots=True)
class _Lease:
    group: str
    client: str
    handle: str  # the current handle (renewing replaces it)
    received_ms: int
    expire_ms: int
    invisible_s: int


class LeaseRenewer:
    """Keeps the messages of ``auto_renew`` receives (push consumers) invisible while the
    client works on them: shortly before a lease runs out it is extended by the receive's
    invisible duration, for at most ``MAX_RENEW_MS`` and while the client is alive.  The
    client keeps the handle it was given; Ack, ChangeInvisibleDuration and
    ForwardMessageToDeadLetterQueue translate it to the current one, which ends the
    renewing.  Thread-safe: settling and renewing a handle are serialised."""

    def __init__(self, pop: PopService, alive: Callable[[str], bool]) -> None:
        self._pop = pop
        self._alive = alive
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}  # handle as issued -> its lease

    def count(self) -> int:
        with self._lock:
            return len(self._leases)

    def track(self, group: str, client: str, got: list[PoppedMessage], now_ms: int,
              invisible_s: int) -> None:
        expire = now_ms + invisible_s * 1000
        with self._lock:
            for p in got:
                self._leases[p.receipt_handle] = _Lease(group, client, p.receipt_handle,
                                                        now_ms, expire, invisible_s)

    @contextmanager
    def settling(self, handles: list[str]) -> Iterator[list[str]]:
        """The current handles for ``handles`` while they are settled; they stop being
        renewed."""
        with self._lock:
            yield [lease.handle if (lease := self._leases.pop(h, None)) else h
                   for h in handles]

    def renew_due(self, now_ms: int) -> int:
        """Renew the leases within ``RENEW_AHEAD_MS`` of their deadline; returns how many."""
        renewed = 0
        with self._lock:
            for issued, lease in list(self._leases.items()):
                if lease.expire_ms - now_ms > RENEW_AHEAD_MS:
                    continue
                if (lease.expire_ms <= now_ms or now_ms - lease.received_ms >= MAX_RENEW_MS
                        or not self._alive(lease.client)):
                    del self._leases[issued]  # left to run out: revive redelivers it
                    continue
                try:
                    lease.handle = self._pop.change_invisible_time(
                        lease.group, lease.handle, lease.invisible_s)
                except ChronomqError:  # acknowledged or dead-lettered meanwhile
                    del self._leases[issued]
                    continue
                lease.expire_ms = now_ms + lease.invisible_s * 1000
                renewed += 1
        return renewed


def _client_id(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


def _unsupported(rpc: str) -> Any:
    return _status(Code.UNSUPPORTED, f"{rpc} is not supported by chronomq: consume with a "
                   "SimpleConsumer (or PushConsumer), which pops with an invisible time")


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


def _message(p: PoppedMessage, queue: Any, invisible_s: int) -> Any:
    m: Message = p.message
    props = dict(m.properties)
    keys = props.pop(PROP_KEYS, "").split() or ([m.key] if m.key else [])
    delayed = bool(m.flags & FLAG_TIMER_DELIVERY) and m.delivery_attempt == 0
    sp = rd.SystemProperties(
        keys=keys, message_id=m.message_id,
        body_digest=rd.Digest(type=rd.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
        body_encoding=rd.IDENTITY, message_type=rd.DELAY if delayed else rd.NORMAL,
        born_timestamp=_timestamp(m.born_at_ms), store_timestamp=_timestamp(m.store_at_ms),
        receipt_handle=p.receipt_handle, queue_id=m.queue_id, queue_offset=m.queue_offset,
        invisible_duration=_duration_ms(invisible_s * 1000),
        delivery_attempt=p.delivery_attempt)
    if m.tag:
        sp.tag = m.tag
    if delayed:
        sp.delivery_timestamp.CopyFrom(_timestamp(m.deliver_at_ms))
    return rd.Message(topic=rd.Resource(resource_namespace=queue.topic.resource_namespace,
                                        name=m.topic),
                      user_properties=props, system_properties=sp, body=m.body)


class AccessKeyAuth:
    """Checks the RocketMQ clients' request signature: exactly one ``authorization:
    MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex
    HMAC-SHA1 of the x-mq-date-time header under the secret key>`` (constant-time)."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._access_key = access_key
        self._secret = secret_key.encode()

    def signed(self, metadata: Metadata) -> bool:
        auth = one_header(metadata, "authorization")
        date = one_header(metadata, "x-mq-date-time")
        if auth is None or date is None:
            return False
        fields = {}
        for part in auth.removeprefix("MQv2-HMAC-SHA1 ").split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value
        expected = hmac.new(self._secret, date.encode(), hashlib.sha1).hexdigest()
        return (hmac.compare_digest(fields.get("Credential", "").encode(),
                                    self._access_key.encode())
                and hmac.compare_digest(fields.get("Signature", "").lower().encode(),
                                        expected.encode()))
