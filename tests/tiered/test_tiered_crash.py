"""kill -9 of a broker while it uploads to the tier: after a restart the tier holds every
message of the topic exactly once, in queue order, with no gap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient
from store.message import decode_record
from testkit.process import ServerProcess, wait_tier_caught_up
from tests.chronomq.test_crash import kill_while_sending
from tiered.providers.local import LocalProvider
from tiered.queue import TieredQueue

TIER = ("tier.upload=true", "tier.upload_batch_bytes=16384", "tier.upload_batch_ms=20",
        "tier.segment_bytes=65536", "tier.index_ms=100", "store.segment_bytes=262144")


def _tier_ids(data: Path, tier: Path, queues: int) -> list[str]:
    ids: list[str] = []
    for qid in range(queues):
        meta = (data / "tiered" / "queues" / "crash" / f"{qid}.json").read_text()
        q = TieredQueue(LocalProvider(str(tier)), "broker-0", "crash", qid, meta)
        entries = q.read(0, 10**7)
        assert [e.queue_offset for e in entries] == list(range(len(entries)))  # no gap
        for e in entries:
            m = decode_record(e.record)
            assert (m.queue_id, m.queue_offset) == (qid, e.queue_offset)
            ids.append(m.message_id)
    return ids


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(2))
def test_sigkill_mid_upload_loses_and_duplicates_nothing_in_the_tier(
        tmp_path: Path, round_no: int) -> None:
    data, tier = tmp_path / "data", tmp_path / "tier"
    settings = (*TIER, f"tier.local_dir={tier}")
    srv = ServerProcess(data, *settings)
    with ChronomqClient(srv.target) as c:
        c.create_topic("crash", queue_count=2)
    # When: killed while sends continue and batches go up every 20 ms
    acked = kill_while_sending(srv, 3000 * (round_no + 1))
    uploaded_before = len(list(tier.rglob("*")))  # what went up before the kill
    assert len(acked) >= 3000 and uploaded_before > 10, "uploads never got going"
    # Then: a restart resumes from the tier checkpoint and catches up
    srv = ServerProcess(data, *settings)
    with ChronomqClient(srv.target) as c:
        after = c.send_one("crash", b"after the crash")
        wait_tier_caught_up(c)
    assert srv.terminate() == 0, "".join(srv.output)
    ids = _tier_ids(data, tier, 2)
    assert len(ids) == len(set(ids))  # nothing twice
    assert set(acked) | {after} <= set(ids)  # nothing lost
    checkpoint = int((data / "tiered" / "checkpoint").read_text())
    catalogue = json.loads((data / "tiered" / "index" / "catalog.json").read_text())
    assert catalogue["sealed_end"] == checkpoint  # the key index caught up too
