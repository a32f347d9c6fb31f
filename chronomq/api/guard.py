"""The one enforcement point of users and permissions for the gRPC API: every method of
``chronomq.v1.Broker``, streams included, passes here (``chronomq.api.handlers`` calls
it) before its servicer sees a request.

Per call:

1. ``open``: the principal of the call's ``authorization: Bearer <token>`` header
   (``access.principals``: a user, the ``server.auth_token`` admin, or, on a broker
   that needs no credentials, the anonymous one).  None: the call is refused
   UNAUTHENTICATED before anything else, as before users existed.  (Another front, with
   another credential, passes its own ``identify`` and table of rules:
   ``chronomq.rocketmq.access``; the console checks its actions by the API's rows with
   ``Guard.call``.)
2. ``GuardedCall.check`` on each request (a stream: each request as it is read): the
   RPC's row of ``chronomq.api.permissions.RULES``.  A denial raises ``AccessDenied``,
   answered PERMISSION_DENIED with its message (``user 'billing' may not send to topic
   'orders'``); it is counted (Stats ``access.denied``, Prometheus
   ``chronomq_access_denied_total``: one ``Denials`` shared by every front) and logged
   as one line to the ``chronomq.audit`` logger: ``denied user=... action=...
   resource=... rpc=... peer=...``.
3. ``GuardedCall.narrow`` on a unary answer: cut to what the principal may see
   (ListTopics, Stats, QueryMessages, ListSchedules).

A principal allowed everything (the admin token, an open broker) costs one attribute
test per request.  Thread-safe: a call's state is its own; the counter has a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc

from access.errors import AccessDenied, Unauthenticated
from access.principals import Authenticator, Principal
from chronomq.api.handlers import Metadata, bearer_token
from chronomq.api.permissions import RULES, CallState, Rule
from chronomq.api.schedules import schedule_pb
from chronomq.broker import Broker
from chronomq.v1 import broker_pb2 as pb
from store.errors import ChronomqError

audit = logging.getLogger("chronomq.audit")
UNAUTHENTICATED = "missing or wrong bearer token (metadata 'authorization')"
Identify = Callable[[Metadata], Principal | None]


class BrokerLookup:
    """``permissions.Lookup`` over a broker: receipt handles and schedules."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def handle_topic(self, group: str, handle: str) -> str | None:
        return self._broker.pop.handle_topic(group, handle)

    def schedule_topic(self, name: str) -> str | None:
        try:
            return self._broker.schedules.book.get(name).spec.topic
        except ChronomqError:
            return None

    def schedule_topics(self, prefix: str) -> list[tuple[str, str]]:
        return [(s.spec.name, s.spec.topic) for s in self._broker.schedules.book.states()
                if s.spec.name.startswith(prefix)]

    def schedule(self, name: str) -> pb.Schedule:
        return schedule_pb(self._broker.schedules.book.get(name))


class Denials:
    """Every front's refusals of a known principal: counted and audited.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def record(self, exc: AccessDenied, rpc: str, peer: str) -> None:
        with self._lock:
            self.count += 1
        audit.warning("denied user=%r action=%s resource=%r rpc=%s peer=%s", exc.user,
                      exc.action, exc.resource, rpc, peer)


class GuardedCall:
    """One call's principal and the checks of its RPC."""

    __slots__ = ("_guard", "_peer", "_rpc", "_rule", "_state", "principal")

    def __init__(self, guard: Guard, principal: Principal, rpc: str, rule: Rule,
                 peer: Callable[[], str]) -> None:
        self._guard, self.principal, self._rpc, self._rule = guard, principal, rpc, rule
        self._peer = peer
        self._state = CallState()

    def check(self, request: Any) -> None:
        """Raise ``AccessDenied`` when the principal may not make this request."""
        if self.principal.user is None:  # allowed everything
            return
        try:
            self._rule.check(self.principal, request, self._guard.lookup, self._state)
        except AccessDenied as exc:
            self._guard.denied(exc, self._rpc, self._peer())
            raise

    def narrow(self, request: Any, answer: Any) -> Any:
        """``answer`` to ``request`` cut to what the principal may see."""
        if self.principal.user is None or self._rule.narrow is None:
            return answer
        return self._rule.narrow(self.principal, request, answer, self._guard.lookup)


class Guard:
    """The principals and rights of every call of one service (see the module doc)."""

    def __init__(self, authenticator: Authenticator, lookup: Any,
                 rules: dict[str, Rule] = RULES, identify: Identify | None = None,
                 unauthenticated: str = UNAUTHENTICATED,
                 denials: Denials | None = None) -> None:
        """``identify``: the principal of a call's metadata (None: nobody); by default
        its bearer token's (another front passes its own: a signature's access key).
        ``denials``: where refusals are counted (another front shares the API's)."""
        self.authenticator = authenticator
        self.lookup = lookup
        self.rules = rules
        self._identify = identify or self._bearer
        self._unauthenticated = unauthenticated
        self.denials = denials or Denials()

    def _bearer(self, metadata: Metadata) -> Principal | None:
        auth = self.authenticator
        return auth.principal(bearer_token(metadata) if auth.required else None)

    def open(self, rpc: str, context: grpc.ServicerContext) -> GuardedCall:
        """The call's principal; raises ``Unauthenticated`` when it has none."""
        principal = self._identify(context.invocation_metadata() or ())
        if principal is None:
            raise Unauthenticated(self._unauthenticated)
        return GuardedCall(self, principal, rpc, self.rules[rpc], context.peer)

    def call(self, principal: Principal, rpc: str, peer: str) -> GuardedCall:
        """The checks of ``rpc``'s row for a principal known otherwise (the console's
        session), refusals counted and audited with ``peer``."""
        return GuardedCall(self, principal, rpc, self.rules[rpc], lambda: peer)

    def denied(self, exc: AccessDenied, rpc: str, peer: str) -> None:
        self.denials.record(exc, rpc, peer)

    def figures(self) -> dict[str, float]:
        """``access.*`` figures for Stats and /metrics."""
        d = self.authenticator.directory.statistics()
        return {"access.denied": float(self.denials.count), "access.users": float(d.users),
                "access.refresh_failures": float(d.refresh_failures)}

