"""A consumer iterator over Subscribe: take, handle and ack one message at a time, with
prefetch and batched acks on the wire.

A worker loop that pops one message, handles it and acks it pays two unary round trips
and two of the broker's per-request costs per message.  ``Consumer`` holds one Subscribe
stream instead:

* **prefetch**: the broker pushes up to ``prefetch`` leased, unsettled messages ahead of
  the loop (the stream's credit), so ``next()`` rarely waits on the network;
* **batched settlements**: ``ack`` / ``nack`` / ``dead_letter`` queue the settlement and
  return a ``Future`` at once; one request carries everything queued by the time the
  stream can take it (waiting ``ack_linger_ms`` more when set, at most ``ack_batch``
  items), tagged with an increasing ``settle_id``;
* **the promise**: the broker answers ``settled_through = settle_id`` once a request's
  settlements are applied, an ack durable (the same contract as a unary Ack), reporting
  any that failed in ``errors`` first; a future resolves (None) only then, or fails with
  ``RpcError`` carrying the broker's reason (a lease that ran out, an unknown handle);
* **failures**: if the stream breaks, the futures of settlements sent and not answered
  fail with ``RpcError`` (outcome unknown: an ack may or may not have landed, so the
  message may come again: at-least-once); messages prefetched and not yet handed out are
  dropped (the broker gives them back); settlements not yet sent, and the loop, go on
  over a new stream after a back-off.  A refusal that a new stream cannot cure (an
  unknown topic, a bad token) ends the iteration with ``RpcError``.

``close()`` sends the queued settlements, waits for their answers and ends the stream;
what was handed out and not settled is given back by the broker at once.

Threads: gRPC's draws the requests from ``_requests``; ``_run`` reads the responses.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import grpc

from chronomq.client.client import ChronomqClient, RpcError, status_by_number
from chronomq.v1 import broker_pb2 as pb

FOLLOW = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.UNAVAILABLE)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                       grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED})

_Settlement = tuple[str, pb.NackItem | None, Future[None]]  # handle, nack item or None (ack)


class Consumer:
    """``for m in consumer: handle(m); consumer.ack(m)`` (see the module)."""

    def __init__(self, client: ChronomqClient, topic: str, group: str, *,
                 invisible_time_s: int = 30, prefetch: int = 256, tag_expression: str = "",
                 ack_linger_ms: float = 0.0, ack_batch: int = 1000,
                 locate: Callable[[], ChronomqClient] | None = None) -> None:
        """``locate``: where to open each stream (``RoutedClient.consumer``: the topic's
        owner, looked up again after a stream broke), so the consumer follows its topic
        to another broker after a failover; then NOT_FOUND and FAILED_PRECONDITION are
        retried too."""
        if prefetch < 1 or ack_batch < 1 or ack_linger_ms < 0:
            raise ValueError("prefetch and ack_batch must be positive, ack_linger_ms "
                             "not negative")
        self._client = client
        self._locate = locate
        self._opening = pb.SubscribeRequest(
            topic=topic, group=group, invisible_time_s=invisible_time_s,
            max_outstanding=prefetch, tag_expression=tag_expression)
        self.linger_s, self.ack_batch = ack_linger_ms / 1000, ack_batch
        self._cond = threading.Condition()
        self._queued: deque[_Settlement] = deque()
        self._sent: deque[tuple[int, list[_Settlement]]] = deque()  # by settle_id
        self._next_id = 1
        self._stream = 0  # bumped when a stream ends: its request generator stops
        self._closing = False
        self._inbox: queue.SimpleQueue[pb.ReceivedMessage | RpcError | None] = \
            queue.SimpleQueue()
        self._done = False  # the iteration ended (closed or refused)
        self.streams_opened = 0
        self._thread = threading.Thread(target=self._run, name="chronomq-consumer",
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the caller's side

    def __iter__(self) -> Iterator[pb.ReceivedMessage]:
        while (m := self.receive()) is not None:
            yield m

    def receive(self, timeout_s: float | None = None) -> pb.ReceivedMessage | None:
        """The next message; None once closed (or after ``timeout_s`` with none)."""
        if self._done:
            return None
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if item is None:
            self._done = True
            return None
        if isinstance(item, RpcError):
            self._done = True
            raise item
        return item

    def ack(self, m: pb.ReceivedMessage | str) -> Future[None]:
        """Acknowledge; the future resolves once the ack is durable."""
        return self._settle(m, None)

    def nack(self, m: pb.ReceivedMessage | str, delay_ms: int | None = None) -> Future[None]:
        """Give back: visible again after ``delay_ms`` (None: the group's back-off)."""
        item = pb.NackItem(receipt_handle=_handle(m))
        if delay_ms is not None:
            item.delay_ms = delay_ms
        return self._settle(m, item)

    def dead_letter(self, m: pb.ReceivedMessage | str, reason: str = "") -> Future[None]:
        """Move to the group's dead-letter topic now."""
        return self._settle(m, pb.NackItem(receipt_handle=_handle(m), dead_letter=True,
                                           reason=reason))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every settlement queued so far is answered; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queued and not self._sent,
                                       timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Send and wait for the queued settlements, then end the stream."""
        with self._cond:
            if self._closing:
                return
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(5.0)
        self._fail_left(grpc.StatusCode.CANCELLED, "the consumer closed before an answer")
        self._inbox.put(None)

    # ------------------------------------------------------------------ the stream

    def _settle(self, m: pb.ReceivedMessage | str, item: pb.NackItem | None) -> Future[None]:
        future: Future[None] = Future()
        future.set_running_or_notify_cancel()
        with self._cond:
            if self._closing:
                future.set_exception(RpcError(grpc.StatusCode.CANCELLED,
                                              "the consumer is closed"))
                return future
            self._queued.append((_handle(m), item, future))
            self._cond.notify_all()
        return future

    def _requests(self, stream: int) -> Iterator[pb.SubscribeRequest]:
        yield self._opening
        cond = self._cond
        while True:
            with cond:
                cond.wait_for(lambda: self._queued or self._stream != stream or self._closing)
                if self._stream != stream or (self._closing and not self._queued):
                    return
                if self.linger_s and len(self._queued) < self.ack_batch:
                    end = time.monotonic() + self.linger_s
                    while (len(self._queued) < self.ack_batch and not self._closing
                           and self._stream == stream
                           and (left := end - time.monotonic()) > 0):
                        cond.wait(left)
                    if self._stream != stream:
                        return
                batch = [self._queued.popleft()
                         for _ in range(min(self.ack_batch, len(self._queued)))]
                settle_id, self._next_id = self._next_id, self._next_id + 1
                self._sent.append((settle_id, batch))
            yield pb.SubscribeRequest(
                ack=[h for h, item, _ in batch if item is None],
                nack=[item for _, item, _ in batch if item is not None],
                settle_id=settle_id)

    def _run(self) -> None:
        backoff = 0.05
        failed: dict[str, pb.Error] = {}
        while True:
            with self._cond:
                if self._closing:
                    return
                stream = self._stream
            self.streams_opened += 1
            try:
                client = self._where()
                for response in client.stub.Subscribe(
                        self._requests(stream), metadata=client.metadata):
                    for m in response.messages:
                        self._inbox.put(m)
                    for e in response.errors:
                        failed[e.receipt_handle] = e.error
                    if response.settled_through:
                        self._resolve(response.settled_through, failed)
                    backoff = 0.05
                code, details = grpc.StatusCode.UNAVAILABLE, "the stream ended"
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except RpcError as exc:  # the owner could not be found (yet)
                code, details = exc.code, exc.details
            with self._cond:
                self._stream += 1
                self._cond.notify_all()
            self._fail_left(code, details, queued=False)
            failed.clear()
            self._drop_inbox()
            if self._closing:
                return
            if code not in RETRYABLE and not (self._locate is not None and code in FOLLOW):
                self._inbox.put(RpcError(code, details))
                return
            time.sleep(backoff)
            backoff = min(2.0, backoff * 2)

    def _where(self) -> ChronomqClient:
        return self._locate() if self._locate is not None else self._client

    def _resolve(self, through: int, failed: dict[str, pb.Error]) -> None:
        done: list[_Settlement] = []
        with self._cond:
            while self._sent and self._sent[0][0] <= through:
                done += self._sent.popleft()[1]
        for handle, _, future in done:
            err = failed.pop(handle, None)
            if err is None:
                future.set_result(None)
            else:
                future.set_exception(RpcError(status_by_number(err.code), err.message))
        with self._cond:
            self._cond.notify_all()

    def _fail_left(self, code: grpc.StatusCode, details: str, queued: bool = True) -> None:
        """Fail the settlements sent and unanswered (and, with ``queued``, the unsent)."""
        with self._cond:
            left = [s for _, batch in self._sent for s in batch]
            self._sent.clear()
            if queued:
                left += self._queued
                self._queued.clear()
            self._cond.notify_all()
        why = f"{code.name}: {details}; the outcome of this settlement is unknown"
        for _, _, future in left:
            if not future.done():
                future.set_exception(RpcError(code, why))

    def _drop_inbox(self) -> None:
        """Messages prefetched on a stream that ended are the broker's again."""
        kept: list[RpcError | None] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, pb.ReceivedMessage):
                kept.append(item)
        for item in kept:
            self._inbox.put(item)


def _handle(m: pb.ReceivedMessage | str) -> str:
    return m if isinstance(m, str) else m.receipt_handle
