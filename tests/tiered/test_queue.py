"""TieredQueue on real providers (memory, local directory, moto S3): records and entries
by queue offset, replay without duplicates, failures without loss, metadata recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.message import Message, decode_record, encode_record
from tests.tiered.faults import FaultyProvider
from tiered.errors import TierError
from tiered.provider import Provider
from tiered.providers.memory import MemoryProvider
from tiered.queue import TieredQueue


def _record(qo: int) -> bytes:
    return encode_record(Message(f"id{qo}", "t", f"body-{qo}".encode(), queue_offset=qo,
                                 store_at_ms=1000 + qo))


def test_records_by_queue_offset_and_replay_adds_nothing(provider: Provider) -> None:
    q = TieredQueue(provider, "b0", "t", 1, segment_bytes=300)
    for qo in range(100, 160):
        assert q.append(qo, _record(qo), qo % 7, 1000 + qo)
        if qo % 10 == 9:
            assert q.commit()
    assert q.committed_queue_offset == 160 and q.min_queue_offset == 100
    got = q.read(120, 25)
    assert [e.queue_offset for e in got] == list(range(120, 145))
    assert [decode_record(e.record).body for e in got] == [f"body-{i}".encode()
                                                           for i in range(120, 145)]
    assert got[3].tag_hash == 123 % 7 and got[3].store_at_ms == 1123
    assert q.read(150, 100)[-1].queue_offset == 159 and q.read(160, 5) == []
    assert not q.append(130, _record(130), 0, 0)  # a replay: already in the tier
    with pytest.raises(TierError, match="gap"):
        q.append(170, _record(170), 0, 0)
    back = TieredQueue(provider, "b0", "t", 1, q.to_json())
    assert [e.record for e in back.read(100, 60)] == [_record(i) for i in range(100, 160)]


def test_failed_uploads_switch_segments_and_lose_nothing(tmp_path: Path) -> None:
    faulty = FaultyProvider(MemoryProvider())
    q = TieredQueue(faulty, "b0", "t", 0)
    for qo in range(10):
        q.append(qo, _record(qo), 0, 0)
    faulty.failures = 1  # the log upload fails
    assert not q.commit()
    assert q.committed_queue_offset == 0
    for qo in range(10, 20):
        q.append(qo, _record(qo), 0, 0)
    assert q.log.commit()  # the log succeeds, then the cq upload fails
    faulty.failures = 1
    assert not q.cq.commit()
    assert q.committed_queue_offset == 0  # entries not committed: nothing readable yet
    assert q.commit()
    assert q.log.switches == 1 and q.cq.switches == 1
    assert [e.record for e in q.read(0, 100)] == [_record(i) for i in range(20)]
