"""A consumer iterator over Subscribe: take, handle and ack one message at a time, with
prefetch and batched acks on the wire.

A worker loop that pops one message, handles it and acks it pays two unary round trips
and two of the broker's per-request costs per message.  ``Consumer`` holds one Subscribe
stream instead:

* **prefetch**: the broker pushes up to ``prefetch`` leased, unsettled messages ahead of
  the loop (the stream's credit), so ``next()`` rarely waits on the network.  By
  default the credit follows the stream by itself: it starts at ``AUTO_START`` and
  grows ``AUTO_GROWTH`` times whenever the loop finds nothing waiting (the broker's
  answers take longer than the loop: with ``tier.durable_ack`` every lease waits for a
  tier commit), up to ``AUTO_MAX`` (the broker's limit), never past what the loop
  handles in half an invisible time (so a prefetched message is not kept past its
  lease) and never past ``PREFETCH_BYTES`` of the bodies seen so far (so large bodies
  do not fill the client's memory); the new credit rides on the next request;
* **batched settlements**: ``ack`` / ``nack`` / ``dead_letter`` queue the settlement and
  return a ``Future`` at once; one request carries everything queued by the time the
  stream can take it and fewer than ``SETTLE_IN_FLIGHT`` requests are unanswered
  (waiting ``ack_linger_ms`` more when set, at most ``ack_batch`` items), tagged with an
  increasing ``settle_id``: while the broker makes acks durable (with
  ``tier.durable_ack``, a tier commit) the next ones gather into one request;
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
from chronomq.client.errors import FOLLOW_BACKOFF_S, HELD_RETRY_S, being_taken_over
from chronomq.v1 import broker_pb2 as pb

FOLLOW = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.UNAVAILABLE)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                       grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED})

_Settlement = tuple[str, pb.NackItem | None, Future[None]]  # handle, nack item or None (ack)
AUTO_START, AUTO_MAX = 256, 10_000  # the credit that follows the stream (``prefetch=None``;
#                                     AUTO_MAX: the most a broker takes, its MAX_CREDIT)
AUTO_GROWTH = 4  # times the credit at each look that found nothing waiting
PREFETCH_BYTES = 64 << 20  # ... never more than this of bodies ahead (by their mean size)
SETTLE_IN_FLIGHT = 4  # settlement requests sent and not yet answered, at most


class Consumer:
    """``for m in consumer: handle(m); consumer.ack(m)`` (see the module)."""

    def __init__(self, client: ChronomqClient, topic: str, group: str, *,
                 invisible_time_s: int = 30, prefetch: int | None = None,
                 tag_expression: str = "", ack_linger_ms: float = 0.0, ack_batch: int = 1000,
                 locate: Callable[[], ChronomqClient] | None = None) -> None:
        """``prefetch``: the stream's credit; None (default) lets it follow the stream
        (see the module).  ``locate``: where to open each stream
        (``RoutedClient.consumer``: the topic's owner, looked up again after a stream
        broke), so the consumer follows its topic to another broker after a failover;
        then NOT_FOUND and FAILED_PRECONDITION are retried too."""
        if (prefetch is not None and prefetch < 1) or ack_batch < 1 or ack_linger_ms < 0:
            raise ValueError("prefetch and ack_batch must be positive, ack_linger_ms "
                             "not negative")
        self._client = client
        self._locate = locate
        self._auto = prefetch is None
        self.credit = AUTO_START if prefetch is None else prefetch
        self._credit_sent = self.credit
        self._invisible_s = invisible_time_s
        self._window_start, self._window_count, self._rate = time.monotonic(), 0, 0.0
        self._taken = self._taken_bytes = 0  # messages handed out, and their bodies' bytes
        self._opening = pb.SubscribeRequest(
            topic=topic, group=group, invisible_time_s=invisible_time_s,
            max_outstanding=self.credit, tag_expression=tag_expression)
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
            item = self._inbox.get_nowait()
        except queue.Empty:  # the loop waits for the network: more credit may help
            if self._auto:
                self._grow()
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
        self._count(len(item.body))
        return item

    def _count(self, body_bytes: int) -> None:
        """Messages handed out per second, over windows of a second; their sizes."""
        self._taken += 1
        self._taken_bytes += body_bytes
        self._window_count += 1
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._rate = self._window_count / (now - self._window_start)
            self._window_start, self._window_count = now, 0

    def _grow(self) -> None:
        # the last whole second's rate, or this second's so far (a quarter second at least)
        now = time.monotonic()
        rate = max(self._rate, self._window_count / max(now - self._window_start, 0.25))
        mean_bytes = self._taken_bytes // self._taken if self._taken else 0
        grown = grown_credit(self.credit, rate, self._invisible_s, mean_bytes)
        if grown != self.credit:
            with self._cond:
                self.credit = grown
                self._cond.notify_all()  # the request stream carries it

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
        cond = self._cond
        with cond:
            self._opening.max_outstanding = self._credit_sent = self.credit
        yield self._opening
        while True:
            with cond:
                cond.wait_for(lambda: (self._queued and len(self._sent) < SETTLE_IN_FLIGHT)
                              or self._stream != stream or (self._closing and not self._queued)
                              or self.credit != self._credit_sent)
                if self._stream != stream or (self._closing and not self._queued):
                    return
                if self._queued and self.linger_s and len(self._queued) < self.ack_batch:
                    end = time.monotonic() + self.linger_s
                    while (len(self._queued) < self.ack_batch and not self._closing
                           and self._stream == stream
                           and (left := end - time.monotonic()) > 0):
                        cond.wait(left)
                    if self._stream != stream:
                        return
                room = self.ack_batch if len(self._sent) < SETTLE_IN_FLIGHT else 0
                batch = [self._queued.popleft()
                         for _ in range(min(room, len(self._queued)))]
                settle_id = 0
                if batch:
                    settle_id, self._next_id = self._next_id, self._next_id + 1
                    self._sent.append((settle_id, batch))
                credit = self.credit if self.credit != self._credit_sent else 0
                self._credit_sent = self.credit
            yield pb.SubscribeRequest(  # settlements, a new credit, or both
                ack=[h for h, item, _ in batch if item is None],
                nack=[item for _, item, _ in batch if item is not None],
                settle_id=settle_id, max_outstanding=credit)

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
            if code == grpc.StatusCode.UNAVAILABLE and being_taken_over(details):
                time.sleep(HELD_RETRY_S)  # the owner, adopting the topic: soon
                continue
            time.sleep(backoff)
            backoff = min(FOLLOW_BACKOFF_S, backoff * 2)

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


def grown_credit(credit: int, rate_per_s: float, invisible_time_s: int,
                 message_bytes: int = 0) -> int:
    """The credit after the loop found nothing waiting: ``AUTO_GROWTH`` times, up to
    ``AUTO_MAX``, to
    what the loop handles (``rate_per_s``) in half an invisible time and to
    ``PREFETCH_BYTES`` of bodies of ``message_bytes`` (their mean so far; 0: unknown),
    never below ``AUTO_START``; never less than ``credit``."""
    cap = min(AUTO_MAX, int(rate_per_s * invisible_time_s / 2))
    if message_bytes > 0:
        cap = min(cap, PREFETCH_BYTES // message_bytes)
    cap = max(AUTO_START, cap)
    return max(credit, min(cap, credit * AUTO_GROWTH))


def _handle(m: pb.ReceivedMessage | str) -> str:
    return m if isinstance(m, str) else m.receipt_handle
