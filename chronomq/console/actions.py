"""The console's actions: cancel, reschedule or replace (debounce) the pending messages
with an id, redrive dead letters.

Each goes through the same ``BrokerServicer`` method a gRPC client calls (an in-process
call with a context whose ``abort`` raises ``Refused``), so the console checks, refuses
and answers exactly as the API does: the page shows the broker's definite result (the
outcome name, or the status code and its message).  No action is taken unless
``console.actions`` is on (``chronomq.console.server`` checks it, and the CSRF token).

Each is checked first by the API's own row for that RPC (``Guard.call``: the session's
principal, its refusal counted and audited with the API's, ``peer`` naming the
console): cancel and reschedule need ``send`` on the message's topic (the page sends
it; without one, ``send`` on ``*``), replace ``send`` on its topic, redrive ``consume``
on the topic whose dead letters it reads (a QueryMessages of the group's dead-letter
topic) and ``send`` on each topic it sends back to.

Redrive reads the chosen dead letters again from the broker (the page sends only their
queue offsets, never a body) and sends each back to its topic as a new message: its
key, tag, body and properties, without the ``chronomq.dlq.*`` ones, plus
``chronomq.redriven_from`` naming the dead letter.  The copy's client-chosen id is
``redrive-<dead letter id>``, so a second redrive of the same letter within the dedupe
window (``store.dedupe_window_ms``) is answered as a duplicate, not delivered twice.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from access.principals import Principal
from chronomq.api.guard import Guard
from chronomq.api.servicer import BrokerServicer
from chronomq.broker import Broker
from chronomq.console.views import PAGE, REDRIVE_ID
from chronomq.v1 import broker_pb2 as pb
from pop.model import (
    PROP_DLQ_ATTEMPTS,
    PROP_DLQ_GROUP,
    PROP_DLQ_REASON,
    PROP_ORIGIN_TOPIC,
    dlq_topic,
)
from store.errors import InvalidArgument
from store.message import Message, validate_message_id
from store.names import check_name

PROP_REDRIVEN_FROM = "chronomq.redriven_from"
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}
_DLQ_PROPS = frozenset({PROP_DLQ_ATTEMPTS, PROP_DLQ_GROUP, PROP_DLQ_REASON,
                        PROP_ORIGIN_TOPIC})


class Refused(Exception):
    """The broker refused: ``code`` is the gRPC status code's name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Context:
    """Just enough of ``grpc.ServicerContext`` for the unary methods used here."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Refused(code.name, details)

    def is_active(self) -> bool:
        return True

    def invocation_metadata(self) -> tuple[()]:
        return ()


def _ctx() -> Any:
    return _Context()


class ConsoleActions:
    def __init__(self, servicer: BrokerServicer, broker: Broker, guard: Guard) -> None:
        self._servicer = servicer
        self._broker = broker
        self._guard = guard

    def _check(self, who: Principal, peer: str, rpc: str, request: Any) -> None:
        """Raise ``AccessDenied`` (counted, audited) unless ``who`` may make it."""
        self._guard.call(who, rpc, peer).check(request)

    def cancel(self, message_id: str, topic: str, who: Principal,
               peer: str) -> dict[str, Any]:
        req = pb.CancelRequest(message_id=message_id, topic=topic)
        self._check(who, peer, "Cancel", req)
        r = self._servicer.Cancel(req, _ctx())
        return {"outcome": pb.TimerOutcome.Name(r.outcome), "changed": r.changed}

    def reschedule(self, message_id: str, topic: str, deliver_at_ms: int | None,
                   delay_ms: int | None, who: Principal, peer: str) -> dict[str, Any]:
        req = pb.RescheduleRequest(message_id=message_id, topic=topic)
        if deliver_at_ms is not None:
            req.deliver_at_ms = deliver_at_ms
        elif delay_ms is not None:
            req.delay_ms = delay_ms
        self._check(who, peer, "Reschedule", req)
        r = self._servicer.Reschedule(req, _ctx())
        return {"outcome": pb.TimerOutcome.Name(r.outcome), "deliver_at_ms": r.deliver_at_ms,
                "changed": r.changed}

    def replace(self, message_id: str, topic: str, body: str, deliver_at_ms: int | None,
                delay_ms: int | None, who: Principal, peer: str) -> dict[str, Any]:
        """Debounce from the page: replace the messages with this id pending in ``topic``
        by one with the new body (empty: the current one) and due time (none given: the
        current one), keeping their key, tag and properties (``chronomq.debounce``)."""
        self._check(who, peer, "Send", pb.SendRequest(messages=[pb.OutgoingMessage(
            topic=topic)]))
        validate_message_id(message_id)
        check_name(topic)
        current = next((m for m in self._broker.timer.pending_messages(message_id, True)
                        if m.topic == topic), None)
        if current is None:
            raise InvalidArgument(f"no message {message_id!r} is pending in {topic!r}")
        m = pb.OutgoingMessage(topic=topic, key=current.key, tag=current.tag,
                               body=body.encode() if body else current.body,
                               properties=current.properties, message_id=message_id,
                               replace=True)
        if deliver_at_ms is not None:
            m.deliver_at_ms = deliver_at_ms
        elif delay_ms is not None:
            m.delay_ms = delay_ms
        else:
            m.deliver_at_ms = current.deliver_at_ms
        (r,) = self._servicer.Send(pb.SendRequest(messages=[m]), _ctx()).results
        if r.WhichOneof("outcome") == "error":
            raise Refused(_CODE_NAMES.get(r.error.code, str(r.error.code)), r.error.message)
        return {"replaced": r.replaced, "deliver_at_ms": r.deliver_at_ms}

    def redrive(self, group: str, topic: str, offsets: list[int], who: Principal,
                peer: str) -> dict[str, Any]:
        """Send the dead letters at ``offsets`` of ``group``'s DLQ of ``topic`` back to the
        topic; one result per offset: ``sent`` (with the new id), ``duplicate`` (redriven
        before, within the dedupe window), ``gone`` (no longer stored) or the refusal."""
        self._check(who, peer, "QueryMessages",
                    pb.QueryMessagesRequest(topic=dlq_topic(group, topic)))
        check_name(group)
        check_name(topic)
        if not offsets or len(offsets) > PAGE:
            raise InvalidArgument(f"choose 1 to {PAGE} dead letters")
        store = self._broker.store
        dead = dlq_topic(group, topic)
        if store.topics.get(dead) is None:
            raise InvalidArgument(f"group {group!r} has no dead letters of {topic!r}")
        low, high = store.queue_bounds(dead, 0)
        letters: dict[int, Message] = {}
        for offset in sorted(set(offsets)):
            if not low <= offset < high:
                continue
            entries = store.consume_queue_entries(dead, 0, offset, 1)
            if entries and not entries[0].is_hole and entries[0].queue_offset == offset:
                m = store.read_messages_skipping(
                    [(entries[0].commit_offset, entries[0].record_size)])[0]
                if isinstance(m, Message):
                    letters[offset] = m
        out: dict[str, Any] = {str(o): {"result": "gone"} for o in offsets}
        if not letters:
            return {"results": out}
        request = pb.SendRequest()
        order = list(letters)
        for offset in order:
            m = letters[offset]
            props = {k: v for k, v in m.properties.items() if k not in _DLQ_PROPS}
            props[PROP_REDRIVEN_FROM] = m.message_id
            request.messages.add(topic=m.properties.get(PROP_ORIGIN_TOPIC, topic), body=m.body,
                                 key=m.key, tag=m.tag, properties=props,
                                 message_id=REDRIVE_ID + m.message_id)
        self._check(who, peer, "Send", request)
        try:
            response = self._servicer.Send(request, _ctx())
        except Refused as exc:
            for offset in order:
                out[str(offset)] = {"result": exc.code, "message": exc.message}
            return {"results": out}
        for offset, result in zip(order, response.results, strict=True):
            if result.HasField("error"):
                out[str(offset)] = {"result": _CODE_NAMES.get(result.error.code, "UNKNOWN"),
                                    "message": result.error.message}
            elif result.duplicate:
                out[str(offset)] = {"result": "duplicate", "message_id": result.message_id}
            else:
                out[str(offset)] = {"result": "sent", "message_id": result.message_id}
        return {"results": out}

