"""``Subscription``: the client's side of a Subscribe stream (``ChronomqClient.subscribe``).

The broker pushes leased messages on the stream; the application settles them (ack,
nack, change of invisible time) from any thread by requests on the same stream.  Closing
it ends the stream: settlements sent before are applied, and what was pushed but not
settled is given back at once rather than at its deadline.  Thread-safe.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import grpc

from chronomq.client.errors import RpcError
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc


class Subscription:
    """A Subscribe stream: iterate ``responses()`` for pushed messages (and reports of
    failed settlements); settle with ``ack``/``nack``/``change`` from any thread.  Close
    it (or use ``with``) to end the stream: what was settled before is applied, and what
    was pushed but not settled is given back at once instead of at its deadline."""

    def __init__(self, stub: pb_grpc.BrokerStub, metadata: tuple[tuple[str, str], ...],
                 first: pb.SubscribeRequest) -> None:
        self._requests: queue.SimpleQueue[pb.SubscribeRequest | None] = queue.SimpleQueue()
        self._requests.put(first)
        self._call = stub.Subscribe(iter(self._requests.get, None), metadata=metadata)
        self._read_lock = threading.Lock()
        self._ended = threading.Event()  # the response stream finished
        self._closing = threading.Event()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def responses(self) -> Iterator[pb.SubscribeResponse]:
        """The stream's responses, until it ends."""
        while (r := self._next()) is not None:
            yield r

    def _next(self) -> pb.SubscribeResponse | None:
        with self._read_lock:  # a gRPC call is read by one thread at a time
            if self._ended.is_set():
                return None
            try:
                return next(self._call)  # type: ignore[no-any-return]
            except StopIteration:
                pass
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    self._ended.set()
                    raise RpcError(exc.code(), exc.details() or "") from exc
            self._ended.set()
            return None

    def messages(self) -> Iterator[pb.ReceivedMessage]:
        for response in self.responses():
            yield from response.messages

    def ack(self, receipt_handles: Iterable[str]) -> None:
        self._requests.put(pb.SubscribeRequest(ack=list(receipt_handles)))

    def nack(self, receipt_handles: Iterable[str], delay_ms: int | None = None,
             dead_letter: bool = False, reason: str = "") -> None:
        items = [pb.NackItem(receipt_handle=h, dead_letter=dead_letter, reason=reason)
                 for h in receipt_handles]
        if delay_ms is not None:
            for item in items:
                item.delay_ms = delay_ms
        self._requests.put(pb.SubscribeRequest(nack=items))

    def change(self, receipt_handle: str, invisible_time_s: int) -> None:
        """The new handle arrives in a response's ``changed``."""
        self._requests.put(pb.SubscribeRequest(change=[pb.InvisibleTimeChange(
            receipt_handle=receipt_handle, invisible_time_s=invisible_time_s)]))

    def close(self, timeout_s: float = 5.0) -> None:
        """End the stream: settlements sent so far are applied first; messages pushed
        and not settled are given back by the broker at once (their attempt counts)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._requests.put(None)

        def drain() -> None:  # read to the end (what comes now is given back anyway)
            try:
                while self._next() is not None:
                    pass
            except RpcError:
                pass

        threading.Thread(target=drain, name="subscription-close", daemon=True).start()
        self._ended.wait(timeout_s)
        self._call.cancel()
