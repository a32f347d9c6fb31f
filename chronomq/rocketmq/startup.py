"""Start-up of a RocketMQ 5 client on the front: when to answer its settings.

A client starts by fetching the route of each of its topics, one after another, and
sends its settings on the Telemetry stream as soon as the first route names a new
endpoint.  The official Node.js client (rocketmq-client-nodejs 1.0.8) then waits for the
settings answer, but only listens for it once every route is fetched: an answer that
arrives while it is still fetching routes is dropped, and ``startup()`` waits for the
next settings exchange, five minutes later.  With one topic the answer happens to come
late enough; with four or more it does not (measured against this front).

So the front holds a settings answer until the client has fetched the routes of the
topics its settings name (publishing topics, subscriptions), for at most
``SETTINGS_HOLD_S``.  A route counts as fetched once its answer has left (the RPC's
termination callback), so the settings answer always follows it.  A client that sends
its settings before any route query (the Python and Java clients) is answered at once.

``settings_answer`` is the answer itself: the client's settings completed by the broker's.

Bounded: at most ``MAX_CLIENTS`` clients and ``MAX_TOPICS`` topics each are remembered;
a client is forgotten when it terminates or is gone (``forget``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from chronomq.config import BrokerConfig
from chronomq.rocketmq.codec import duration_pb
from chronomq.rocketmq.pb import definition as rd
from pop.policy import RetryPolicy

SETTINGS_HOLD_S = 3.0
# Producers retry a failed send this often, waiting 10 ms, 20 ms, ... up to 1 s.
PRODUCER_ATTEMPTS, PRODUCER_BACKOFF_MS = 3, (10, 1000)
MAX_CLIENTS = 10_000
MAX_TOPICS = 1_024


class RouteWatch:
    """Which topics each client (by ``x-mq-client-id``) has fetched routes for."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}
        self._cond = threading.Condition()

    def fetched(self, client: str, topic: str) -> None:
        if not client:
            return
        with self._cond:
            topics = self._seen.get(client)
            if topics is None:
                if len(self._seen) >= MAX_CLIENTS:
                    return  # full: such clients are answered without waiting
                topics = self._seen[client] = set()
            if len(topics) < MAX_TOPICS:
                topics.add(topic)
            self._cond.notify_all()

    def wait_for_routes(self, client: str, topics: Iterable[str],
                        timeout_s: float = SETTINGS_HOLD_S) -> bool:
        """Wait until ``client`` has fetched the routes of ``topics`` (True), or the
        timeout passed (False).  Answers at once for a client that has fetched no route
        yet: it is not in the middle of its route queries."""
        wanted = {t for t in topics if t}
        if not client or not wanted:
            return True
        with self._cond:
            if client not in self._seen:
                return True
            return self._cond.wait_for(
                lambda: wanted <= self._seen.get(client, wanted) or
                len(self._seen.get(client, ())) >= MAX_TOPICS, timeout_s)

    def forget(self, client: str) -> None:
        with self._cond:
            self._seen.pop(client, None)
            self._cond.notify_all()

    def clients(self) -> int:
        with self._cond:
            return len(self._seen)


def settings_answer(asked: Any, config: BrokerConfig, max_wait_ms: int,
                    policy: RetryPolicy) -> Any:
    """The client's settings completed by the broker's: a retry policy always (some
    clients crash without one: the producer's, or the group's ``policy`` for consumers),
    the body limit for producers, batch size and long-poll bound for consumers, metrics
    off."""
    out = rd.Settings()
    out.CopyFrom(asked)
    initial, most = PRODUCER_BACKOFF_MS
    out.backoff_policy.CopyFrom(rd.RetryPolicy(  # every client reads one: never absent
        max_attempts=PRODUCER_ATTEMPTS,
        exponential_backoff=rd.ExponentialBackoff(
            initial=duration_pb(initial), max=duration_pb(most), multiplier=2.0)))
    if asked.HasField("publishing") or asked.client_type == rd.PRODUCER:
        out.publishing.max_body_size = config.store.max_body_bytes
        out.publishing.validate_message_type = True
    if asked.HasField("subscription"):
        sub = out.subscription
        sub.fifo = False
        sub.receive_batch_size = config.pop.max_messages_cap
        lpt = asked.subscription.long_polling_timeout
        asked_ms = lpt.seconds * 1000 + lpt.nanos // 1_000_000
        sub.long_polling_timeout.CopyFrom(duration_pb(
            min(asked_ms or max_wait_ms, max_wait_ms)))
        out.backoff_policy.CopyFrom(rd.RetryPolicy(
            max_attempts=policy.max_attempts,
            customized_backoff=rd.CustomizedBackoff(
                next=[duration_pb(ms) for ms in policy.backoff_ms])))
    out.metric.on = False
    return out
