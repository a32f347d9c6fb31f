"""The server side of one Subscribe stream (streaming pull with credit), and the
protobuf shapes the servicer's consuming calls share.

``Subscription`` holds a stream's state, shared by its two threads (the gRPC worker that
pushes leased messages, and the reader of the client's requests): the credit
(``max_outstanding``, at most ``MAX_CREDIT``), the receipt handles it holds with their
deadlines (credit comes back when a message is settled or its lease runs out), and the
report of failed settlements, changed handles and ``settled_through`` waiting to be
sent.  ``settle`` applies one request's acks (durable before the report says so), nacks,
dead letters and invisible-time changes; ``give_back`` makes what a closed stream held
visible again at once.  An idle stream looks for messages only every ``IDLE_WAIT_S``:
arrivals, settlements and shutdown wake it before that.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import NamedTuple

import grpc

from chronomq.api.errors import code_number
from chronomq.broker import Broker
from chronomq.v1 import broker_pb2 as pb
from pop.service import PoppedMessage, TagFilter
from store.errors import ChronomqError, InvalidArgument
from store.message import Message

log = logging.getLogger(__name__)

STREAM_BATCH = 256  # messages leased per Pop on a Subscribe stream
STREAM_BATCH_DURABLE = 1024  # ... with tier.durable_ack (each Pop waits for the tier)
STREAM_PIPELINE = 4  # Pops leased on a stream before the first is waited for
STREAM_PIPELINE_DURABLE = 16  # ... with tier.durable_ack (``LeaseWaiter``)
DEFAULT_CREDIT = 256
MAX_CREDIT = 10_000
IDLE_WAIT_S = 15.0  # an idle Subscribe stream looks for messages at least this often
SETTLE_DRAIN_S = 60.0  # a half-closed stream's last acks: reported once durable, or not


def received_pb(m: Message, handle: str = "", attempt: int = 0) -> pb.ReceivedMessage:
    return pb.ReceivedMessage(
        message_id=m.message_id, topic=m.topic, queue_id=m.queue_id,
        queue_offset=m.queue_offset, key=m.key, tag=m.tag, body=m.body,
        properties=m.properties, born_at_ms=m.born_at_ms, deliver_at_ms=m.deliver_at_ms,
        delivery_attempt=attempt, receipt_handle=handle,
    )


def ack_results(outcomes: list[ChronomqError | None]) -> list[pb.AckResult]:
    return [pb.AckResult() if err is None else pb.AckResult(error=error_pb(err))
            for err in outcomes]


def error_pb(exc: ChronomqError) -> pb.Error:
    return pb.Error(code=code_number(exc), message=str(exc))


class Subscription:
    """One Subscribe stream's state: its credit, the handles it holds, and the reports
    of failed settlements waiting to be sent.  Shared by the stream's two threads."""

    def __init__(self, broker: Broker, first: pb.SubscribeRequest) -> None:
        self.topic, self.group = first.topic, first.group
        self.invisible_time_s = first.invisible_time_s
        self.max_outstanding = first.max_outstanding or DEFAULT_CREDIT
        if self.max_outstanding > MAX_CREDIT:
            raise InvalidArgument(f"max_outstanding must be at most {MAX_CREDIT}")
        self.tag_filter = TagFilter.parse(first.tag_expression)
        broker.pop.validate(self.topic, self.group, 1, self.invisible_time_s)
        self._pop = broker.pop
        self._clock = broker.clock
        self._lock = threading.Lock()
        self._outstanding: dict[str, int] = {}  # receipt handle -> lease deadline (ms)
        self._report: pb.SubscribeResponse | None = None
        self._freed = False
        self.closed = False
        self.wake: Callable[[], None] = lambda: None  # the stream's pusher (``read``)
        self._settler = _Settler(self._pop.wait_acked, self._report_applied, self._lost)

    def room(self) -> int:
        now = self._clock.now_ms()
        with self._lock:
            self._freed = False
            if self._outstanding and min(self._outstanding.values()) <= now:
                self._outstanding = {h: e for h, e in self._outstanding.items() if e > now}
            return self.max_outstanding - len(self._outstanding)

    def leased(self, got: list[PoppedMessage]) -> None:
        expire = self._clock.now_ms() + self.invisible_time_s * 1000
        with self._lock:
            for p in got:
                self._outstanding[p.receipt_handle] = expire

    def wait_s(self) -> float:
        """How long to wait at most: until the next lease runs out (its credit returns).
        Arrivals, settlements and shutdown wake the stream before that; an idle stream
        looks again only every ``IDLE_WAIT_S`` (a safety net), so a thousand idle
        streams cost no steady Pop traffic."""
        with self._lock:
            if not self._outstanding:
                return IDLE_WAIT_S
            first = min(self._outstanding.values())
        return min(1.0, max(0.001, (first - self._clock.now_ms()) / 1000))

    def has_news(self) -> bool:
        return self.closed or self._freed or self._report is not None

    def take_report(self) -> pb.SubscribeResponse | None:
        with self._lock:
            report, self._report = self._report, None
            return report

    def _add_report(self) -> pb.SubscribeResponse:
        if self._report is None:
            self._report = pb.SubscribeResponse()
        return self._report

    def settle(self, request: pb.SubscribeRequest) -> None:
        """Apply one request's acks, nacks and invisible-time changes.  The acks are
        applied here and made durable meanwhile: their credit comes back at once, their
        report (``settled_through``) once they are durable, in the order of the requests
        (``_Settler``), so the next requests need not wait for this one's commit."""
        pop, group = self._pop, self.group
        if request.max_outstanding:  # a later request may change the credit
            self.max_outstanding = min(request.max_outstanding, MAX_CREDIT)
        done: list[tuple[str, ChronomqError | None]] = []
        ticket = 0
        if request.ack:
            handles = list(request.ack)
            outcomes, ticket = pop.ack_applied(group, handles, self._outstanding)
            done += zip(handles, outcomes, strict=True)
        if request.nack:
            release = [(n.receipt_handle, n.delay_ms if n.HasField("delay_ms") else None)
                       for n in request.nack if not n.dead_letter]
            dead = [(n.receipt_handle, n.reason) for n in request.nack if n.dead_letter]
            try:
                if release:
                    done += zip([h for h, _ in release], pop.release_many(group, release),
                                strict=True)
            except ChronomqError as exc:
                done += [(h, exc) for h, _ in release]
            if dead:
                done += zip([h for h, _ in dead], pop.dead_letter_many(group, dead),
                            strict=True)
        changed: list[pb.HandleChange] = []
        for c in request.change:
            try:
                new = pop.change_invisible_time(group, c.receipt_handle, c.invisible_time_s)
                changed.append(pb.HandleChange(old_receipt_handle=c.receipt_handle,
                                               receipt_handle=new))
            except ChronomqError as exc:
                changed.append(pb.HandleChange(old_receipt_handle=c.receipt_handle,
                                               error=error_pb(exc)))
        now = self._clock.now_ms()
        with self._lock:
            for handle, _ in done:
                self._outstanding.pop(handle, None)
            for c, ch in zip(request.change, changed, strict=True):  # one answer per change
                held = self._outstanding.pop(c.receipt_handle, None)
                if ch.receipt_handle and held is not None:
                    self._outstanding[ch.receipt_handle] = now + c.invisible_time_s * 1000
            self._freed = True
        self._settler.add(_Applied(request.settle_id, ticket, done, changed))

    def _report_applied(self, a: _Applied) -> None:
        """What the client is told of a request once its acks are durable."""
        with self._lock:
            for handle, err in a.done:
                if err is not None:
                    self._add_report().errors.append(
                        pb.SettleError(receipt_handle=handle, error=error_pb(err)))
            if a.changed:
                self._add_report().changed.extend(a.changed)
            if a.settle_id:  # applied (acks durable): say so
                report = self._add_report()
                report.settled_through = max(report.settled_through, a.settle_id)
            self._freed = True
        self.wake()

    def _lost(self, exc: ChronomqError) -> None:
        """Acks not durable (the tier failed, or this broker was taken over): the stream
        ends, and the client counts what it had not been told of as unknown."""
        log.warning("a Subscribe stream's acks are not durable (%s): ending the stream", exc)
        self.closed = True
        self.wake()

    def read(self, requests: Iterator[pb.SubscribeRequest]) -> None:
        try:
            for request in requests:
                self.settle(request)
                self.wake()
        except grpc.RpcError:
            pass  # the client went away
        except Exception:
            log.exception("subscribe reader failed")
        finally:
            self.closed = True
            self.wake()

    def drain(self, timeout_s: float) -> None:
        """Wait until every request read so far is reported (or ``timeout_s``)."""
        self._settler.drain(timeout_s)

    def close(self) -> None:
        self.closed = True
        self._settler.stop()

    def give_back(self) -> None:
        """The stream ended: what it holds unsettled is visible again now (a retry copy,
        its attempt counted), not at its deadline."""
        with self._lock:
            held, self._outstanding = list(self._outstanding), {}
        if held:
            try:
                self._pop.release_many(self.group, [(h, 0) for h in held])
            except ChronomqError:
                log.warning("could not give back %d messages of a closed Subscribe "
                            "stream; they come back at their deadline", len(held))


