"""An ack and the revive of the same lease never both win (issue 37: seen in the failover
chaos as "redelivered after an OK ack", the copy written by the same broker that answered
the ack OK).  The revive reads the entries still open at the deadline, then reads the
messages and appends their copies without the group's lock (with durable-ack that takes
seconds), then marks the entries.  An Ack whose handle was checked before the deadline
and whose mark came while the revive copied was answered OK, and its copy came again.
Now a lease entry past its deadline takes no settlement (Ack, Nack, ChangeInvisibleTime)
when it is reached under the lock: its handle has expired, the revive has it.

Real parts: a broker (store, RocksDB, timer) driven by a manual clock (``test_revive.Env``);
the two requests interleave in threads, held at the points where the race opens.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pop.leasebook import Acked, LeaseBook
from pop.model import ReceiptHandleExpired
from pop.service import retry_topic
from pop.source import QueueSource
from store.clock import ManualClock
from store.topics import Topic
from tests.pop.test_revive import Env

INVISIBLE_S = 6


def test_an_ack_that_lands_while_the_revive_copies_is_not_ok(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a message leased for 6 s
    env = Env(tmp_path, ManualClock())
    try:
        env.broker.create_topic(Topic("t", 1))
        env.send(1)
        (got,) = env.take(invisible_s=INVISIBLE_S)
        # And an Ack of it whose handle is checked a moment before the deadline, its mark
        # held back (as when it waits for the group's lock)
        marking, go = threading.Event(), threading.Event()
        ack = LeaseBook.ack

        def held_ack(book: LeaseBook, group: str, handles: list) -> Acked:  # type: ignore[type-arg]
            marking.set()
            go.wait(10)
            return ack(book, group, handles)
        monkeypatch.setattr(LeaseBook, "ack", held_ack)
        env.clock.advance(INVISIBLE_S * 1000 - 1)
        outcome: list[object] = []
        acker = threading.Thread(
            target=lambda: outcome.extend(env.pop.ack_many("G", [got.receipt_handle])))
        acker.start()
        assert marking.wait(10)
        # When the deadline passes and the revive, having found the entry open, reads the
        # message to copy while the Ack's mark goes in
        fill = QueueSource.fill

        def fill_while_acked(source: QueueSource, reqs: list) -> list:  # type: ignore[type-arg]
            lost = fill(source, reqs)
            go.set()
            acker.join(10)
            return lost
        monkeypatch.setattr(QueueSource, "fill", fill_while_acked)
        revived = env.advance(1)
        assert not acker.is_alive()
        # Then the two do not both win: the Ack is refused (the lease ran out), and the
        # message comes again, once
        assert revived == 1
        (error,) = outcome
        assert isinstance(error, ReceiptHandleExpired)
        again = env.take(topic=retry_topic("G", "t"))
        assert [p.message.message_id for p in again] == [got.message.message_id]
        assert env.take(topic=retry_topic("G", "t")) == []
    finally:
        go.set()
        env.close()
