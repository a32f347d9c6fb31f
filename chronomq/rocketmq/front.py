"""The RocketMQ 5 front: ``apache.rocketmq.v2.MessagingService`` over gRPC, mapped onto the
same Broker as the chronomq API.  Official RocketMQ 5 clients (Producer, SimpleConsumer,
PushConsumer) connect to it unchanged.

How the protocol maps onto the core:

- QueryRoute answers one queue per chronomq queue of the topic, on this broker at
  ``rocketmq.advertise_address`` or else the address the client dialled, or on the
  broker serving the topic (``route``).
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
  client has fetched the routes of the topics they name (``chronomq.rocketmq.startup``).
- FIFO, transactional, lite and priority messages, lite consumers (their settings and
  heartbeats), SQL92 filters and the pull API answer with a clear UNSUPPORTED status.

Every unary answer carries ``status.code = OK (20000)`` on success; errors are RocketMQ
codes with chronomq's message.

This module is the servicer: each RPC mapped onto the broker.  Around it: ``codec``
(statuses, codes, protobuf conversions), ``route`` (which broker serves a topic),
``message`` (a RocketMQ message into a Draft with every send check, and a popped message
back), ``startup`` (the settings answer and when to give it), ``renewal`` (push
consumers' lease renewal), ``auth`` and ``access`` (signatures; users' rights per RPC,
checked before a call reaches this servicer) and ``pb`` (the protocol classes from the
official client package).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

import grpc

from chronomq.api.budget import LONG_POLL, STREAM, CallBudget
from chronomq.api.notify import ArrivalNotifier
from chronomq.broker import Broker
from chronomq.rocketmq.codec import (
    Refused,
    client_id,
    code_of,
    duration_s,
    endpoints_pb,
    lite_refusal,
    ok_status,
    status_of,
    summary,
    tag_filter,
    timestamp_pb,
    unsupported,
)
from chronomq.rocketmq.codec import timestamp_ms as timestamp_ms  # re-exported
from chronomq.rocketmq.message import draft_of, message_pb
from chronomq.rocketmq.pb import definition as rd
from chronomq.rocketmq.pb import service as rs
from chronomq.rocketmq.pb import service_grpc as rs_grpc
from chronomq.rocketmq.renewal import MAX_RENEW_MS as MAX_RENEW_MS  # re-exported
from chronomq.rocketmq.renewal import LeaseRenewer
from chronomq.rocketmq.route import moved_route, owner_elsewhere, queues_pb, successor_of
from chronomq.rocketmq.startup import RouteWatch, settings_answer
from pop.service import (
    MAX_INVISIBLE_TIME_S,
    PoppedMessage,
    check_group,
)
from store.errors import (
    ChronomqError,
    InvalidArgument,
    ResourceExhausted,
    TopicNotFound,
)
from store.message import (
    Draft,
    validate_message_id,
)
from store.topics import Topic
from timer.model import TimerOutcome

Context: TypeAlias = grpc.ServicerContext
Code = rd.Code

MAX_SEND_BATCH = 1000
DEFAULT_INVISIBLE_S = 30  # a ReceiveMessage without invisible_duration (push consumers)
ANSWER_MARGIN_S = 0.5  # a long poll answers this long before the client's deadline
CLIENT_GONE_MS = 120_000  # a client not heard of for this long is gone (heartbeats: 10 s)


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
        client = client_id(context)
        if client:
            with self._lock:
                self.clients[client] = self._broker.clock.now_ms()

    def _endpoints(self, asked: Any) -> Any:
        """Where clients reach this broker: the advertised address, else the address the
        client used (it knows how to reach us), else the bound host and port."""
        if not self._broker.config.rocketmq.advertise_address and asked.addresses:
            return asked
        return endpoints_pb(self._endpoint)

    def _topic(self, name: str) -> Topic:
        if not name:
            raise Refused(Code.ILLEGAL_TOPIC, "the request names no topic")
        try:
            return self._broker.topic_or_create(name)
        except TopicNotFound as exc:
            raise Refused(Code.TOPIC_NOT_FOUND, str(exc)) from exc

    @staticmethod
    def _group(resource: Any) -> str:
        try:
            check_group(resource.name)
        except InvalidArgument as exc:
            raise Refused(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from exc
        return str(resource.name)

    # ------------------------------------------------------------------ route / session

    def QueryRoute(self, request: Any, context: Context) -> Any:
        """The route of a topic (``chronomq.rocketmq.route``): here, at the broker that
        took this one over, or at the topic's owner."""
        self._heard_from(context)
        try:
            moved = successor_of(self._broker)
            if moved is not None:  # taken over: its topics are served there now
                name = request.topic.name
                queue_count, broker = moved_route(self._broker, name, moved)
                return self._route(request, name, queue_count, broker, context)
            topic = self._topic(request.topic.name)
            name, queue_count = topic.name, topic.queue_count
            broker = rd.Broker(name=self._broker.config.tier.broker_name, id=0,
                               endpoints=self._endpoints(request.endpoints))
        except Refused as exc:
            owner = owner_elsewhere(self._broker, request.topic.name, exc)
            if owner is None:
                return rs.QueryRouteResponse(status=status_of(exc.code, str(exc)))
            name, queue_count = request.topic.name, self._broker.config.store.default_queue_count
            broker = rd.Broker(name=owner.broker, id=0,
                               endpoints=endpoints_pb(owner.rocketmq_address))
        return self._route(request, name, queue_count, broker, context)

    def _route(self, request: Any, name: str, queue_count: int, broker: Any,
               context: Context) -> Any:
        client = client_id(context)
        if client:  # counted once the answer has left (see chronomq.rocketmq.startup)
            context.add_callback(lambda: self.routes.fetched(client, name))
        return rs.QueryRouteResponse(status=ok_status(),
                                     message_queues=queues_pb(request.topic, queue_count, broker))

    def QueryAssignment(self, request: Any, context: Context) -> Any:
        """Push consumers ask which queues to read: one is enough, as a receive pops every
        queue of the topic."""
        self._heard_from(context)
        try:
            self._group(request.group)
            self._topic(request.topic.name)
        except Refused as exc:
            return rs.QueryAssignmentResponse(status=status_of(exc.code, str(exc)))
        broker = rd.Broker(name=self._broker.config.tier.broker_name, id=0,
                           endpoints=self._endpoints(request.endpoints))
        (queue,) = queues_pb(request.topic, 1, broker)
        return rs.QueryAssignmentResponse(status=ok_status(),
                                          assignments=[rd.Assignment(message_queue=queue)])

    def Heartbeat(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        refused = lite_refusal(request.client_type)
        if refused:
            return rs.HeartbeatResponse(status=status_of(Code.UNSUPPORTED, refused))
        if request.HasField("group"):
            try:
                self._group(request.group)
            except Refused as exc:
                return rs.HeartbeatResponse(status=status_of(exc.code, str(exc)))
        return rs.HeartbeatResponse(status=ok_status())

    def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        with self._lock:
            self.clients.pop(client_id(context), None)
        self.routes.forget(client_id(context))
        return rs.NotifyClientTerminationResponse(status=ok_status())

    def Telemetry(self, request_iterator: Iterable[Any], context: Context) -> Iterator[Any]:
        """Answer every settings command with the client's settings completed by the
        broker's (clients wait for this reply before they start); a starting client's
        answer waits for its route queries (``chronomq.rocketmq.startup``)."""
        self._heard_from(context)
        client = client_id(context)
        try:
            with self._budget.hold(STREAM, context.peer()):
                for command in request_iterator:
                    if command.HasField("settings"):
                        asked = command.settings
                        self.routes.wait_for_routes(client, [
                            *(t.name for t in asked.publishing.topics),
                            *(e.topic.name for e in asked.subscription.subscriptions)])
                        settings = settings_answer(
                            asked, self._broker.config, self._max_wait_ms,
                            self._broker.pop.policy(asked.subscription.group.name))
                        refused = lite_refusal(command.settings.client_type)
                        yield rs.TelemetryCommand(
                            status=status_of(Code.UNSUPPORTED, refused) if refused else ok_status(),
                            settings=settings)
                    # thread stack traces and verify results are never asked for: ignored
        except ResourceExhausted as exc:
            yield rs.TelemetryCommand(status=status_of(Code.TOO_MANY_REQUESTS, str(exc)))

    # ------------------------------------------------------------------ send

    def SendMessage(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        n = len(request.messages)
        if not 1 <= n <= MAX_SEND_BATCH:
            return rs.SendMessageResponse(status=status_of(
                Code.BAD_REQUEST, f"SendMessage takes 1 to {MAX_SEND_BATCH} messages"))
        now = self._broker.clock.now_ms()
        refused: dict[int, Any] = {}
        drafts: list[Draft] = []
        for i, m in enumerate(request.messages):
            try:
                drafts.append(draft_of(m, now, self._broker, self._topic))
            except Refused as exc:
                refused[i] = status_of(exc.code, str(exc))
        try:
            submission = self._broker.sender.submit(drafts, now)
            stored = iter(self._broker.sender.stored(submission))
        except ChronomqError as exc:
            status = status_of(code_of(exc), str(exc))
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
            entries.append(rs.SendResultEntry(status=ok_status(), message_id=mid, offset=offset,
                                              recall_handle=mid if delayed else ""))
        return rs.SendMessageResponse(status=summary([e.status for e in entries]),
                                      entries=entries)

    def RecallMessage(self, request: Any, context: Context) -> Any:
        """Cancel a delayed message before its delivery time (the handle is its id)."""
        self._heard_from(context)
        mid = request.recall_handle
        try:
            validate_message_id(mid)
            if not mid:
                raise InvalidArgument("the recall handle is empty")
            outcome = self._broker.timer.cancel(mid, request.topic.name).outcome
        except ChronomqError as exc:
            return rs.RecallMessageResponse(status=status_of(code_of(exc), str(exc)))
        if outcome is TimerOutcome.CANCELLED:
            return rs.RecallMessageResponse(status=ok_status(), message_id=mid)
        if outcome is TimerOutcome.ALREADY_DELIVERED:
            return rs.RecallMessageResponse(status=status_of(
                Code.BAD_REQUEST, f"message {mid!r} was already delivered: a recall must "
                "come before its delivery time"))
        return rs.RecallMessageResponse(status=status_of(
            Code.NOT_FOUND, f"message {mid!r} is not a pending delayed message"))

    # ------------------------------------------------------------------ receive

    def ReceiveMessage(self, request: Any, context: Context) -> Iterator[Any]:
        self._heard_from(context)
        try:
            got, invisible_s = self._receive(request, context)
        except Refused as exc:
            yield rs.ReceiveMessageResponse(status=status_of(exc.code, str(exc)))
            return
        except ChronomqError as exc:
            yield rs.ReceiveMessageResponse(status=status_of(code_of(exc), str(exc)))
            return
        if not got:
            yield rs.ReceiveMessageResponse(status=status_of(
                Code.MESSAGE_NOT_FOUND, "no message became visible before the long-polling "
                "timeout"))
            return
        if request.auto_renew:  # handles that survive their renewals and a failover
            got = self._broker.pop.renewable(request.group.name, got)
            try:  # durable before the messages leave: a successor renews them too
                self.leases.track(request.group.name, client_id(context), got,
                                  self._broker.clock.now_ms(), invisible_s)
            except ChronomqError as exc:  # their leases run out: they come again
                yield rs.ReceiveMessageResponse(status=status_of(code_of(exc), str(exc)))
                return
        self._count(received=len(got))
        yield rs.ReceiveMessageResponse(status=ok_status())
        for p in got:
            yield rs.ReceiveMessageResponse(message=message_pb(p, request.message_queue,
                                                             invisible_s))
        yield rs.ReceiveMessageResponse(delivery_timestamp=timestamp_pb(
            self._broker.clock.now_ms()))

    def _receive(self, request: Any, context: Context) -> tuple[list[PoppedMessage], int]:
        group = self._group(request.group)
        topic = self._topic(request.message_queue.topic.name).name
        tf = tag_filter(request.filter_expression)
        cap = self._broker.config.pop.max_messages_cap
        if request.batch_size < 1:
            raise Refused(Code.BAD_REQUEST, "batch_size must be at least 1")
        invisible_s = duration_s(request.invisible_duration) \
            if request.HasField("invisible_duration") else DEFAULT_INVISIBLE_S
        if not 1 <= invisible_s <= MAX_INVISIBLE_TIME_S:
            raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
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
        except Refused as exc:
            return rs.AckMessageResponse(status=status_of(exc.code, str(exc)))
        if not request.entries:
            return rs.AckMessageResponse(status=status_of(
                Code.BAD_REQUEST, "AckMessage needs at least one entry"))
        with self.leases.settling([e.receipt_handle for e in request.entries]) as current:
            outcomes = self._broker.pop.ack_many(group, current)
        self._count(acked=outcomes.count(None))
        entries = [rs.AckMessageResultEntry(
            message_id=e.message_id, receipt_handle=e.receipt_handle,
            status=ok_status() if err is None else status_of(code_of(err), str(err)))
            for e, err in zip(request.entries, outcomes, strict=True)]
        return rs.AckMessageResponse(status=summary([e.status for e in entries]),
                                     entries=entries)

    def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            group = self._group(request.group)
            seconds = duration_s(request.invisible_duration)
            if not 0 <= seconds <= MAX_INVISIBLE_TIME_S:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
                               f"invisible_duration must be 0 s to {MAX_INVISIBLE_TIME_S} s")
            with self.leases.settling([request.receipt_handle]) as (current,):
                handle = self._broker.pop.change_invisible_time(group, current, seconds)
        except Refused as exc:
            return rs.ChangeInvisibleDurationResponse(status=status_of(exc.code, str(exc)))
        except ChronomqError as exc:
            return rs.ChangeInvisibleDurationResponse(status=status_of(code_of(exc), str(exc)))
        return rs.ChangeInvisibleDurationResponse(status=ok_status(), receipt_handle=handle)

    def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        self._heard_from(context)
        try:
            group = self._group(request.group)
        except Refused as exc:
            return rs.ForwardMessageToDeadLetterQueueResponse(
                status=status_of(exc.code, str(exc)))
        reason = (f"forwarded by the client after {request.delivery_attempt} of "
                  f"{request.max_delivery_attempts} attempts")
        with self.leases.settling([request.receipt_handle]) as (current,):
            (err,) = self._broker.pop.dead_letter_many(group, [(current, reason)])
        status = ok_status() if err is None else status_of(code_of(err), str(err))
        return rs.ForwardMessageToDeadLetterQueueResponse(status=status)

    # ------------------------------------------------------------------ not supported

    def PullMessage(self, request: Any, context: Context) -> Iterator[Any]:
        yield rs.PullMessageResponse(status=unsupported("PullMessage"))

    def UpdateOffset(self, request: Any, context: Context) -> Any:
        return rs.UpdateOffsetResponse(status=unsupported("UpdateOffset"))

    def GetOffset(self, request: Any, context: Context) -> Any:
        return rs.GetOffsetResponse(status=unsupported("GetOffset"))

    def QueryOffset(self, request: Any, context: Context) -> Any:
        return rs.QueryOffsetResponse(status=unsupported("QueryOffset"))

    def EndTransaction(self, request: Any, context: Context) -> Any:
        return rs.EndTransactionResponse(status=status_of(
            Code.UNSUPPORTED, "transactional messages are not supported by chronomq"))

    def SyncLiteSubscription(self, request: Any, context: Context) -> Any:
        return rs.SyncLiteSubscriptionResponse(status=unsupported("SyncLiteSubscription"))