class _Applied(NamedTuple):
    settle_id: int
    ticket: int  # of the acks' write (0: nothing to wait for)
    done: list[tuple[str, ChronomqError | None]]
    changed: list[pb.HandleChange]


class _Settler:
    """Reports a stream's applied requests in order, each once its acks are durable:
    its own thread (started at the first request that waits), so the reader goes on
    applying the next requests meanwhile and one commit confirms many."""

    def __init__(self, wait: Callable[[int], None], report: Callable[[_Applied], None],
                 lost: Callable[[ChronomqError], None]) -> None:
        self._wait, self._report, self._lost = wait, report, lost
        self._cond = threading.Condition()
        self._queue: deque[_Applied] = deque()
        self._busy = False  # the thread holds a request it has not reported yet
        self._thread: threading.Thread | None = None
        self._stopped = self._failed = False

    def add(self, a: _Applied) -> None:
        with self._cond:
            if self._failed:
                return  # the stream is ending: this request is not reported
            if a.ticket or self._queue or self._busy:  # a wait, or a request before it
                self._queue.append(a)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="subscribe-settler",
                                                    daemon=True)
                    self._thread.start()
                self._cond.notify_all()
                return
        self._report(a)  # nothing to wait for, nothing before it: reported now

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopped)
                if not self._queue:
                    return
                a = self._queue.popleft()
                self._busy = True
            try:
                self._wait(a.ticket)
            except ChronomqError as exc:
                with self._cond:
                    self._failed, self._busy = True, False
                    self._queue.clear()
                    self._cond.notify_all()
                self._lost(exc)
                return
            self._report(a)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def drain(self, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class LeaseWaiter:
    """Durable-ack: a Subscribe stream's leased batches wait for the tier on a thread of
    their own (``subscribe-durable``), in order, so the stream leases what arrives in the
    meantime instead of only after the wait: a message due or sent during one tier
    commit waits for the next commit, not for that one and then a whole one more.
    ``take`` gives the batches that are durable, oldest first, and raises the error of a
    failed wait (then nothing after it is given).  Thread-safe."""

    def __init__(self, wait: Callable[[int], None], wake: Callable[[], None]) -> None:
        self._wait = wait
        self._wake = wake
        self._cond = threading.Condition()
        self._queued: deque[tuple[list[PoppedMessage], int]] = deque()
        self._ready: deque[list[PoppedMessage]] = deque()
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, got: list[PoppedMessage], ticket: int) -> None:
        with self._cond:
            self._queued.append((got, ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="subscribe-durable",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        """Batches leased and not yet taken."""
        with self._cond:
            return len(self._queued) + len(self._ready)

    def has_ready(self) -> bool:
        return bool(self._ready) or self._error is not None

    def take(self) -> list[PoppedMessage]:
        """The durable batches, oldest first (empty: none yet)."""
        with self._cond:
            if self._error is not None:
                raise self._error
            out = [p for batch in self._ready for p in batch]
            self._ready.clear()
            return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued or self._closed)
                if self._closed:
                    return
                got, ticket = self._queued[0]
            try:
                self._wait(ticket)
            except BaseException as exc:  # the stream raises it (fenced, tier down)
                with self._cond:
                    self._error = exc
                self._wake()
                return
            with self._cond:
                self._queued.popleft()
                self._ready.append(got)
            self._wake()
