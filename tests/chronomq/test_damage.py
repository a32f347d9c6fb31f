"""Damaged files under a real ``chronomq serve`` process, stopped by SIGKILL or SIGTERM
and restarted on the same data directory:

* a torn tail (the last K bytes of the newest CommitLog segment cut, or a byte of its
  last record flipped): the server starts, the cut record is gone, everything before it
  is delivered, and new sends reach a new group and a group that had consumed past the
  cut (its queue offset is never handed out again); no dispatcher trips on a record
  boundary ("bad magic"); SIGTERM then exits 0;
* a flipped byte in the header, the body or the CRC of a record that is not the last:
  the server starts, skips the record, says so at ERROR ("damaged record", the segment
  file, the offset) and in Stats ``store.damaged_records``; every other message is
  delivered and Pop answers no error;
* a missing checkpoint file: nothing acknowledged is lost and nothing acked comes back.

The same torn tails at every length, and the same damage at more header fields, run in
process in ``tests/store/test_damage.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, message
from store.message import HEADER
from testkit.process import ServerProcess, wait_tier_caught_up
from testkit.wait import wait_until

TOPIC = "t"


def _offset(message_id: str) -> int:
    """The CommitLog offset a broker-assigned id names (``MessageIdFormat``)."""
    return int(message_id, 16) & 0xFFFF_FFFF_FFFF_FFFF


def _send(c: ChronomqClient, n: int, tag: str) -> list[str]:
    outcomes = c.send([message(TOPIC, f"{tag}-{i}-".encode() * 25) for i in range(n)])
    assert all(o.ok for o in outcomes), outcomes
    return [o.message_id for o in outcomes]


def _drain(c: ChronomqClient, group: str, expect: int = 0, timeout_s: float = 5.0) -> list[str]:
    """Pop and ack until the topic is empty for ``group`` and at least ``expect``
    messages came (fails after ``timeout_s``); each message comes once."""
    got: list[str] = []

    def drained() -> bool:
        while batch := c.pop(TOPIC, group, max_messages=32, invisible_time_s=300, wait_ms=0):
            assert not any(c.ack(group, [m.receipt_handle for m in batch]))
            got.extend(m.message_id for m in batch)
        return len(got) >= expect

    wait_until(drained, timeout_s, f"{expect} messages for group {group}",
               show=lambda: f"{len(got)} came", poll_s=0.05)
    assert len(got) == len(set(got)), "a message came twice"
    return got


def _segment(data: Path) -> Path:
    """The newest CommitLog segment."""
    return sorted((data / "commitlog").glob("*.log"))[-1]


def _stop(srv: ServerProcess, how: str) -> None:
    if how == "kill9":
        srv.kill9()
    else:
        assert srv.terminate() == 0


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _fill(data: Path, *settings: str) -> tuple[ServerProcess, ChronomqClient, list[str]]:
    srv = ServerProcess(data, *settings)
    c = ChronomqClient(srv.target)
    c.create_topic(TOPIC, queue_count=2)
    sent = _send(c, 10, "a") + _send(c, 10, "b")
    return srv, c, sent


# ---------------------------------------------------------------------- torn tails


def _cut(k: int) -> Callable[[Path, str], None]:
    def damage(seg: Path, last: str) -> None:
        os.truncate(seg, seg.stat().st_size - k)
    return damage


def _flip_last(seg: Path, last: str) -> None:
    raw = bytearray(seg.read_bytes())
    raw[_offset(last) + 80] ^= 0xFF  # the newest segment starts at 0 here
    seg.write_bytes(bytes(raw))


TORN = [("kill9", "cut 1", _cut(1)), ("kill9", "cut a header", _cut(HEADER.size)),
        ("kill9", "cut a header and 4", _cut(HEADER.size + 4)),
        ("sigterm", "cut 30", _cut(30)), ("kill9", "flip in the last record", _flip_last)]


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "damage"), [(s, d) for s, _, d in TORN],
                         ids=[f"{s}-{name}" for s, name, _ in TORN])
def test_a_torn_tail_costs_the_cut_record_only(data: Path, stop: str,
                                               damage: Callable[[Path, str], None]) -> None:
    # Given 20 messages, all consumed and acked by the group "early"
    srv, c, sent = _fill(data)
    with c:
        assert sorted(_drain(c, "early", expect=20)) == sorted(sent)
    last = max(sent, key=_offset)
    # When the server stops and the newest segment loses part of its last record
    _stop(srv, stop)
    seg = _segment(data)
    assert seg.name == f"{0:020d}.log"
    damage(seg, last)
    # Then it starts; a new group gets everything but the cut record
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            before = [m for m in sent if m != last]
            assert sorted(_drain(c, "fresh", expect=19)) == sorted(before)
            assert c.query(message_id=last) == []
            assert _drain(c, "early", timeout_s=0) == []
            # and new sends reach both groups, also the one that had consumed past the cut
            new = _send(c, 6, "new")
            assert sorted(_drain(c, "early", expect=6)) == sorted(new)
            assert sorted(_drain(c, "fresh", expect=6)) == sorted(new)
            assert c.query(message_id=last) == []
        assert not [line for line in srv.output if "bad magic" in line]
    finally:
        assert srv.terminate() == 0, "".join(srv.output)


# ---------------------------------------------------------------------- flipped bytes

# where in the record: the size field of the header (a reader can no longer trust where
# the record ends), the CRC field, a byte of the body
FIELDS = {"header": 6, "crc": 9, "body": -3}


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
@pytest.mark.parametrize("field", list(FIELDS))
def test_a_damaged_record_is_skipped_and_reported(data: Path, field: str, stop: str) -> None:
    srv, c, sent = _fill(data)
    c.close()
    by_offset = sorted(sent, key=_offset)
    victim = by_offset[7]  # neither the first nor the last record
    start = _offset(victim)
    size = _offset(by_offset[8]) - start
    _stop(srv, stop)
    # Given one byte of that record flipped
    seg = _segment(data)
    raw = bytearray(seg.read_bytes())
    at = FIELDS[field]
    raw[start + (at if at >= 0 else size + at)] ^= 0xFF
    seg.write_bytes(bytes(raw))
    # Then the server starts (it never refuses) ...
    srv = ServerProcess(data)
    try:
        with ChronomqClient(srv.target) as c:
            # ... every other message is delivered, before and after it, and Pop answers
            # no error
            others = [m for m in sent if m != victim]
            assert sorted(_drain(c, "g", expect=19)) == sorted(others)
            new = _send(c, 3, "new")
            assert sorted(_drain(c, "g", expect=3)) == sorted(new)
            # ... and the damage is reported: the file and the offset, and a figure
            lines = wait_until(
                lambda: [line for line in list(srv.output) if "damaged record" in line], 5,
                'a "damaged record" line in the server\'s output',
                show=lambda: "".join(srv.output[-10:]))
            assert any("ERROR" in line and seg.name in line and str(start) in line
                       for line in lines), "".join(srv.output)
            assert c.stats().get("store.damaged_records", 0) >= 1
        assert not [line for line in srv.output if "bad magic" in line
                    and "damaged record" not in line]
    finally:
        assert srv.terminate() == 0, "".join(srv.output)


# ---------------------------------------------------------------------- checkpoints

CHECKPOINTS = ["commitlog/checkpoint", "checkpoint/consumequeue", "tiered/checkpoint"]


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_a_missing_checkpoint_loses_nothing_acked(data: Path, tmp_path: Path,
                                                  checkpoint: str) -> None:
    settings = ("tier.upload=true", f"tier.local_dir={tmp_path / 'tier'}",
                "tier.upload_batch_ms=50")
    # Given 20 messages, acked by the group "g", uploaded to the tier
    srv, c, sent = _fill(data, *settings)
    with c:
        assert sorted(_drain(c, "g", expect=20)) == sorted(sent)
        wait_tier_caught_up(c, timeout_s=10)
        wait_until(lambda: all((data / p).exists() for p in CHECKPOINTS), 10,
                   "the periodic flushes to write every checkpoint file",
                   show=lambda: [p for p in CHECKPOINTS if not (data / p).exists()])
    # When the server is killed and one checkpoint file is lost
    srv.kill9()
    os.remove(data / checkpoint)
    srv = ServerProcess(data, *settings)
    try:
        with ChronomqClient(srv.target) as c:
            # Then nothing acknowledged is lost, and nothing acked comes back to "g"
            assert sorted(_drain(c, "h", expect=20)) == sorted(sent)
            assert _drain(c, "g", timeout_s=0) == []
            new = _send(c, 5, "new")
            assert sorted(_drain(c, "g", expect=5)) == sorted(new)
            assert sorted(_drain(c, "h", expect=5)) == sorted(new)
            wait_tier_caught_up(c, timeout_s=10)
    finally:
        assert srv.terminate() == 0, "".join(srv.output)
