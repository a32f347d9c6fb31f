"""Several brokers, one client: every call goes to the broker that owns its topic.

A topic lives on one broker; with ``tier.claim_topics`` the owner is recorded in the
shared tier (``cluster.ownership``).  ``BrokerDirectory`` finds a topic's owner

* from the shared tier, when given a ``Provider`` of it (the bucket): one read of
  ``owners/<topic>.json``, which names the owner; when that broker's lease says it was
  taken over (``tier.failover``), the broker that took it (``cluster.lease.successor``,
  a chain followed): its lease is written before the owner records are; or
* from the broker addresses it was given: ``ListTopics`` on each in turn, the first that
  has the topic as its own (a broker that does not answer is skipped; one that mounts
  it, or that refused as taken over, is taken only when no other has it);

then keeps one ``ChronomqClient`` per broker and the owner per topic.  A call that the
owner answers with ``NOT_FOUND`` (the topic moved or was deleted; for a send, every
message's result) or with FAILED_PRECONDITION "broker X was taken over by Y"
(``cluster.lease.TakenOver``: X was paused or cut off, Y took over, X came back) forgets
the topic and is tried again at the owner found again; ``UNAVAILABLE`` forgets it too,
and is raised (a send may have been stored: the caller decides; with client-chosen ids a
resend is dropped as a duplicate).  A topic that no broker has, every broker answering,
is NOT_FOUND at once (``NoOwner``): nothing is under way that could bring it.

``RoutedClient`` has the typed client's calls that name a topic.  Settling calls (ack,
nack, dead letter, ChangeInvisibleTime) take the topic too: a receipt handle is valid
only on the broker that leased it.  Mixed-topic sends are split per owner and the
outcomes given back in the order of the messages.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from chronomq.client.client import (
    ChronomqClient,
    RpcError,
    SendOutcome,
    Subscription,
    status_by_number,
)
from chronomq.client.consumer import Consumer
from chronomq.client.errors import FOLLOW_BACKOFF_S, HELD_RETRY_S, being_taken_over
from chronomq.client.producer import Producer
from chronomq.v1 import broker_pb2 as pb

if TYPE_CHECKING:  # a bucket is looked up only when one is given: imported then
    from tiered.provider import Provider

log = logging.getLogger(__name__)

T = TypeVar("T")
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]  # per-message error codes in SendResult
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
# a taken-over broker's refusal (``cluster.lease.TakenOver``): "broker X was taken over by Y"
TAKEN_OVER = re.compile(r"\bbroker \S+ was taken over by ")


def taken_over(details: str) -> bool:
    """Whether a FAILED_PRECONDITION says the broker was taken over: its topics moved."""
    return TAKEN_OVER.search(details) is not None


class NoOwner(RpcError):
    """NOT_FOUND: no broker has the topic.  ``certain``: every broker asked answered
    (or, given only the shared tier, it holds no owner record for the topic), so no
    broker being away or failover under way explains it: a call fails at once instead of
    looking again for ``follow_s``."""

    def __init__(self, details: str, certain: bool) -> None:
        super().__init__(grpc.StatusCode.NOT_FOUND, details)
        self.certain = certain


class BrokerDirectory:
    """Topic -> the broker that owns it, and one client per broker.  Thread-safe."""

    def __init__(self, targets: Sequence[str] = (), tier: Provider | None = None, *,
                 token: str = "", tls_ca_file: str = "", timeout_s: float = 30.0) -> None:
        if not targets and tier is None:
            raise ValueError("give broker addresses, the shared tier, or both")
        self.targets = list(targets)
        self._tier = tier
        self._token, self._tls_ca, self._timeout_s = token, tls_ca_file, timeout_s
        self._lock = threading.Lock()
        self._clients: dict[str, ChronomqClient] = {}
        self._owners: dict[str, str] = {}  # topic -> address
        self._taken_over: set[str] = set()  # addresses that refused as taken over

    def client(self, address: str) -> ChronomqClient:
        with self._lock:
            c = self._clients.get(address)
            if c is None:
                c = self._clients[address] = ChronomqClient(
                    address, self._token, self._tls_ca, self._timeout_s)
            return c

    def locate(self, topic: str) -> str:
        """The address of the broker that owns ``topic`` (``NoOwner``, a NOT_FOUND, if
        none has it)."""
        with self._lock:
            known = self._owners.get(topic)
        if known is not None:
            return known
        address = self._from_tier(topic)
        answered = True
        if address is None or self._refused(address):
            found, answered = self._from_brokers(topic)
            address = found or address
        if address is None:
            away = "" if answered else "; a broker did not answer"
            raise NoOwner(f"no broker has topic {topic!r} (asked: "
                          f"{', '.join(self.targets) or 'the shared tier'}{away})", answered)
        with self._lock:
            self._owners[topic] = address
        return address

    def _from_tier(self, topic: str) -> str | None:
        if self._tier is None:
            return None
        from cluster.lease import successor  # the tier's readers, only with a bucket
        from cluster.ownership import owner_of
        owner = owner_of(self._tier, topic)
        if owner is None:
            return None
        now = successor(self._tier, owner.broker)  # None: not taken over
        return now.address if now is not None and now.address else owner.address

    def await_move(self, topic: str, address: str, until: float) -> None:
        """``address``, where ``topic`` was, did not answer in time (paused, cut off, or
        slow): wait, reading the shared tier, until another broker owns the topic (a
        takeover: ``taken_by`` in the lease), that broker's lease is written again (it
        is alive: try it again), two lease lengths pass with neither, or ``until``
        (monotonic).  A call to a paused broker is not made again, to wait a whole
        time-out more, while its successor is on the way.  At once without the tier, or
        for a broker without a watched lease (no takeover will come)."""
        if self._tier is None:
            return
        from cluster.lease import read_lease, successor
        from cluster.ownership import owner_of
        from tiered.errors import TierError
        try:
            owner = owner_of(self._tier, topic)
            if owner is None:
                return
            broker = (successor(self._tier, owner.broker) or owner).broker
            view, version = read_lease(self._tier, broker)
        except TierError:
            return
        if view is None or view.lease_s <= 0 or view.address != address or view.taken_by:
            return  # (claimed between the look for a successor and this read: follow it)
        end = min(until, time.monotonic() + 2 * view.lease_s)
        pause = 0.1
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(pause, left))
            pause = min(FOLLOW_BACKOFF_S, pause * 2)
            try:  # (a claim writes the lease too: one read sees either)
                if read_lease(self._tier, broker)[1] != version:
                    return  # written again: alive, or claimed (the next look follows)
            except TierError:
                continue

    def _from_brokers(self, topic: str) -> tuple[str | None, bool]:
        """The first broker listing ``topic`` as its own, not known to be taken over;
        else the first of the others that lists it; and whether every broker answered."""
        fallback: tuple[tuple[bool, bool], str] | None = None
        answered = True
        for address in self.targets:
            try:
                listed = [t for t in self.client(address).list_topics() if t.name == topic]
            except RpcError as exc:
                if exc.code == grpc.StatusCode.UNAVAILABLE:
                    answered = False
                    continue  # that broker is down: the topic may be on another
                raise
            if not listed:
                continue
            rank = (self._refused(address), bool(listed[0].mounted_from))
            if rank == (False, False):
                return address, answered
            if fallback is None or rank < fallback[0]:
                fallback = (rank, address)
        return (fallback[1] if fallback is not None else None), answered

    def _refused(self, address: str) -> bool:
        with self._lock:
            return address in self._taken_over

    def forget(self, topic: str) -> None:
        with self._lock:
            self._owners.pop(topic, None)

    def refused_as_taken_over(self, address: str) -> None:
        """``address`` said it was taken over: from now on other brokers listing a topic
        are preferred to it (an older broker still lists its former topics; a broker
        taken over never takes them back)."""
        with self._lock:
            self._taken_over.add(address)

    def for_topic(self, topic: str) -> ChronomqClient:
        return self.client(self.locate(topic))

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


FOLLOW = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
          grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED)


class RoutedClient:
    """The typed client's topic calls, each at the topic's owner (see the module).

    ``follow_s``: how long a call keeps looking for a topic's owner when the broker it
    tried is down (UNAVAILABLE), does not answer in time (DEADLINE_EXCEEDED: paused or
    cut off), no longer has the topic (NOT_FOUND) or was taken over
    (FAILED_PRECONDITION), with back-off from 0.1 s to ``FOLLOW_BACKOFF_S`` (0.25 s),
    while a failover moves the topic (``tier.failover``); 0: look once more, as before.
    A topic its new owner holds while it adopts the topic's state (UNAVAILABLE "being
    taken over") is asked again there every ``HELD_RETRY_S``: it answers once the
    takeover is done.  After DEADLINE_EXCEEDED it calls that broker again only once the
    bucket shows it alive, or when no successor came within two lease lengths
    (``BrokerDirectory.await_move``).  A FAILED_PRECONDITION is followed when it says the
    broker was taken over, else only when the owner found again is another broker.  A
    topic no broker has, every broker answering, is NOT_FOUND at once (``NoOwner``).
    Each refusal followed is logged at DEBUG (``chronomq.client.routing``)."""

    def __init__(self, directory: BrokerDirectory, follow_s: float = 30.0) -> None:
        self.directory = directory
        self.follow_s = follow_s

    def __enter__(self) -> RoutedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.directory.close()

    def _at_owner(self, topic: str, call: Callable[[ChronomqClient], T]) -> T:
        deadline = time.monotonic() + self.follow_s
        backoff, attempt = 0.1, 0
        while True:
            attempt += 1
            address = ""
            try:
                address = self.directory.locate(topic)
                return call(self.directory.client(address))
            except RpcError as exc:
                if exc.code not in FOLLOW or (isinstance(exc, NoOwner) and exc.certain):
                    raise
                log.debug("topic %s at %s: %s %s (attempt %d)", topic, address or "-",
                          exc.code.name, exc.details[:120], attempt)
                if (exc.code == grpc.StatusCode.UNAVAILABLE and being_taken_over(exc.details)
                        and time.monotonic() < deadline):  # the owner, adopting: soon
                    time.sleep(min(HELD_RETRY_S, max(0.0, deadline - time.monotonic())))
                    continue
                self.directory.forget(topic)
                moved = exc.code == grpc.StatusCode.NOT_FOUND
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                    if taken_over(exc.details):  # moved: its successor lists the topic
                        self.directory.refused_as_taken_over(address)
                        moved = True
                    elif self._owner_now(topic) in ("", address):
                        raise  # not a move: the broker refused for its own reason
                if time.monotonic() >= deadline:
                    if attempt == 1 and moved:
                        continue  # look for the owner again, once
                    raise
                if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED and address:
                    self.directory.await_move(topic, address, deadline)
                    continue
                if attempt > 1 or not moved:
                    time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                    backoff = min(FOLLOW_BACKOFF_S, backoff * 2)

    def _owner_now(self, topic: str) -> str:
        try:
            return self.directory.locate(topic)
        except RpcError:
            return ""

    def send(self, messages: Iterable[pb.OutgoingMessage]) -> list[SendOutcome]:
        """One outcome per message, in order; each topic's messages go to its owner."""
        items = list(messages)
        by_topic: dict[str, list[int]] = {}
        for n, m in enumerate(items):
            by_topic.setdefault(m.topic, []).append(n)
        out: list[SendOutcome | None] = [None] * len(items)
        for topic, indexes in by_topic.items():
            answered = self._send_at_owner(topic, [items[n] for n in indexes])
            for n, outcome in zip(indexes, answered, strict=True):
                out[n] = outcome
        return [o for o in out if o is not None]

    def _send_at_owner(self, topic: str, batch: list[pb.OutgoingMessage]
                       ) -> list[SendOutcome]:
        def send(c: ChronomqClient) -> list[SendOutcome]:
            out = c.send(batch)
            codes = {o.error_code for o in out}
            if out and len(codes) == 1 and (
                    codes <= {NOT_FOUND, UNAVAILABLE} or
                    (codes == {FAILED_PRECONDITION} and
                     (taken_over(out[0].error) or self._moved(topic, c)))):
                # the whole batch refused for where it was sent: follow the topic
                raise RpcError(status_by_number(out[0].error_code), out[0].error)
            return out
        return self._at_owner(topic, send)

    def _moved(self, topic: str, was: ChronomqClient) -> bool:
        self.directory.forget(topic)
        now = self._owner_now(topic)
        return bool(now) and self.directory.client(now) is not was

    def pop(self, topic: str, group: str, max_messages: int = 32, invisible_time_s: int = 30,
            wait_ms: int = 0, tag_expression: str = "") -> list[pb.ReceivedMessage]:
        return self._at_owner(topic, lambda c: c.pop(topic, group, max_messages,
                                                     invisible_time_s, wait_ms, tag_expression))

    def ack(self, topic: str, group: str, receipt_handles: Iterable[str]) -> list[str]:
        handles = list(receipt_handles)
        return self._at_owner(topic, lambda c: c.ack(group, handles))

    def nack(self, topic: str, group: str, receipt_handles: Iterable[str],
             delay_ms: int | None = None) -> list[str]:
        handles = list(receipt_handles)
        return self._at_owner(topic, lambda c: c.nack(group, handles, delay_ms))

    def dead_letter(self, topic: str, group: str, receipt_handles: Iterable[str],
                    reason: str = "") -> list[str]:
        handles = list(receipt_handles)
        return self._at_owner(topic, lambda c: c.dead_letter(group, handles, reason))

    def change_invisible_time(self, topic: str, group: str, receipt_handle: str,
                              invisible_time_s: int) -> str:
        return self._at_owner(topic, lambda c: c.change_invisible_time(
            group, receipt_handle, invisible_time_s))

    def subscribe(self, topic: str, group: str, invisible_time_s: int = 30,
                  max_outstanding: int = 256, tag_expression: str = "") -> Subscription:
        """A Subscribe stream at the owner (acks on it go to the same broker)."""
        return self.directory.for_topic(topic).subscribe(
            topic, group, invisible_time_s, max_outstanding, tag_expression)

    def producer(self, topic: str, **settings: Any) -> Producer:
        """An idempotent ``Producer`` whose stream goes to ``topic``'s owner and follows
        it to another broker after a failover (unanswered or refused batches are sent
        again there, until ``delivery_timeout_s``).  Send ``topic``'s messages on it
        (another topic's go to the same broker)."""
        settings.setdefault("idempotent", True)
        settings.setdefault("retries", 1_000_000)  # bounded by delivery_timeout_s
        return Producer(self.directory.for_topic(topic), locate=self._locator(topic),
                        **settings)

    def consumer(self, topic: str, group: str, **settings: Any) -> Consumer:
        """A ``Consumer`` of ``topic`` at its owner that follows it after a failover."""
        return Consumer(self.directory.for_topic(topic), topic, group,
                        locate=self._locator(topic), **settings)

    def _locator(self, topic: str) -> Callable[[], ChronomqClient]:
        first = [True]

        def locate() -> ChronomqClient:
            if not first[0]:  # a stream broke: the owner may have moved
                self.directory.forget(topic)
            first[0] = False
            return self.directory.for_topic(topic)
        return locate

    def query(self, topic: str, key: str = "", message_id: str = "",
              max_messages: int = 32) -> list[pb.ReceivedMessage]:
        return self._at_owner(topic, lambda c: c.query(topic, key, message_id, max_messages))
