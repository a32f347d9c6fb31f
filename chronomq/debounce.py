"""Debounce: a Send with ``replace`` replaces the pending messages with its id.

A message sent with a client-chosen id and ``replace = true`` is not dropped as a
duplicate of an earlier send with that id: every message with that id in that topic that
is still pending (in RocksDB, the wheel, or parked for a TimerFlatFile) is cancelled, and
the new one (its body, key, tag, properties and due time) is stored under the same id.
The answer says how many were replaced (0: none was pending, and the message is stored
as a new one).  A message already delivered, or being delivered at that moment, is not
pending: it stays delivered, and the new one is stored as well.

Order: the new message is appended (durable) first, then the others are cancelled (a
synced RocksDB write, and with ``tier.durable_ack`` in the tier).  A crash between the
two (crash point ``debounce.after_append``) leaves both pending: nothing answered OK is
ever lost to a replace that was not answered; the client, which had no answer, sends
again, and that replace finds both and leaves its own message.  Replaces of one (topic,
id) are serialised, each waiting until the one before it is in the timer store: two
debounced sends racing never leave two messages pending.  Sends without ``replace`` are
not held by this.

Thread-safe.
"""

from __future__ import annotations

import threading

from chronomq.broker import Broker
from store.crashpoint import crashpoint
from store.errors import InvalidArgument, StoreError
from store.message import DispatchInfo, Draft

STRIPES = 64  # locks; a (topic, id) always takes the same one


class Debouncer:
    """See the module docstring."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._locks = [threading.Lock() for _ in range(STRIPES)]

    def replace(self, draft: Draft) -> tuple[DispatchInfo, int]:
        """Store ``draft`` (checked) in place of the pending messages with its id in its
        topic; returns what was stored and how many were replaced."""
        if not draft.message_id:
            raise InvalidArgument("replace needs a message_id: the id of the message to "
                                  "replace")
        broker = self._broker
        with self._locks[hash((draft.topic, draft.message_id)) % STRIPES]:
            # the last replace of this id, or any send of it before, is in the timer store
            if not broker.store.wait_visible(10.0):
                raise StoreError("the dispatcher is behind; replace not attempted")
            sender = broker.sender
            (info,) = sender.stored(sender.submit([draft], broker.clock.now_ms(),
                                                  dedupe=False))
            crashpoint("debounce.after_append")
            change = broker.timer.cancel(draft.message_id, draft.topic,
                                         keep=info.commit_offset)
            broker.store.wait_visible(10.0)  # the next replace of this id finds it
        return info, change.changed
