"""``chronomq.v1.Broker`` over gRPC: converts protobuf <-> the core.

Runs on the threaded gRPC server (bench/RESULTS.md compares it with grpc.aio).  Each RPC
runs on a worker thread; appends are group committed by the CommitLog writer, so many
concurrent Sends share one fsync.

A Send request's checks and answer live in ``chronomq.api.sends``, the Subscribe stream's
state in ``chronomq.api.subscription``, the Stats figures in ``chronomq.api.figures``;
this module maps each RPC onto the broker.  Errors are raised, not mapped here: the
method handlers (``chronomq.api.handlers``) turn a project error into its status once,
for every method.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeAlias

import grpc

from chronomq.api import schedules
from chronomq.api.budget import LONG_POLL, STREAM, CallBudget
from chronomq.api.errors import status_of
from chronomq.api.figures import broker_figures
from chronomq.api.notify import ArrivalNotifier
from chronomq.api.sends import PendingSend, begin_send, send_response
from chronomq.api.subscription import (
    SETTLE_DRAIN_S,
    STREAM_BATCH,
    STREAM_BATCH_DURABLE,
    STREAM_PIPELINE,
    STREAM_PIPELINE_DURABLE,
    LeaseWaiter,
    Subscription,
    ack_results,
    received_pb,
)
from chronomq.broker import Broker
from chronomq.debounce import Debouncer
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from pop.service import PoppedMessage, TagFilter
from store.errors import ChronomqError, FailedPrecondition, InvalidArgument, NotFound
from store.message import validate_message_id
from store.names import check_readable
from store.topics import Topic

log = logging.getLogger(__name__)
Context: TypeAlias = grpc.ServicerContext

MAX_QUERY = 64


def _check_timer_target(message_id: str, topic: str, rpc: str) -> None:
    """A Cancel or Reschedule names an id and, to narrow it, a topic (a retry topic too)."""
    validate_message_id(message_id)
    if not message_id:
        raise InvalidArgument(f"{rpc} needs a message_id")
    if topic:
        check_readable(topic)


def _topic_pb(t: Topic) -> pb.Topic:
    return pb.Topic(name=t.name, queue_count=t.queue_count, retention_ms=t.retention_ms,
                    retention_bytes=t.retention_bytes, tier_retention_ms=t.tier_retention_ms)


def _taken_by(broker: Broker) -> str:
    """The broker that took ``broker`` over (``tier.failover``), or "" while it serves."""
    lease = broker.lease
    return lease.taken_by if lease is not None and lease.taken_by else ""


class BrokerServicer(pb_grpc.BrokerServicer):
    """Thread-safe: every method may run on many gRPC worker threads at once."""

    def __init__(self, broker: Broker, notifier: ArrivalNotifier, max_wait_ms: int,
                 budget: CallBudget | None = None) -> None:
        self._broker = broker
        self._debouncer = Debouncer(broker)
        self._notifier = notifier
        self._max_wait_ms = max_wait_ms
        self._budget = budget or CallBudget(1000, 1000, 200)
        self._counts_lock = threading.Lock()
        self.sent = 0
        self.popped = 0
        # other fronts' figures, reported by Stats and /metrics too
        self.more_figures: list[Callable[[], dict[str, float]]] = []

    # ------------------------------------------------------------------ topics

    def CreateTopic(self, request: pb.CreateTopicRequest,
                    context: Context) -> pb.CreateTopicResponse:
        t = request.topic
        topic = Topic(t.name, t.queue_count or self._broker.config.store.default_queue_count,
                      t.retention_ms, t.retention_bytes,
                      tier_retention_ms=t.tier_retention_ms)
        created_topic, created = self._broker.create_topic(topic)
        return pb.CreateTopicResponse(topic=_topic_pb(created_topic), created=created)

    def ListTopics(self, request: pb.ListTopicsRequest, context: Context) -> pb.ListTopicsResponse:
        """This broker's own topics (``taken_over_from``: adopted in a takeover), then the
        mounted ones (``mounted_from``).

        A broker that was taken over (its lease names the broker that took it, the Stats
        figure ``lease.taken_over``) lists nothing: it refuses every change, and its
        topics are served by that broker, which lists them.  Left out rather than marked
        (a new field, which clients already deployed would not read): a client that looks
        for the broker listing a topic (``BrokerDirectory``, any version) is sent to the
        owner, and ``chronomq topic list`` shows that this broker serves no topic."""
        if _taken_by(self._broker):
            return pb.ListTopicsResponse()
        mounts = self._broker.mount_reader
        mounted = [pb.Topic(name=name, queue_count=count, mounted_from=m.broker)
                   for m in mounts.mounts().values() for name, count in m.topics().items()]
        adopted = mounts.adopted()
        own = [_topic_pb(t) for t in self._broker.topics()]
        for t in own:
            t.taken_over_from = adopted.get(t.name, "")
        return pb.ListTopicsResponse(topics=own + sorted(mounted, key=lambda t: t.name))

    def DeleteTopic(self, request: pb.DeleteTopicRequest,
                    context: Context) -> pb.DeleteTopicResponse:
        self._broker.delete_topic(request.name)
        return pb.DeleteTopicResponse(deleted=True)

    # ------------------------------------------------------------------ send

    def _begin_send(self, request: pb.SendRequest) -> PendingSend:
        """Check and queue one request's messages (``chronomq.api.sends``)."""
        return begin_send(self._broker, self._debouncer, request)

    def _finish_send(self, pending: PendingSend) -> pb.SendResponse:
        stored = self._broker.sender.stored(pending.submission)
        with self._counts_lock:
            self.sent += len(stored) + len(pending.replaced)
        return send_response(pending, stored)

    def Send(self, request: pb.SendRequest, context: Context) -> pb.SendResponse:
        return self._finish_send(self._begin_send(request))

    def SendStream(self, request_iterator: Iterator[pb.SendRequest],
                   context: Context) -> Iterator[pb.SendResponse]:
        with self._budget.hold(STREAM, context.peer()):
            yield from self._send_stream(request_iterator, context)

    def _send_stream(self, request_iterator: Iterator[pb.SendRequest],
                     context: Context) -> Iterator[pb.SendResponse]:
        """Pipelined: a reader thread checks and queues each request as it arrives while
        this thread answers them in order, each once its batch is durable."""
        pending: queue.Queue[PendingSend | BaseException | None] = queue.Queue(maxsize=1024)

        def read() -> None:
            try:
                for request in request_iterator:
                    pending.put(self._begin_send(request))
            except BaseException as exc:  # handed to the answering thread
                pending.put(exc)
            finally:
                pending.put(None)

        threading.Thread(target=read, name="sendstream-reader", daemon=True).start()
        while (item := pending.get()) is not None:
            if isinstance(item, ChronomqError):
                raise item  # mapped to its status by the handler (chronomq.api.handlers)
            if isinstance(item, BaseException):
                if context.is_active():
                    raise item
                return
            yield self._finish_send(item)

    # ------------------------------------------------------------------ pop / ack

    def Pop(self, request: pb.PopRequest, context: Context) -> pb.PopResponse:
        pop = self._broker.pop
        pop.validate(request.topic, request.group, request.max_messages,
                     request.invisible_time_s)
        tf = TagFilter.parse(request.tag_expression)
        wait_s = min(request.wait_ms, self._max_wait_ms) / 1000
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client gives up
            wait_s = min(wait_s, max(remaining - 0.2, 0.0))

        def fetch() -> list[PoppedMessage]:
            return pop.pop(request.topic, request.group, request.max_messages,
                           request.invisible_time_s, tf)
        got: Sequence[PoppedMessage] = fetch()
        if not got and wait_s > 0:  # a long poll: it waits on a place of its own
            with self._budget.hold(LONG_POLL, context.peer()):
                got = self._notifier.poll(request.topic, wait_s, fetch, context.is_active)
        with self._counts_lock:
            self.popped += len(got)
        return pb.PopResponse(messages=[
            received_pb(p.message, p.receipt_handle, p.delivery_attempt) for p in got])

    def Ack(self, request: pb.AckRequest, context: Context) -> pb.AckResponse:
        if not request.receipt_handles:
            raise InvalidArgument("Ack needs at least one receipt handle")
        outcomes = self._broker.pop.ack_many(request.group, list(request.receipt_handles))
        return pb.AckResponse(results=ack_results(outcomes))

    def ChangeInvisibleTime(self, request: pb.ChangeInvisibleTimeRequest,
                            context: Context) -> pb.ChangeInvisibleTimeResponse:
        handle = self._broker.pop.change_invisible_time(
            request.group, request.receipt_handle, request.invisible_time_s)
        return pb.ChangeInvisibleTimeResponse(receipt_handle=handle)

    def Nack(self, request: pb.NackRequest, context: Context) -> pb.NackResponse:
        if not request.receipt_handles:
            raise InvalidArgument("Nack needs at least one receipt handle")
        delay = request.delay_ms if request.HasField("delay_ms") else None
        outcomes = self._broker.pop.release_many(
            request.group, [(h, delay) for h in request.receipt_handles])
        return pb.NackResponse(results=ack_results(outcomes))

    def DeadLetter(self, request: pb.DeadLetterRequest,
                   context: Context) -> pb.DeadLetterResponse:
        if not request.receipt_handles:
            raise InvalidArgument("DeadLetter needs at least one receipt handle")
        outcomes = self._broker.pop.dead_letter_many(
            request.group, [(h, request.reason) for h in request.receipt_handles])
        return pb.DeadLetterResponse(results=ack_results(outcomes))

    def Subscribe(self, request_iterator: Iterator[pb.SubscribeRequest],
                  context: Context) -> Iterator[pb.SubscribeResponse]:
        """Streaming pull: lease what is visible within the credit, push it, wait for news
        or settlements; a reader thread applies acks, nacks and changes as they come."""
        with self._budget.hold(STREAM, context.peer()):
            yield from self._subscribe(request_iterator, context)

    def _subscribe(self, request_iterator: Iterator[pb.SubscribeRequest],
                   context: Context) -> Iterator[pb.SubscribeResponse]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        sub = Subscription(self._broker, first)
        wake = sub.wake = partial(self._notifier.wake, sub.topic)
        sub.settle(first)

        def ended() -> None:  # cancelled, deadline, client gone: stop waiting now
            sub.close()
            wake()
        context.add_callback(ended)
        threading.Thread(target=sub.read, args=(request_iterator,),
                         name="subscribe-reader", daemon=True).start()
        pop = self._broker.pop
        # durable-ack: each Pop waits for one tier commit, so a stream leases more per Pop,
        # and its leases wait on a thread of their own (``LeaseWaiter``) while it leases
        # what arrives meanwhile, up to STREAM_PIPELINE_DURABLE Pops; else up to
        # STREAM_PIPELINE Pops are leased before the first is waited for (one fsync)
        durable = self._broker.journal.durable_ack
        batch = STREAM_BATCH_DURABLE if durable else STREAM_BATCH
        waiter = LeaseWaiter(pop.wait_popped, wake) if durable else None
        pipeline = STREAM_PIPELINE_DURABLE if durable else STREAM_PIPELINE
        leased: deque[tuple[list[PoppedMessage], int]] = deque()  # not durable yet
        news = sub.has_news if waiter is None else \
            (lambda: sub.has_news() or waiter.has_ready())
        try:
            while context.is_active() and not sub.closed:
                room = sub.room()
                seen = self._notifier.generation(sub.topic)
                in_flight = len(leased) if waiter is None else waiter.pending()
                if room > 0 and in_flight < pipeline:
                    got, ticket = pop.pop_applied(sub.topic, sub.group, min(room, batch),
                                                  sub.invisible_time_s, sub.tag_filter,
                                                  cap=batch)
                    sub.leased(got)
                    if got:
                        if waiter is not None:
                            waiter.add(got, ticket)
                        else:
                            leased.append((got, ticket))
                        if room > len(got) and in_flight + 1 < pipeline:
                            continue  # lease more before waiting for the first
                got = []
                if waiter is not None:  # what is durable by now
                    got = waiter.take()
                elif leased:  # the oldest leases, once durable
                    got, ticket = leased.popleft()
                    pop.wait_popped(ticket)
                report = sub.take_report()  # (taken only when it goes out now)
                if got or report is not None:
                    with self._counts_lock:
                        self.popped += len(got)
                    out = report or pb.SubscribeResponse()
                    out.messages.extend(received_pb(p.message, p.receipt_handle,
                                                  p.delivery_attempt) for p in got)
                    yield out
                    continue
                # nothing to send: wait for an arrival, a settlement that frees credit or
                # needs a report, or a lease running out
                self._notifier.wait(sub.topic, seen, sub.wait_s(), also=news)
            if context.is_active():  # the client half-closed: answer its last settlements
                sub.drain(SETTLE_DRAIN_S)
                report = sub.take_report()
                if report is not None:
                    yield report
        finally:
            if waiter is not None:
                waiter.close()
            sub.close()
            sub.give_back()

    # ------------------------------------------------------------------ schedules

    def CreateSchedule(self, request: pb.CreateScheduleRequest,
                       context: Context) -> pb.CreateScheduleResponse:
        return schedules.create(self._broker, request)

    def UpdateSchedule(self, request: pb.UpdateScheduleRequest,
                       context: Context) -> pb.UpdateScheduleResponse:
        return schedules.update(self._broker, request)

    def ListSchedules(self, request: pb.ListSchedulesRequest,
                      context: Context) -> pb.ListSchedulesResponse:
        return schedules.listing(self._broker, request)

    def PauseSchedule(self, request: pb.ScheduleNameRequest,
                      context: Context) -> pb.ScheduleResponse:
        return schedules.pause(self._broker, request.name, True)

    def ResumeSchedule(self, request: pb.ScheduleNameRequest,
                       context: Context) -> pb.ScheduleResponse:
        return schedules.pause(self._broker, request.name, False)

    def DeleteSchedule(self, request: pb.ScheduleNameRequest,
                       context: Context) -> pb.DeleteScheduleResponse:
        return schedules.delete(self._broker, request.name)

    def TriggerSchedule(self, request: pb.ScheduleNameRequest,
                        context: Context) -> pb.TriggerScheduleResponse:
        return schedules.trigger(self._broker, request.name)

    def NextFires(self, request: pb.NextFiresRequest, context: Context) -> pb.NextFiresResponse:
        return schedules.next_fires(self._broker, request)

    # ------------------------------------------------------------------ timer control

    def Cancel(self, request: pb.CancelRequest, context: Context) -> pb.CancelResponse:
        _check_timer_target(request.message_id, request.topic, "Cancel")
        change = self._broker.timer.cancel(request.message_id, request.topic)
        return pb.CancelResponse(outcome=change.outcome.name, changed=change.changed)

    def Reschedule(self, request: pb.RescheduleRequest,
                   context: Context) -> pb.RescheduleResponse:
        _check_timer_target(request.message_id, request.topic, "Reschedule")
        if request.WhichOneof("delivery") is None:
            raise InvalidArgument("Reschedule needs deliver_at_ms or delay_ms")
        now = self._broker.clock.now_ms()
        due, _ = self._broker.sender.resolve_deliver_at(request.deliver_at_ms,
                                                        request.delay_ms, now)
        change = self._broker.timer.reschedule(request.message_id, due, request.topic)
        return pb.RescheduleResponse(outcome=change.outcome.name, deliver_at_ms=due,
                                     changed=change.changed)

    # ------------------------------------------------------------------ query / stats

    def QueryMessages(self, request: pb.QueryMessagesRequest,
                      context: Context) -> pb.QueryMessagesResponse:
        limit = min(request.max_messages or MAX_QUERY, MAX_QUERY)
        which = request.WhichOneof("selector")
        broker = self._broker
        if which == "message_id":
            validate_message_id(request.message_id)
            found = [m for m in broker.queries.by_message_id(request.message_id)
                     if not request.topic or m.topic == request.topic]
        elif which == "key" and request.key:
            if not request.topic:
                raise InvalidArgument("a query by key needs the topic")
            found = broker.queries.by_key(request.topic, request.key, limit)
        else:
            raise InvalidArgument(
                "QueryMessages needs a key (with its topic) or a message_id")
        return pb.QueryMessagesResponse(messages=[received_pb(m) for m in found])

    def Mount(self, request: pb.MountRequest, context: Context) -> pb.MountResponse:
        try:
            return pb.MountResponse(topics=self._broker.mounts.mount(request.broker))
        except ChronomqError as exc:
            if status_of(exc) != grpc.StatusCode.INTERNAL:
                raise
            # the tier answered nonsense: the departed broker's data, not this broker, is bad
            raise FailedPrecondition(f"cannot mount {request.broker[:140]!r}: {exc}") from exc

    def Takeover(self, request: pb.TakeoverRequest, context: Context) -> pb.TakeoverResponse:
        r = self._broker.takeover(request.broker, request.force)
        return pb.TakeoverResponse(topics=r.topics, pending=r.pending, groups=r.groups,
                                   seconds=r.seconds,
                                   accepting_after_seconds=r.accepting_after_s)

    def Unmount(self, request: pb.UnmountRequest, context: Context) -> pb.UnmountResponse:
        topics = self._broker.mounts.unmount(request.broker)
        if not topics:
            raise NotFound(f"broker {request.broker[:140]!r} is not mounted here")
        return pb.UnmountResponse(topics=topics)

    def Stats(self, request: pb.StatsRequest, context: Context) -> pb.StatsResponse:
        figures = self.figures()
        return pb.StatsResponse(figures=figures, json=json.dumps(figures, sort_keys=True))

    def figures(self) -> dict[str, float]:
        return broker_figures(self._broker, self._budget, self.sent, self.popped,
                              self.more_figures)
