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

Bounded: at most ``MAX_CLIENTS`` clients and ``MAX_TOPICS`` topics each are remembered;
a client is forgotten when it terminates or is gone (``forget``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

SETTINGS_HOLD_S = 3.0
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
