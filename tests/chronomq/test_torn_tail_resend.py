"""A resend after a torn tail (``store.flush = "async"``): the client was told OK, the
record was lost before it reached the disk, and sending the same client-chosen id again
stores it instead of dropping it as a duplicate.  Real broker over gRPC on 127.0.0.1."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from chronomq.client import message
from chronomq.v1 import broker_pb2 as pb
from tests.conftest import RunningServer, broker_config

SEGMENT0 = f"{0:020d}.log"


def test_a_resend_of_an_id_whose_record_was_lost_is_stored(tmp_path: Path) -> None:
    config = broker_config(tmp_path / "data")
    config = replace(config, store=replace(config.store, flush="async"))
    server = RunningServer(config)
    with server.client() as c:
        c.create_topic("t", 1)
        kept = c.send_one("t", b"kept", message_id="replay-1")
        (lost,) = c.send(_messages(("replay-2", b"lost")))
        assert lost.ok and not lost.duplicate
    assert server.server.broker.store.wait_visible(10)
    lost_at = server.server.broker.store.query_by_message_id("replay-2")[0].commit_offset
    server.stop()
    # Given: a power cut tore replay-2's record off the log
    log_dir = os.path.join(config.store.data_dir, "commitlog")
    os.truncate(os.path.join(log_dir, SEGMENT0), lost_at + 20)
    os.remove(os.path.join(log_dir, "checkpoint"))
    server = RunningServer(config)
    try:
        with server.client() as c:
            # When: the client sends both ids again
            outcomes = c.send(_messages(("replay-1", b"kept again"), ("replay-2", b"resent")))
            # Then: the surviving one is a duplicate, the lost one is stored
            assert [(o.ok, o.duplicate) for o in outcomes] == [(True, True), (True, False)]
            assert [m.body for m in c.query(message_id="replay-2")] == [b"resent"]
            assert [m.body for m in c.query(message_id=kept)] == [b"kept"]
    finally:
        server.stop()


def _messages(*pairs: tuple[str, bytes]) -> list[pb.OutgoingMessage]:
    return [message("t", body, message_id=mid) for mid, body in pairs]
