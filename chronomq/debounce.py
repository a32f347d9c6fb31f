"""Debounce: a Send with ``replace`` replaces the pending message of its id, and never
puts two bodies under one id.

A message sent with a client-chosen id and ``replace = true`` is not dropped as a
duplicate of an earlier send with that id.  Under a pin of the id in the timer
(``TimerService.pinned``: an entry of it coming due meanwhile is held back, so what is
pending stays pending until the decision is made), it meets one of three cases
(``ReplaceOutcome``):

- ``REPLACED``: messages with the id are pending in the topic, none on its way into it:
  they are cancelled and the new one (body, key, tag, properties, due time) is stored
  under the same id; the answer says how many were replaced.
- ``NONE_PENDING``: the id was never stored in the topic: the new one is stored under it.
- ``ALREADY_DELIVERED``: the id was stored in the topic and nothing of it is pending there
  (delivered, leased to a consumer, on its way into the topic, or cancelled), or only
  retry copies of it are (``%RETRY%<group>%<topic>``, after a Nack or a revive: each
  group saw the message once already).  The setting ``IfDelivered`` decides:
  ``NEW_ID`` (the default) stores the new one under the id's next generation,
  ``<id>~<n>`` (n = 1, 2, ...: the first not stored in the topic), and cancels the
  pending retry copies (a group that nacked gets the new data, under the new id, instead
  of the old); ``REFUSE`` stores nothing (FAILED_PRECONDITION) and leaves the copies.

A replace of ``<id>`` looks at every generation of the id stored in the topic (the
store's dedupe index, ``MessageStore.stored_at``, past gaps: a generation stored by a
broker this one took the topic over from is not in it) and at ``<id>`` itself: it
replaces the latest one pending (cancelling any other generation still pending), so the
debounce key stays ``<id>``: a replace while ``<id>~1`` is pending replaces it, under
``<id>~1``; a new generation is the one after the latest seen.

Order: the new message is appended (durable) first, then the others are cancelled (a
synced RocksDB write, and with ``tier.durable_ack`` in the tier).  A crash between the
two (crash point ``debounce.after_append``) leaves both pending: nothing answered OK is
ever lost to a replace that was not answered; the client, which had no answer, sends
again, and that replace finds both and leaves its own message (a new generation's retry
finds its own pending and replaces it; retry copies of the generation before are then
left, and go to their group as without the replace: an old body, under its own id).
Replaces of one (topic, id) are serialised, each waiting until the one before it is in
the timer store: two debounced sends racing never leave two messages pending.  Sends
without ``replace`` are not held by this.

Thread-safe.
"""

from __future__ import annotations

import enum
import threading
from contextlib import ExitStack
from typing import NamedTuple

from chronomq.broker import Broker
from pop.model import origin_of
from store.crashpoint import crashpoint
from store.errors import FailedPrecondition, InvalidArgument, StoreError
from store.message import DispatchInfo, Draft, validate_message_id

STRIPES = 64  # locks; a (topic, id) always takes the same one
GENERATION_PROBE = 16  # generations looked up in one multi-get


class IfDelivered(enum.Enum):
    """What a replace does when the id's message was delivered or is in flight."""

    NEW_ID = 0  # stored under the id's next generation, ``<id>~<n>``
    REFUSE = 1  # FAILED_PRECONDITION, nothing stored


class ReplaceOutcome(enum.Enum):
    """Which case a replace met (the module docstring)."""

    REPLACED = 1
    NONE_PENDING = 2
    ALREADY_DELIVERED = 3


class Replaced(NamedTuple):
    """What a replace stored, the case it met, and how many pending messages (or retry
    copies) it cancelled."""

    info: DispatchInfo
    outcome: ReplaceOutcome
    cancelled: int


def generation_id(message_id: str, generation: int) -> str:
    """The id of a debounced id's generation: ``<id>`` first, then ``<id>~<n>``."""
    return f"{message_id}~{generation}" if generation else message_id


