"""A batching producer: one message at a time from the caller, SendStream batches on the
wire.

Code that sends one message per request (a web request that schedules one reminder)
pays a unary round trip and the broker's whole per-request cost for every message.
``Producer.send`` instead queues the message and returns a ``Future`` at once; one
stream feeds what is queued to the broker as ``SendRequest`` batches, the way Kafka,
Pulsar and Pub/Sub client libraries batch:

* **natural batching**: a batch leaves as soon as fewer than ``in_flight`` batches are
  unanswered, holding everything queued by then (at most ``batch_messages`` messages and
  ``batch_bytes`` of bodies); ``linger_ms`` waits that much longer for company when the
  batch is not full (latency traded for fewer, larger requests);
* **a window that follows the answers**: by default ``in_flight`` starts at
  ``AUTO_START`` and doubles, up to ``AUTO_MAX``, whenever an answer comes while every
  slot was taken and a full batch waited (the answers take longer than the caller
  needs to fill the window: with ``tier.durable_ack`` each waits for a tier commit);
* **back-pressure**: at most ``max_pending`` messages wait or fly; ``send`` blocks up to
  ``block_s`` for room, then raises ``BufferFull``;
* **the promise**: a future resolves with the message's ``SendOutcome`` only when the
  broker answered its batch, which it does once the batch is fsynced; a message the
  broker refused fails its future with ``RpcError`` (its status and reason); if the
  stream breaks, the futures of the unanswered batches fail with ``RpcError``
  (UNAVAILABLE, outcome unknown) unless ``idempotent`` is set: then every message carries
  a client-chosen id (one is made when none is given) and unanswered batches are sent
  again on a new stream, up to ``retries`` times, the broker's dedupe window storing each
  id once.  Messages not yet sent go out on the next stream, unless
  ``delivery_timeout_s`` has passed since ``send``: they fail with DEADLINE_EXCEEDED
  (never sent, so never stored) and a resend stops after it too.

Thread-safe: any number of threads may ``send`` at once.  Two threads run per producer:
gRPC's, which draws the batches from ``_requests``, and ``_run``, which opens the stream,
reads the answers and resolves the futures in order (SendStream answers in order).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future

import grpc

from chronomq.client.client import (
    ChronomqClient,
    RpcError,
    SendOutcome,
    message,
    replace_outcome,
    status_by_number,
)
from chronomq.client.errors import (
    FOLLOW_BACKOFF_S,
    HELD_RETRY_S,
    ClientError,
    being_taken_over,
)
from chronomq.v1 import broker_pb2 as pb

MAX_BATCH_MESSAGES = 1000  # the broker's limit per SendRequest
AUTO_START, AUTO_MAX = 4, 32  # the window that follows the answers (``in_flight=None``)


_FOLLOW = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.UNAVAILABLE)


class _Moved(RpcError):
    """A batch refused whole by a broker that is no longer the topic's owner."""


class BufferFull(ClientError):
    """``send`` waited ``block_s`` for room among ``max_pending`` messages."""


class ProducerClosed(ClientError):
    """``send`` after ``close``."""


class _Batch:
    __slots__ = ("attempts", "deadline", "futures", "messages")

    def __init__(self, messages: list[pb.OutgoingMessage],
                 futures: list[Future[SendOutcome]], deadline: float) -> None:
        self.messages = messages
        self.futures = futures
        self.deadline = deadline  # monotonic: no resend after this
        self.attempts = 0


