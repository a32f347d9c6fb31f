"""The broker's recurring schedules (``recurring``): their book, kept in the POP
database under ``R`` keys (journaled to the tier with the groups' state, snapshotted
with it, adopted by a takeover: ``cluster.takeover``), and the engine whose ticks go
through ``Sender.submit`` like any Send (checked, the dedupe window of client-chosen
ids, durable before the book moves on).

Each tick is a message ``<name>@<tick ms>`` due at the tick; a tick whose message the
broker refuses (its topic was deleted, or is owned elsewhere) is skipped and its error
kept as the schedule's ``last_error``; a broker-wide failure (a full disk, a tier that
does not take the change with ``tier.durable_ack``) raises, and the engine sends the same
ticks again a second later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recurring.book import ScheduleBook
from recurring.engine import ScheduleEngine
from store.errors import ChronomqError, Unavailable
from store.message import Draft

if TYPE_CHECKING:
    from chronomq.broker import Broker


class _PopState:
    """The schedules' durable store: the POP database, through the state journal
    (``PopService.write_state``)."""

    def __init__(self, broker: Broker) -> None:
        self._pop = broker.pop

    def items(self) -> list[tuple[bytes, bytes]]:
        return self._pop.state_items()

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        self._pop.write_state(puts, deletes)


def open_schedules(broker: Broker) -> ScheduleEngine:
    book = ScheduleBook(_PopState(broker), broker.config.schedules.max_schedules)

    def send(drafts: list[Draft]) -> list[str]:
        now, sender = broker.clock.now_ms(), broker.sender
        errors = [""] * len(drafts)
        ok: list[Draft] = []
        for i, d in enumerate(drafts):
            try:
                due, flags = sender.resolve_deliver_at(d.deliver_at_ms, 0, now)
                d = d._replace(born_at_ms=now, deliver_at_ms=due, flags=flags)
                sender.check(d)
                ok.append(d)
            except Unavailable:  # a topic a takeover still adopts: the step, retried,
                raise  # sends every owed tick then (a refused tick would be skipped)
            except ChronomqError as exc:
                errors[i] = str(exc)
        if ok:
            sender.stored(sender.submit(ok, now))  # duplicates: ticks sent before a crash
        return errors

    return ScheduleEngine(book, send, broker.clock)