class Debouncer:
    """See the module docstring."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._locks = [threading.Lock() for _ in range(STRIPES)]

    def replace(self, draft: Draft, if_delivered: IfDelivered = IfDelivered.NEW_ID
                ) -> Replaced:
        """Store ``draft`` (checked) in place of the pending message with its id in its
        topic, by the case met (the module docstring)."""
        if not draft.message_id:
            raise InvalidArgument("replace needs a message_id: the id of the message to "
                                  "replace")
        broker = self._broker
        topic = draft.topic
        with self._locks[hash((topic, draft.message_id)) % STRIPES]:
            # the last replace of this id, or any send of it before, is in the timer store
            if not broker.store.wait_visible(10.0):
                raise StoreError("the dispatcher is behind; replace not attempted")
            stored = self._generations(topic, draft.message_id)
            # every generation stored here, and the first (a takeover's adopted messages
            # are pending in the timer, not in this broker's dedupe index)
            candidates = sorted({0, *stored})
            ids = {g: generation_id(draft.message_id, g) for g in candidates}
            with ExitStack() as pins:
                for g in candidates:
                    pins.enter_context(broker.timer.pinned(ids[g]))
                found = {g: broker.timer.pending_topics(ids[g]) for g in candidates}
                own = {g: [delivering for t, delivering in found[g] if t == topic]
                       for g in candidates}
                retries = sorted({t for g in candidates for t, _ in found[g]
                                  if t != topic and origin_of(t) == topic})
                waiting = [g for g in candidates if own[g] and not any(own[g])]
                in_flight = any(any(own[g]) for g in candidates)
                seen = bool(stored) or any(found.values())
                if waiting and not in_flight:  # the latest pending generation is replaced
                    current = ids[waiting[-1]]
                    info = self._append(draft._replace(message_id=current))
                    count = self._cancel(list(ids.values()), [topic, *retries],
                                         info.commit_offset, current)
                    out = Replaced(info, ReplaceOutcome.REPLACED, count)
                elif not seen:
                    out = Replaced(self._append(draft), ReplaceOutcome.NONE_PENDING, 0)
                elif if_delivered is IfDelivered.REFUSE:
                    raise FailedPrecondition(
                        f"message {ids[candidates[-1]]!r} was already delivered or is in "
                        f"flight in {topic!r}; nothing replaced (if_delivered = REFUSE; "
                        "NEW_ID stores it under a new id)")
                else:
                    new_id = generation_id(draft.message_id, candidates[-1] + 1)
                    try:
                        validate_message_id(new_id)
                    except InvalidArgument as exc:
                        raise FailedPrecondition(
                            f"message {ids[candidates[-1]]!r} was already delivered or is "
                            f"in flight and its next id {new_id!r} is too long: {exc}"
                        ) from exc
                    info = self._append(draft._replace(message_id=new_id))
                    count = self._cancel(list(ids.values()), [topic, *retries], -1, "")
                    out = Replaced(info, ReplaceOutcome.ALREADY_DELIVERED, count)
            broker.store.wait_visible(10.0)  # the next replace of this id finds it
        return out

    def _generations(self, topic: str, message_id: str) -> list[int]:
        """The id's generations stored in the topic by this broker's dedupe index, in
        order.  Not always from the first on: a generation stored by a broker this one
        took the topic over from is not in it, so the probe goes on past a missing one
        while a block of ``GENERATION_PROBE`` has any."""
        store = self._broker.store
        out: list[int] = []
        base = 0
        while True:
            probe = [(topic, generation_id(message_id, base + i))
                     for i in range(GENERATION_PROBE)]
            hits = [base + i for i, at in enumerate(store.stored_at(probe)) if at is not None]
            if not hits:
                return out
            out += hits
            base += GENERATION_PROBE

    def _append(self, draft: Draft) -> DispatchInfo:
        sender = self._broker.sender
        (info,) = sender.stored(sender.submit([draft], self._broker.clock.now_ms(),
                                              dedupe=False))
        crashpoint("debounce.after_append")
        return info

    def _cancel(self, message_ids: list[str], topics: list[str], keep: int,
                kept_id: str) -> int:
        """Cancel what is pending with these ids in these topics (not the record at
        ``keep`` of ``kept_id``); how many."""
        timer = self._broker.timer
        return sum(timer.cancel(mid, t, keep=keep if mid == kept_id else -1).changed
                   for mid in message_ids for t in topics)