class Producer:
    """``with Producer(client) as p: p.send("orders", b"...", delay_ms=60_000).result()``"""

    def __init__(self, client: ChronomqClient, *, linger_ms: float = 0.0,
                 batch_messages: int = 500, batch_bytes: int = 4 << 20,
                 in_flight: int | None = None,
                 max_pending: int = 20_000, block_s: float = 30.0, idempotent: bool = False,
                 retries: int = 5, delivery_timeout_s: float = 120.0,
                 locate: Callable[[], ChronomqClient] | None = None) -> None:
        """``locate``: where to open each stream (``RoutedClient.producer``: the
        topic's owner, looked up again after a stream broke), so an idempotent producer
        follows its topic to another broker after a failover: a batch the broker refused
        whole as not its own (UNAVAILABLE, NOT_FOUND, FAILED_PRECONDITION) is sent again
        there like an unanswered one."""
        if not 1 <= batch_messages <= MAX_BATCH_MESSAGES:
            raise ValueError(f"batch_messages must be 1..{MAX_BATCH_MESSAGES}")
        if (in_flight is not None and in_flight < 1) or max_pending < 1 or batch_bytes < 1 \
                or linger_ms < 0:
            raise ValueError("in_flight, max_pending and batch_bytes must be positive, "
                             "linger_ms not negative")
        self._client = client
        self._locate = locate
        self.linger_s = linger_ms / 1000
        self.batch_messages, self.batch_bytes = batch_messages, batch_bytes
        self._auto = in_flight is None
        self.in_flight = AUTO_START if in_flight is None else in_flight
        self.max_pending, self.block_s = max_pending, block_s
        self._window_full = False  # a full batch waited for a slot since the last answer
        self.idempotent, self.retries = idempotent, retries
        self.delivery_timeout_s = delivery_timeout_s
        self.batches_sent = 0
        self._cond = threading.Condition()
        # (message, its future, the monotonic time its delivery times out)
        self._queued: deque[tuple[pb.OutgoingMessage, Future[SendOutcome], float]] = deque()
        self._retry: deque[_Batch] = deque()  # unanswered batches of a broken stream
        self._flying: deque[_Batch] = deque()
        self._count = 0  # queued + retry + flying messages
        self._closing = False
        self._stream = 0  # bumped when a stream ends: its request generator stops
        self.streams_opened = 0
        self._thread = threading.Thread(target=self._run, name="chronomq-producer",
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the caller's side

    def send(self, topic: str, body: bytes, *, key: str = "", tag: str = "",
             properties: Mapping[str, str] | None = None, deliver_at_ms: int | None = None,
             delay_ms: int | None = None, message_id: str = "",
             replace: bool = False, if_delivered: str = "NEW_ID") -> Future[SendOutcome]:
        """Queue one message; the future resolves once it is durable (see the module).
        ``replace``, ``if_delivered``: debounce by ``message_id``
        (``chronomq.client.message``)."""
        if self.idempotent and not message_id and not replace:
            message_id = uuid.uuid4().hex.upper()
        m = message(topic, body, key=key, tag=tag, properties=properties,
                    deliver_at_ms=deliver_at_ms, delay_ms=delay_ms, message_id=message_id,
                    replace=replace, if_delivered=if_delivered)
        future: Future[SendOutcome] = Future()
        deadline = time.monotonic() + self.block_s
        with self._cond:
            while self._count >= self.max_pending and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferFull(f"{self._count} messages pending for {self.block_s} s; "
                                     "is the broker reachable?")
                self._cond.wait(left)
            if self._closing:
                raise ProducerClosed("the producer is closed")
            self._queued.append((m, future, time.monotonic() + self.delivery_timeout_s))
            self._count += 1
            self._cond.notify_all()
        return future

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything sent so far is answered; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout_s)

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Send what is queued, wait for the answers (at most ``timeout_s``), end the
        stream.  Futures still unanswered then fail with ``RpcError`` (CANCELLED)."""
        with self._cond:
            if self._closing:
                return
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(5.0)
        self._fail_all(grpc.StatusCode.CANCELLED, "the producer closed before an answer")

    # ------------------------------------------------------------------ the stream

    def _requests(self, stream: int) -> Iterator[pb.SendRequest]:
        """The stream's requests: one batch each, when fewer than ``in_flight`` fly."""
        while True:
            with self._cond:
                batch = self._next_batch(stream)
                if batch is None:
                    return
                self._flying.append(batch)
                self.batches_sent += 1
            yield pb.SendRequest(messages=batch.messages)

    def _next_batch(self, stream: int) -> _Batch | None:
        """Wait (holding ``_cond``) for a batch to send; None when the stream is to end."""
        cond = self._cond
        while True:
            if self._stream != stream or (self._closing and not self._flying):
                return None
            if len(self._flying) >= self.in_flight:
                if len(self._queued) >= self.batch_messages:
                    self._window_full = True
                cond.wait()
                continue
            if self._retry:
                batch = self._retry.popleft()
                batch.attempts += 1
                return batch
            if not self._queued:
                cond.wait()
                continue
            if self.linger_s and len(self._queued) < self.batch_messages:
                end = time.monotonic() + self.linger_s
                while (len(self._queued) < self.batch_messages and not self._closing
                       and self._stream == stream
                       and (left := end - time.monotonic()) > 0):
                    cond.wait(left)
                if self._stream != stream:
                    return None
            taken = self._take()
            if taken is not None:
                return taken

    def _take(self) -> _Batch | None:
        """Up to one batch of the queued messages (None if all were cancelled)."""
        messages: list[pb.OutgoingMessage] = []
        futures: list[Future[SendOutcome]] = []
        size = 0
        deadline = float("inf")
        queued = self._queued
        while queued and len(messages) < self.batch_messages:
            m, f, expiry = queued[0]
            if messages and size + len(m.body) > self.batch_bytes:
                break
            queued.popleft()
            if not f.set_running_or_notify_cancel():  # cancelled by the caller: drop
                self._count -= 1
                self._cond.notify_all()
                continue
            deadline = min(deadline, expiry)
            messages.append(m)
            futures.append(f)
            size += len(m.body)
        return _Batch(messages, futures, deadline) if messages else None

    def _run(self) -> None:
        backoff = 0.05
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._queued or self._retry)
                if self._closing:
                    return
                stream = self._stream
            self.streams_opened += 1
            call = None
            try:
                client = self._locate() if self._locate is not None else self._client
                call = client.stub.SendStream(self._requests(stream),
                                              metadata=client.metadata)
                for response in call:
                    self._answer(response)
                    backoff = 0.05
                error = (grpc.StatusCode.UNAVAILABLE, "the stream ended before an answer")
            except grpc.RpcError as exc:
                error = (exc.code(), exc.details() or "")
            except (RpcError, _Moved) as exc:  # no owner found yet, or the owner moved
                if call is not None:
                    call.cancel()
                error = (exc.code, exc.details)
            except Exception as exc:  # a broken answer or a closed channel: fail its batches
                if call is not None:
                    call.cancel()
                error = (grpc.StatusCode.CANCELLED if isinstance(exc, ValueError)
                         else grpc.StatusCode.INTERNAL, f"producer: {exc}")
            self._broken(*error)
            held = error[0] == grpc.StatusCode.UNAVAILABLE and being_taken_over(error[1])
            with self._cond:  # a back-off, cut short by close()
                if self._cond.wait_for(lambda: self._closing,
                                       HELD_RETRY_S if held else backoff):
                    return  # close() fails what is left
            if not held:  # held: the owner, adopting the topic, answers in a moment
                backoff = min(FOLLOW_BACKOFF_S, backoff * 2)

    def _answer(self, response: pb.SendResponse) -> None:
        with self._cond:
            batch = self._flying[0]
        results = response.results
        if len(results) != len(batch.futures):
            raise RuntimeError(f"{len(results)} answers for {len(batch.futures)} messages")
        codes = {r.error.code if r.WhichOneof("outcome") == "error" else 0 for r in results}
        if self._locate is not None and self.idempotent and len(codes) == 1 and \
                codes <= {c.value[0] for c in _FOLLOW}:
            r = results[0]  # refused whole where it was sent: resend at the owner
            raise _Moved(status_by_number(r.error.code), r.error.message)
        with self._cond:
            self._flying.popleft()
            if self._auto and self._window_full:  # the window held the caller back
                self.in_flight = min(AUTO_MAX, self.in_flight * 2)
            self._window_full = False
        for r, f in zip(results, batch.futures, strict=True):
            if r.WhichOneof("outcome") == "error":
                f.set_exception(RpcError(status_by_number(r.error.code), r.error.message))
            else:
                f.set_result(SendOutcome(r.message_id, r.deliver_at_ms,
                                         duplicate=r.duplicate, replaced=r.replaced,
                                         replace_outcome=replace_outcome(r)))
        with self._cond:  # counted out only once resolved: flush() returns after them
            self._count -= len(batch.futures)
            self._cond.notify_all()

    def _broken(self, code: grpc.StatusCode, details: str) -> None:
        """The stream ended: resend or fail its unanswered batches."""
        failed: list[Future[SendOutcome]] = []
        expired: list[Future[SendOutcome]] = []
        now = time.monotonic()
        with self._cond:
            self._stream += 1
            for batch in reversed(self._flying):
                if (self.idempotent and batch.attempts < self.retries and not self._closing
                        and now < batch.deadline):
                    self._retry.appendleft(batch)
                else:
                    failed += batch.futures
                    self._count -= len(batch.futures)
            self._flying.clear()
            while self._queued and self._queued[0][2] <= now:  # not sent in time
                expired.append(self._queued.popleft()[1])
                self._count -= 1
            self._cond.notify_all()
        why = f"{code.name}: {details}; the outcome of this send is unknown"
        for f in failed:
            f.set_exception(RpcError(code, why))
        late = RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"not sent within "
                        f"{self.delivery_timeout_s} s (last stream error: {code.name}: "
                        f"{details})")
        for f in expired:
            if f.set_running_or_notify_cancel():
                f.set_exception(late)

    def _fail_all(self, code: grpc.StatusCode, details: str) -> None:
        with self._cond:
            waiting = [f for _, f, _ in self._queued]
            sent = [f for b in (*self._retry, *self._flying) for f in b.futures]
            self._queued.clear()
            self._retry.clear()
            self._flying.clear()
            self._count = 0
            self._cond.notify_all()
        for f in waiting:
            if f.set_running_or_notify_cancel():
                f.set_exception(RpcError(code, details))
        for f in sent:
            if not f.done():
                f.set_exception(RpcError(code, details))
