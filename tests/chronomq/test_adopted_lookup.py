"""Adopted pending messages are found by id (finding 4 of issue 51): real brokers in one
process, a real local-directory tier and RocksDB, a manual clock.

A takeover schedules the departed broker's pending delayed messages in its timer under
adopted offsets (``cluster.adoption``), not in its CommitLog or key index: near ones in
RocksDB, far ones left in TimerFlatFile objects.  QueryMessages by id (and the console's
message page) found none of them, while Cancel by the same id worked.  Found now through
the timer's own id keys, wherever the message waits, without moving it.
"""

from __future__ import annotations

from pathlib import Path

from access.principals import ADMIN
from chronomq.broker import Broker
from chronomq.console.rates import RateSampler
from chronomq.console.views import ConsoleViews
from store.clock import ManualClock
from tests.chronomq.test_takeover_adoption import (
    HOUR_MS,
    _departed_with_far_future,
    _objects,
    _open,
    _run,
)
from tests.chronomq.test_takeover_adoption import brokers as brokers


def _found(b: Broker, message_id: str) -> list[tuple[str, str, bytes, int]]:
    return [(m.message_id, m.topic, m.body, m.deliver_at_ms)
            for m in b.queries.by_message_id(message_id)]


def test_adopted_pending_messages_are_found_by_id_wherever_they_wait(
        tmp_path: Path, manual_clock: ManualClock, brokers: list[Broker]) -> None:
    # Given A gone with 93 pending delayed messages: near ones, far ones in its
    # TimerFlatFiles, some moved by A into another hour, some still parked at A
    due, cancelled_at_a = _departed_with_far_future(tmp_path, manual_clock, brokers)
    start = manual_clock.now_ms()
    b = _open(tmp_path, "b", manual_clock, brokers)

    # When B takes A over
    assert b.takeover("a", force=True).done
    a_objects, b_objects = _objects(b, "a"), _objects(b, "b")
    parked = b.timer.statistics().parked_unwritten

    # Then the lookup QueryMessages makes finds each one by its id, as pending (its due
    # time the one it waits for), and none that A cancelled
    missing = {mid: _found(b, mid) for mid, at in due.items()
               if _found(b, mid) != [(mid, "t", mid.encode(), at)]}
    assert not missing, missing
    assert all(_found(b, mid) == [] for mid in cancelled_at_a)
    # and the console's message page shows it pending
    views = ConsoleViews(b, RateSampler(dict, lambda: 0.0), dict)
    page = views.message("far30-7", ADMIN)
    assert [(r["message_id"], r["pending_due_ms"]) for r in page["messages"]] == \
        [("far30-7", due["far30-7"])]
    # and a look moves nothing: the objects and what is parked stay as they were
    assert (_objects(b, "a"), _objects(b, "b")) == (a_objects, b_objects)
    assert b.timer.statistics().parked_unwritten == parked

    # When one is cancelled and one rescheduled by id at B
    assert b.timer.cancel("far5-11", "t").changed == 1
    assert b.timer.reschedule("far30-8", start + 3 * HOUR_MS, "t").changed == 1
    # Then the lookup follows
    assert _found(b, "far5-11") == []
    assert _found(b, "far30-8") == [("far30-8", "t", b"far30-8", start + 3 * HOUR_MS)]

    # When one is delivered, it is found once: its delivered copy
    _run(b, manual_clock, start + 2 * HOUR_MS)
    (m,) = b.queries.by_message_id("near-3")
    assert m.message_id == "near-3" and m.body == b"near-3"
