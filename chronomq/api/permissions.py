"""What each RPC of ``chronomq.v1.Broker`` needs: one row per RPC (``RULES``), read by the
one enforcement point (``chronomq.api.guard``) before the RPC runs.

A row is a ``check`` (raises ``AccessDenied`` for what the principal may not do, from
the request alone or what the broker signed: never an existence check first, so a
forbidden topic is refused the same whether it exists or not) and, for the RPCs that
answer about many topics, a ``narrow`` that cuts the answer to what the principal may
see.  ``tests/chronomq/test_permissions.py`` fails when an RPC has no row.

======================================  ===============================================
RPC                                     needs
======================================  ===============================================
Send, SendStream (each request)         send on every message's topic
Pop, Subscribe (its first request)      consume on the topic
Ack, Nack, DeadLetter,                  consume on the topic each receipt handle was
ChangeInvisibleTime, Subscribe's        signed for (a handle whose signature does not
settlements                             verify is the RPC's to refuse, naming no topic)
QueryMessages                           consume on the topic when given; by id without
                                        one: the answer cut to topics it may consume
Cancel, Reschedule                      send on the topic; without one (every topic):
                                        send on ``*``, else refused "give the topic"
CreateSchedule                          send on its topic, and on the topic of the
                                        schedule of that name if there is one
UpdateSchedule, PauseSchedule,          send on the named schedule's topic (and on a new
ResumeSchedule, DeleteSchedule,         topic); a schedule it may not see is refused the
TriggerSchedule, NextFires              same as a missing one
ListSchedules                           the schedules whose topic it may send to (total
                                        and pages counted over those)
CreateTopic, DeleteTopic                admin on the topic
ListTopics                              the topics it may send to, consume or administer
Stats                                   admin on ``*``: every figure; else the figures
                                        of the groups of topics it may consume
Mount, Unmount, Takeover, AddUser,      admin on ``*``
GrantPermission, RevokePermission,
ListUsers, RemoveUser
WhoAmI                                  nothing (any principal)
======================================  ===============================================

A retry or dead-letter topic counts as its own topic (``access.model.resource_of``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from access.errors import AccessDenied
from access.model import ALL, Action
from access.principals import Principal
from chronomq.api.schedules import MAX_LIST, SETTINGS
from chronomq.v1 import broker_pb2 as pb

SEND, CONSUME, ADMIN = Action.SEND, Action.CONSUME, Action.ADMIN


class Lookup(Protocol):
    """What the checks read of the broker: only what it signed or what names a topic."""

    def handle_topic(self, group: str, handle: str) -> str | None:
        """The topic a receipt handle of ``group`` was signed for; None: not signed."""
        ...

    def schedule_topic(self, name: str) -> str | None:
        """The topic the schedule ``name`` sends to; None: no such schedule."""
        ...

    def schedule_topics(self, prefix: str) -> list[tuple[str, str]]:
        """``(name, topic)`` of every schedule whose name starts with ``prefix``, by name."""
        ...

    def schedule(self, name: str) -> pb.Schedule:
        ...


@dataclass(slots=True)
class CallState:
    """What a stream's checks remember between its requests."""

    group: str = ""  # a Subscribe stream's group, from its first request
    opened: bool = False


Check = Callable[[Principal, Any, Lookup, CallState], None]
Narrow = Callable[[Principal, Any, Any, Lookup], Any]


@dataclass(frozen=True, slots=True)
class Rule:
    check: Check
    narrow: Narrow | None = field(default=None)


# ---------------------------------------------------------------- checks

