"""``chronomq.v1.Broker`` over grpc.aio: converts protobuf <-> the core and maps errors.

Blocking work (RocksDB, fsync, file reads) runs on a thread pool or on the store's own
threads; the event loop only converts messages and waits on futures.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, TypeVar

import grpc

from chronomq.broker import Broker
from chronomq.errors import code_number, status_of
from chronomq.notify import ArrivalNotifier
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from chronomq.wire import encode_send_response
from pop.service import PoppedMessage, TagFilter
from store.errors import ChronomqError, InvalidArgument
from store.message import (
    MAX_KEY_BYTES,
    MAX_TAG_BYTES,
    DispatchInfo,
    Draft,
    Message,
    encode_properties,
    validate_message_id,
)
from store.topics import Topic

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_SEND_BATCH = 1000
# A str of n characters is at most 4n UTF-8 bytes: below these lengths no encode is needed.
_FAST_KEY_CHARS = MAX_KEY_BYTES // 4
_FAST_TAG_CHARS = MAX_TAG_BYTES // 4
MAX_QUERY = 64


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    code = status_of(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("internal error", exc_info=exc)
    await context.abort(code, str(exc))


def _received(m: Message, handle: str = "", attempt: int = 0) -> pb.ReceivedMessage:
    return pb.ReceivedMessage(
        message_id=m.message_id, topic=m.topic, queue_id=m.queue_id,
        queue_offset=m.queue_offset, key=m.key, tag=m.tag, body=m.body,
        properties=m.properties, born_at_ms=m.born_at_ms, deliver_at_ms=m.deliver_at_ms,
        delivery_attempt=attempt, receipt_handle=handle,
    )


def _topic_pb(t: Topic) -> pb.Topic:
    return pb.Topic(name=t.name, queue_count=t.queue_count, retention_ms=t.retention_ms,
                    retention_bytes=t.retention_bytes)


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, broker: Broker, notifier: ArrivalNotifier, pool: ThreadPoolExecutor,
                 max_wait_ms: int) -> None:
        self._broker = broker
        self._notifier = notifier
        self._pool = pool
        self._max_wait_ms = max_wait_ms
        self.sent = 0
        self.popped = 0

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _call(self, context: grpc.aio.ServicerContext[Any, Any],
                    work: Awaitable[T]) -> T:
        try:
            return await work
        except ChronomqError as exc:
            await _abort(context, exc)
            raise  # abort raises; keeps type checkers honest

    # ------------------------------------------------------------------ topics

    async def CreateTopic(self, request: pb.CreateTopicRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> pb.CreateTopicResponse:
        t = request.topic
        topic = Topic(t.name, t.queue_count or self._broker.config.store.default_queue_count,
                      t.retention_ms, t.retention_bytes)
        created_topic, created = await self._call(
            context, self._blocking(self._broker.create_topic, topic))
        return pb.CreateTopicResponse(topic=_topic_pb(created_topic), created=created)

    async def ListTopics(self, request: pb.ListTopicsRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(
            topics=[_topic_pb(t) for t in self._broker.store.topics.list()])

    async def DeleteTopic(self, request: pb.DeleteTopicRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> pb.DeleteTopicResponse:
        await self._call(context, self._blocking(self._broker.delete_topic, request.name))
        return pb.DeleteTopicResponse(deleted=True)

    # ------------------------------------------------------------------ send

    def _begin_send(self, request: pb.SendRequest) -> Awaitable[pb.SendResponse]:
        """Check and queue one request's messages; the awaitable answers once durable."""
        n = len(request.messages)
        if n == 0:
            raise InvalidArgument("Send needs at least one message")
        if n > MAX_SEND_BATCH:
            raise InvalidArgument(f"at most {MAX_SEND_BATCH} messages per Send request")
        broker = self._broker
        now = broker.clock.now_ms()
        max_body = broker.config.store.max_body_bytes
        errors: dict[int, pb.Error] = {}
        accepted: list[Draft] = []
        checked_topics: set[str] = set()
        new_draft = tuple.__new__
        for i, om in enumerate(request.messages):
            topic, key, tag, body, mid = om.topic, om.key, om.tag, om.body, om.message_id
            try:
                at_ms, delay_ms = om.deliver_at_ms, om.delay_ms
                due = broker.resolve_deliver_at(at_ms, delay_ms, now) if at_ms or delay_ms \
                    else now
                props = om.properties
                d = new_draft(Draft, (mid, topic, key, tag, body, encode_properties(dict(props))
                                      if len(props) else b"", now, due, 0, 0))
                # the full check once per topic and for anything out of the ordinary
                if (mid or topic not in checked_topics or not body or len(body) > max_body
                        or len(key) > _FAST_KEY_CHARS or len(tag) > _FAST_TAG_CHARS):
                    broker.check(d)
                    checked_topics.add(topic)
            except ChronomqError as exc:
                errors[i] = pb.Error(code=code_number(exc), message=str(exc))
                continue
            accepted.append(d)
        fut = broker.send(accepted) if accepted else None
        return self._finish_send(n, errors, fut)

    async def _finish_send(self, n: int, errors: dict[int, pb.Error],
                           fut: Any) -> pb.SendResponse:
        stored: list[DispatchInfo] = await asyncio.wrap_future(fut) if fut is not None else []
        self.sent += len(stored)
        if not errors:
            return pb.SendResponse.FromString(
                encode_send_response((m.message_id, m.deliver_at_ms) for m in stored))
        it = iter(stored)
        results = []
        for i in range(n):
            err = errors.get(i)
            if err is not None:
                results.append(pb.SendResult(error=err))
            else:
                m = next(it)
                results.append(pb.SendResult(message_id=m.message_id,
                                             deliver_at_ms=m.deliver_at_ms))
        return pb.SendResponse(results=results)

    async def Send(self, request: pb.SendRequest,
                   context: grpc.aio.ServicerContext[Any, Any]) -> pb.SendResponse:
        try:
            return await self._begin_send(request)
        except ChronomqError as exc:
            await _abort(context, exc)
            raise

    async def SendStream(self, request_iterator: AsyncIterator[pb.SendRequest],
                         context: grpc.aio.ServicerContext[Any, Any]
                         ) -> AsyncIterator[pb.SendResponse]:
        """Pipelined: the next request is read and queued while earlier ones are flushed;
        responses go out in request order, each once its batch is durable."""
        pending: asyncio.Queue[Awaitable[pb.SendResponse] | None] = asyncio.Queue(maxsize=256)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await pending.put(self._begin_send(request))
            finally:
                await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await pending.get()) is not None:
                yield await item
            await reader
        except ChronomqError as exc:
            reader.cancel()
            await _abort(context, exc)

    # ------------------------------------------------------------------ pop / ack

    async def Pop(self, request: pb.PopRequest,
                  context: grpc.aio.ServicerContext[Any, Any]) -> pb.PopResponse:
        pop = self._broker.pop
        try:
            pop.validate(request.topic, request.group, request.max_messages,
                         request.invisible_time_s)
            tf = TagFilter.parse(request.tag_expression)
        except ChronomqError as exc:
            await _abort(context, exc)
            raise
        wait_ms = min(request.wait_ms, self._max_wait_ms)
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client gives up
            wait_ms = int(min(wait_ms, max(remaining * 1000 - 200, 0)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            arrival = self._notifier.event(request.topic)
            got: list[PoppedMessage] = await self._call(context, self._blocking(
                pop.pop, request.topic, request.group, request.max_messages,
                request.invisible_time_s, tf))
            left = deadline - loop.time()
            if got or left <= 0:
                break
            await self._notifier.wait(arrival, left)
        self.popped += len(got)
        return pb.PopResponse(messages=[
            _received(p.message, p.receipt_handle, p.delivery_attempt) for p in got])

    async def Ack(self, request: pb.AckRequest,
                  context: grpc.aio.ServicerContext[Any, Any]) -> pb.AckResponse:
        if not request.receipt_handles:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Ack needs receipt handles")
        return await self._blocking(self._ack_all, request.group, list(request.receipt_handles))

    def _ack_all(self, group: str, handles: list[str]) -> pb.AckResponse:
        results = []
        for h in handles:
            try:
                self._broker.pop.ack(group, h)
                results.append(pb.AckResult())
            except ChronomqError as exc:
                results.append(pb.AckResult(error=pb.Error(code=code_number(exc),
                                                           message=str(exc))))
        return pb.AckResponse(results=results)

    async def ChangeInvisibleTime(
        self, request: pb.ChangeInvisibleTimeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ChangeInvisibleTimeResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "ChangeInvisibleTime is not available in this version yet")
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ timer control

    async def Cancel(self, request: pb.CancelRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> pb.CancelResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "Cancel needs delayed delivery, which this version does not have yet")
        raise AssertionError("unreachable")

    async def Reschedule(self, request: pb.RescheduleRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.RescheduleResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Reschedule needs delayed delivery, which this version does not have yet")
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ query / stats

    async def QueryMessages(
        self, request: pb.QueryMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryMessagesResponse:
        limit = min(request.max_messages or MAX_QUERY, MAX_QUERY)
        which = request.WhichOneof("selector")
        store = self._broker.store

        def query() -> list[Message]:
            if which == "message_id":
                validate_message_id(request.message_id)
                found = store.query_by_message_id(request.message_id)
                return [m for m in found if not request.topic or m.topic == request.topic]
            if which == "key" and request.key:
                if not request.topic:
                    raise InvalidArgument("a query by key needs the topic")
                return store.query_by_key(request.topic, request.key, limit)
            raise InvalidArgument("QueryMessages needs a key (with its topic) or a message_id")

        found = await self._call(context, self._blocking(query))
        return pb.QueryMessagesResponse(messages=[_received(m) for m in found])

    async def Stats(self, request: pb.StatsRequest,
                    context: grpc.aio.ServicerContext[Any, Any]) -> pb.StatsResponse:
        figures = self.figures()
        return pb.StatsResponse(figures=figures, json=json.dumps(figures, sort_keys=True))

    def figures(self) -> dict[str, float]:
        s = self._broker.store.statistics()
        p = self._broker.pop.statistics()
        out: dict[str, float] = {
            f"commitlog.{k}": float(v) for k, v in asdict(s.commitlog).items()}
        out.update({
            "store.topics": s.topics, "store.queues": s.queues,
            "store.dispatched_offset": s.dispatched_offset,
            "store.dispatch_lag_bytes": s.commitlog.confirmed_offset - s.dispatched_offset,
            "store.messages_appended": s.messages_appended,
            "pop.open_checkpoints": p.open_checkpoints, "pop.popped": p.popped,
            "pop.acked": p.acked, "rpc.sent": self.sent, "rpc.popped": self.popped,
        })
        return out
