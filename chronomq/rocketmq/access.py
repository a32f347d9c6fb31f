"""Users and permissions on the RocketMQ 5 front: who signed a call, and what each RPC of
``apache.rocketmq.v2.MessagingService`` needs.  Enforced by the API's one enforcement
point (``chronomq.api.guard.Guard``) with this front's ``identify`` and table of rules;
refusals counted and audited with the API's (``Denials``).

**Who** (``Signatures``).  Signatures are required whenever the broker requires
credentials (``server.auth_token`` set or a user exists: ``Authenticator.required``,
asked at every call, so a first user added at runtime closes the front at once) or
``rocketmq.access_key`` is set.  Then a call's access key names

- ``rocketmq.access_key``: the front's admin, allowed everything (as the
  ``auth_token`` is the API's), its signature made with ``rocketmq.secret_key``;
- a user's name: that user, its signature made with the user's RocketMQ secret key
  (``access.model.rocketmq_secret``, printed by ``chronomq user add``);

and anything else (no signature, an unknown key, a wrong signature, a removed user, a
date more than 15 minutes from the broker's clock: ``auth.fresh``) is refused
UNAUTHORIZED.  Until then every call is the anonymous principal.

**What each RPC needs** (``ROCKETMQ_RULES``; a test fails when an RPC has no row):

=====================================  ==================================================
RPC                                    needs
=====================================  ==================================================
SendMessage                            send on every message's topic
RecallMessage                          send on its topic (none given: send on ``*``)
QueryRoute                             send, consume or admin on the topic (a route never
                                       tells of a topic the user may not use)
QueryAssignment, ReceiveMessage        consume on the topic
AckMessage, ChangeInvisibleDuration,   consume on the topic the receipt handle was signed
ForwardMessageToDeadLetterQueue        for (a handle that does not verify is the RPC's to
                                       refuse)
Heartbeat, Telemetry,                  nothing (a signature that verifies, when required)
NotifyClientTermination
PullMessage, UpdateOffset, GetOffset,  nothing: they answer UNSUPPORTED whatever they name
QueryOffset, EndTransaction,
SyncLiteSubscription
=====================================  ==================================================

Checks read only the request and what the broker signed, never whether a topic exists:
a forbidden topic is refused the same whether it exists or not.

**Refusals** are answers, as RocketMQ's proxy gives them (``refusal``): the RPC's
response with ``status.code`` UNAUTHORIZED (40100) or FORBIDDEN (40300) and a message
naming the user, the action and the topic; the official clients raise
``UnauthorizedException`` / ``ForbiddenException`` with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from access.errors import AccessDenied, Unauthenticated
from access.model import ALL, Action
from access.principals import ANONYMOUS, Authenticator, Principal
from chronomq.api.guard import Denials, Guard
from chronomq.api.handlers import Metadata
from chronomq.api.permissions import CallState, Lookup, Rule
from chronomq.rocketmq.auth import MAX_SKEW_MS, Signature, fresh, same_key, signature_of, verified
from chronomq.rocketmq.codec import status_of
from chronomq.rocketmq.pb import definition as rd
from store.clock import Clock, SystemClock
from store.errors import ChronomqError

FRONT_ADMIN = Principal("rocketmq.access_key")
UNAUTHORIZED = ("missing or wrong RocketMQ credentials: sign with a user's access key (its "
                "name) and secret key (printed by chronomq user add), or with "
                "rocketmq.access_key / rocketmq.secret_key")
SEND, CONSUME = Action.SEND, Action.CONSUME
_NO_SECRET = "0" * 40  # an unknown key's signature is checked against this: same cost


class Signatures:
    """``identify`` for the front's ``Guard``: the principal a call's signature names
    (see the module doc).  Thread-safe."""

    def __init__(self, authenticator: Authenticator, access_key: str = "",
                 secret_key: str = "", clock: Clock | None = None) -> None:
        self._auth = authenticator
        self._admin_key = access_key
        self._admin_secret = secret_key
        self._clock = clock or SystemClock()

    @property
    def required(self) -> bool:
        return bool(self._admin_key) or self._auth.required

    def __call__(self, metadata: Metadata) -> Principal | None:
        if not self.required:
            return ANONYMOUS
        signature = signature_of(metadata)
        if signature is None:
            return None
        if not fresh(signature.date, self._clock.now_ms()):
            raise Unauthenticated(self._stale(signature.date))
        principal, secret = self._key(signature)
        return principal if verified(signature, secret) and principal is not None else None

    def _stale(self, date: str) -> str:
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock.now_ms() // 1000))
        return (f"RocketMQ signature refused: x-mq-date-time {date[:40]!r} is not "
                f"yyyyMMdd'T'HHmmss'Z' within {MAX_SKEW_MS // 60_000} minutes of the "
                f"broker's clock ({now} UTC, or any zone's local time then); check the "
                "client machine's clock")

    def _key(self, signature: Signature) -> tuple[Principal | None, str]:
        if self._admin_key and same_key(signature.access_key, self._admin_key):
            return FRONT_ADMIN, self._admin_secret
        found = self._auth.rocketmq_user(signature.access_key)
        return found if found is not None else (None, _NO_SECRET)


# ---------------------------------------------------------------- the rules

def _nothing(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    pass


def _topics(action: Action, topics: Callable[[Any], Iterable[str]]) -> Callable[..., None]:
    """``action`` on each topic named (an empty name is the RPC's to refuse)."""
    def check(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
        if not p.unrestricted(action):
            p.check((action, t) for t in dict.fromkeys(topics(r)) if t)
    return check


def _settle(handles: Callable[[Any], Iterable[str]]) -> Callable[..., None]:
    """consume on the topic each receipt handle of the request's group was signed for."""
    def check(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
        if p.unrestricted(CONSUME):
            return
        for handle in handles(r):
            topic = look.handle_topic(r.group.name, handle)
            if topic is not None:
                p.check([(CONSUME, topic)])
    return check


def _recall(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    p.check([(SEND, r.topic.name or ALL)])  # without a topic it cancels in every topic


def _route(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    topic = r.topic.name
    if topic and not any(p.may(a, topic) for a in Action):
        shown = topic[:140]
        raise AccessDenied(p.name, "send|consume|admin", f"topic:{shown}",
                           f"user {p.name!r} may not use topic {shown!r} (it has no send, "
                           "consume or admin on it)")


ROCKETMQ_RULES: dict[str, Rule] = {
    "QueryRoute": Rule(_route),
    "Heartbeat": Rule(_nothing),
    "SendMessage": Rule(_topics(SEND, lambda r: (m.topic.name for m in r.messages))),
    "QueryAssignment": Rule(_topics(CONSUME, lambda r: [r.topic.name])),
    "ReceiveMessage": Rule(_topics(CONSUME, lambda r: [r.message_queue.topic.name])),
    "AckMessage": Rule(_settle(lambda r: (e.receipt_handle for e in r.entries))),
    "ForwardMessageToDeadLetterQueue": Rule(_settle(lambda r: [r.receipt_handle])),
    "PullMessage": Rule(_nothing),
    "UpdateOffset": Rule(_nothing),
    "GetOffset": Rule(_nothing),
    "QueryOffset": Rule(_nothing),
    "EndTransaction": Rule(_nothing),
    "Telemetry": Rule(_nothing),
    "NotifyClientTermination": Rule(_nothing),
    "ChangeInvisibleDuration": Rule(_settle(lambda r: [r.receipt_handle])),
    "RecallMessage": Rule(_recall),
    "SyncLiteSubscription": Rule(_nothing),
}


def refusal(answer_class: Any, exc: ChronomqError) -> Any:
    """The RPC's answer refusing the call (``handlers.Refuse``); None for other errors."""
    if isinstance(exc, Unauthenticated):
        code = rd.Code.UNAUTHORIZED
    elif isinstance(exc, AccessDenied):
        code = rd.Code.FORBIDDEN
    else:
        return None
    return answer_class(status=status_of(code, str(exc)))


def front_guard(authenticator: Authenticator, lookup: Lookup, denials: Denials,
                access_key: str = "", secret_key: str = "",
                clock: Clock | None = None) -> Guard:
    """The front's enforcement point: signatures (their dates read on ``clock``, the
    broker's), ``ROCKETMQ_RULES``, the API's count."""
    return Guard(authenticator, lookup, ROCKETMQ_RULES,
                 identify=Signatures(authenticator, access_key, secret_key, clock),
                 unauthenticated=UNAUTHORIZED, denials=denials)