def _nothing(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    pass


def _broker_admin(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    p.check([(ADMIN, ALL)])


def _topics(action: Action, topics: Callable[[Any], Iterable[str]]) -> Check:
    def check(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
        if not p.unrestricted(action):
            p.check((action, t) for t in dict.fromkeys(topics(r)))
    return check


def _handles(p: Principal, look: Lookup, group: str, handles: Iterable[str]) -> None:
    if p.unrestricted(CONSUME):
        return
    for h in handles:
        topic = look.handle_topic(group, h)
        if topic is not None:
            p.check([(CONSUME, topic)])


def _settle(handles: Callable[[Any], Iterable[str]]) -> Check:
    def check(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
        _handles(p, look, r.group, handles(r))
    return check


def _subscribe(p: Principal, r: pb.SubscribeRequest, look: Lookup, call: CallState) -> None:
    if not call.opened:  # the first request opens the subscription
        call.opened, call.group = True, r.group
        p.check([(CONSUME, r.topic)])
    _handles(p, look, call.group, [*r.ack, *(n.receipt_handle for n in r.nack),
                                   *(c.receipt_handle for c in r.change)])


def _schedule_denial(p: Principal, name: str) -> AccessDenied:
    shown = name[:140]
    return AccessDenied(p.name, str(SEND), f"schedule:{shown}",
                        f"user {p.name!r} may not use schedule {shown!r}: none of that "
                        "name sends to a topic it may send to")


def _visible_schedule(p: Principal, look: Lookup, name: str, exists: bool = True) -> None:
    """The schedule ``name`` sends to a topic ``p`` may send to (``exists=False``: or
    there is none)."""
    topic = look.schedule_topic(name)
    if topic is None and not exists:
        return
    if topic is None or not p.may(SEND, topic):
        raise _schedule_denial(p, name)


def _named_schedule(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    if not p.unrestricted(SEND):
        _visible_schedule(p, look, r.name)


def _create_schedule(p: Principal, r: pb.CreateScheduleRequest, look: Lookup,
                     call: CallState) -> None:
    if not p.unrestricted(SEND):
        _visible_schedule(p, look, r.schedule.name, exists=False)
        p.check([(SEND, r.schedule.topic)])


def _update_schedule(p: Principal, r: pb.UpdateScheduleRequest, look: Lookup,
                     call: CallState) -> None:
    if p.unrestricted(SEND):
        return
    _visible_schedule(p, look, r.schedule.name)
    mask = list(r.update_mask) or [f for f in SETTINGS if f == "topic" and r.schedule.topic]
    if "topic" in mask:
        p.check([(SEND, r.schedule.topic)])


def _timer(p: Principal, r: Any, look: Lookup, call: CallState) -> None:
    p.check([(SEND, r.topic or ALL)])


# ---------------------------------------------------------------- narrowing answers

def _list_topics(p: Principal, r: Any, answer: pb.ListTopicsResponse,
                 look: Lookup) -> pb.ListTopicsResponse:
    if any(p.unrestricted(a) for a in Action):
        return answer
    return pb.ListTopicsResponse(topics=[t for t in answer.topics
                                         if any(p.may(a, t.name) for a in Action)])


def _query(p: Principal, r: Any, answer: pb.QueryMessagesResponse,
           look: Lookup) -> pb.QueryMessagesResponse:
    if p.unrestricted(CONSUME):
        return answer
    return pb.QueryMessagesResponse(messages=[m for m in answer.messages
                                              if p.may(CONSUME, m.topic)])


def _stats(p: Principal, r: Any, answer: pb.StatsResponse, look: Lookup) -> pb.StatsResponse:
    if p.unrestricted(ADMIN):
        return answer
    kept = {}
    for name, value in answer.figures.items():
        if name.startswith("group."):  # group.<group>.<topic>.<figure>
            topic = name[len("group."):].split(".", 1)[-1].rpartition(".")[0]
            if p.may(CONSUME, topic):
                kept[name] = value
    return pb.StatsResponse(figures=kept, json=json.dumps(kept, sort_keys=True))


def _list_schedules(p: Principal, r: pb.ListSchedulesRequest,
                    answer: pb.ListSchedulesResponse, look: Lookup
                    ) -> pb.ListSchedulesResponse:
    """The page counted over the schedules it may see only: no name, count or page
    token tells of the others."""
    if p.unrestricted(SEND):
        return answer
    visible = [name for name, topic in look.schedule_topics(r.prefix) if p.may(SEND, topic)]
    limit = min(r.limit or MAX_LIST, MAX_LIST)
    page = [name for name in visible if name > r.page_token][:limit + 1]
    more = len(page) > limit
    page = page[:limit]
    return pb.ListSchedulesResponse(schedules=[look.schedule(n) for n in page],
                                    total=len(visible),
                                    next_page_token=page[-1] if more and page else "")


RULES: dict[str, Rule] = {
    "CreateTopic": Rule(_topics(ADMIN, lambda r: [r.topic.name])),
    "ListTopics": Rule(_nothing, _list_topics),
    "DeleteTopic": Rule(_topics(ADMIN, lambda r: [r.name])),
    "Send": Rule(_topics(SEND, lambda r: (m.topic for m in r.messages))),
    "SendStream": Rule(_topics(SEND, lambda r: (m.topic for m in r.messages))),
    "Pop": Rule(_topics(CONSUME, lambda r: [r.topic])),
    "Ack": Rule(_settle(lambda r: r.receipt_handles)),
    "ChangeInvisibleTime": Rule(_settle(lambda r: [r.receipt_handle])),
    "Nack": Rule(_settle(lambda r: r.receipt_handles)),
    "DeadLetter": Rule(_settle(lambda r: r.receipt_handles)),
    "Subscribe": Rule(_subscribe),
    "Cancel": Rule(_timer),
    "Reschedule": Rule(_timer),
    "QueryMessages": Rule(_topics(CONSUME, lambda r: [r.topic] if r.topic else []), _query),
    "Stats": Rule(_nothing, _stats),
    "Mount": Rule(_broker_admin),
    "Unmount": Rule(_broker_admin),
    "Takeover": Rule(_broker_admin),
    "CreateSchedule": Rule(_create_schedule),
    "UpdateSchedule": Rule(_update_schedule),
    "ListSchedules": Rule(_nothing, _list_schedules),
    "PauseSchedule": Rule(_named_schedule),
    "ResumeSchedule": Rule(_named_schedule),
    "DeleteSchedule": Rule(_named_schedule),
    "TriggerSchedule": Rule(_named_schedule),
    "NextFires": Rule(_named_schedule),
    "AddUser": Rule(_broker_admin),
    "GrantPermission": Rule(_broker_admin),
    "RevokePermission": Rule(_broker_admin),
    "ListUsers": Rule(_broker_admin),
    "RemoveUser": Rule(_broker_admin),
    "WhoAmI": Rule(_nothing),
}
