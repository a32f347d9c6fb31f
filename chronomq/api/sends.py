"""A Send request's messages: checked and queued one by one, answered once durable.

``begin_send`` checks each message (an error is that message's result, not the
request's), stores a replace on its own at once (``chronomq.debounce``) and submits the
others as one batch to the sender (``chronomq.sending``: client-chosen ids sent again
within the dedupe window are not stored twice); ``send_response`` answers, in request
order, once the batch is durable.  The servicer's Send answers one request so, its
SendStream many, pipelined.

The full check runs once per topic of a request and for a message out of the ordinary
(a chosen id, an empty or large body, a key or tag long enough to need its bytes
counted); the others share it.  A request whose every message was stored, none a
duplicate or a replace, is answered by ``chronomq.api.wire``'s hand-written encoding.

Thread-safe: no state of its own.
"""

from __future__ import annotations

from typing import NamedTuple

from chronomq.api.errors import code_number
from chronomq.api.wire import encode_send_response
from chronomq.broker import Broker
from chronomq.debounce import Debouncer, IfDelivered, Replaced, ReplaceOutcome
from chronomq.sending import Submission
from chronomq.v1 import broker_pb2 as pb
from store.errors import ChronomqError, InvalidArgument
from store.message import (
    MAX_KEY_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TAG_BYTES,
    DispatchInfo,
    Draft,
    encode_properties,
)

MAX_SEND_BATCH = 1000
# A str of n characters is at most 4n UTF-8 bytes: below these lengths no encode is needed.
_FAST_KEY_CHARS = MAX_KEY_BYTES // 4
_FAST_TAG_CHARS = MAX_TAG_BYTES // 4

_REPLACE_OUTCOMES = {
    ReplaceOutcome.REPLACED: pb.REPLACE_OUTCOME_REPLACED,
    ReplaceOutcome.NONE_PENDING: pb.REPLACE_OUTCOME_NONE_PENDING,
    ReplaceOutcome.ALREADY_DELIVERED: pb.REPLACE_OUTCOME_ALREADY_DELIVERED,
}


class PendingSend(NamedTuple):
    """One request on its way: what ``send_response`` needs besides what was stored."""

    messages: int
    errors: dict[int, pb.Error]
    submission: Submission
    duplicates: dict[int, str]  # index -> the client's message id, sent before
    replaced: dict[int, Replaced]  # index -> what a replace stored, its case


def _if_delivered(value: int) -> IfDelivered:
    """``OutgoingMessage.if_delivered`` (proto3 keeps a number the enum does not name)."""
    if value == pb.IF_DELIVERED_NEW_ID:
        return IfDelivered.NEW_ID
    if value == pb.IF_DELIVERED_REFUSE:
        return IfDelivered.REFUSE
    raise InvalidArgument(f"if_delivered must be IF_DELIVERED_NEW_ID (0) or "
                          f"IF_DELIVERED_REFUSE (1), not {value}")


def begin_send(broker: Broker, debouncer: Debouncer, request: pb.SendRequest) -> PendingSend:
    """Check and queue one request's messages; ``send_response`` answers once durable."""
    n = len(request.messages)
    if n == 0:
        raise InvalidArgument("Send needs at least one message")
    if n > MAX_SEND_BATCH:
        raise InvalidArgument(f"at most {MAX_SEND_BATCH} messages per Send request")
    now = broker.clock.now_ms()
    max_body = broker.config.store.max_body_bytes
    errors: dict[int, pb.Error] = {}
    duplicates: dict[int, str] = {}
    replaced: dict[int, Replaced] = {}
    accepted: list[Draft] = []
    chosen: list[tuple[int, int]] = []  # (request index, position in accepted)
    checked_topics: set[str] = set()
    new_draft = tuple.__new__
    for i, om in enumerate(request.messages):
        topic, key, tag, body, mid = om.topic, om.key, om.tag, om.body, om.message_id
        try:
            at_ms, delay_ms = om.deliver_at_ms, om.delay_ms
            due, flags = broker.sender.resolve_deliver_at(at_ms, delay_ms, now) \
                if at_ms or delay_ms else (now, 0)
            props = om.properties
            encoded = encode_properties(dict(props), MAX_PROPERTIES_BYTES) \
                if len(props) else b""
            d = new_draft(Draft, (mid, topic, key, tag, body, encoded, now, due, flags, 0,
                                  b""))
            # the full check once per topic and for anything out of the ordinary
            if (mid or topic not in checked_topics or not body or len(body) > max_body
                    or len(key) > _FAST_KEY_CHARS or len(tag) > _FAST_TAG_CHARS):
                broker.sender.check(d)
                checked_topics.add(topic)
            if om.replace:  # stored on its own, now (``chronomq.debounce``)
                replaced[i] = debouncer.replace(d, _if_delivered(om.if_delivered))
                continue
            if om.if_delivered:
                raise InvalidArgument("if_delivered is a setting of replace: send it "
                                      "with replace = true")
        except ChronomqError as exc:
            errors[i] = pb.Error(code=code_number(exc), message=str(exc))
            continue
        if mid:
            chosen.append((i, len(accepted)))
        accepted.append(d)
    submission = broker.sender.submit(accepted, now)
    if chosen:
        duplicates = {i: accepted[at].message_id for i, at in chosen
                      if submission.duplicate[at]}
    return PendingSend(n, errors, submission, duplicates, replaced)


def send_response(pending: PendingSend, stored: list[DispatchInfo]) -> pb.SendResponse:
    """The answer to ``pending``'s request, ``stored`` what its batch stored (durable)."""
    if not pending.errors and not pending.duplicates and not pending.replaced:
        return pb.SendResponse.FromString(
            encode_send_response((m.message_id, m.deliver_at_ms) for m in stored))
    it = iter(stored)
    results = []
    for i in range(pending.messages):
        err = pending.errors.get(i)
        if err is not None:
            results.append(pb.SendResult(error=err))
        elif i in pending.duplicates:
            results.append(pb.SendResult(message_id=pending.duplicates[i], duplicate=True))
        elif i in pending.replaced:
            info, outcome, count = pending.replaced[i]
            results.append(pb.SendResult(message_id=info.message_id,
                                         deliver_at_ms=info.deliver_at_ms,
                                         replaced=count,
                                         replace_outcome=_REPLACE_OUTCOMES[outcome]))
        else:
            m = next(it)
            results.append(pb.SendResult(message_id=m.message_id,
                                         deliver_at_ms=m.deliver_at_ms))
    return pb.SendResponse(results=results)
