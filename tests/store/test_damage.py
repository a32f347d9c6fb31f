"""Damaged CommitLog files, in process: real files and RocksDB, a manual clock.

* A torn tail of every length, from one byte to a whole record header and beyond, cut
  from the newest segment after a clean stop and in a crash image (the files as a
  kill -9 leaves them): the store opens, keeps every record before the cut, forgets the
  cut one, never hands out its queue offset again, and keeps dispatching new sends.
* A flipped byte in a record that is not the last of the newest segment, in a crash
  image (recovery scans it): skipped and reported, never a refusal to start; the same in
  the last record is a torn tail.
* A missing checkpoint file: a longer replay, nothing lost, no offset reused.

The crash image is a copy of the data directory taken while the store runs, after its
dispatcher persisted its positions: the CommitLog checkpoint is behind (recovery scans
the newest segment), every dispatcher checkpoint is at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from store.checkpoint import OffsetCheckpoint
from store.clock import ManualClock
from store.consumequeue import CqEntry
from store.errors import ChronomqError
from store.message import HEADER, DispatchInfo, Message
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from testkit.wait import wait_until

TOPIC = "t"
QUEUES = 2
RESTART_MS = 60_000  # how far the clock moves across a restart
CUTS = range(1, HEADER.size + 9)  # every torn tail up to a whole header and a bit more


def _config(data: Path) -> StoreConfig:
    # two batches of the records below fill a segment: six batches make three segments
    return StoreConfig(str(data), segment_bytes=3000, cq_entries_per_file=100)


def _dispatched(s: MessageStore) -> None:
    assert s.dispatcher is not None
    dispatcher = s.dispatcher
    # on the real clock: a manual clock never ends the store's own waits
    wait_until(lambda: dispatcher.dispatched_offset >= s.commitlog.confirmed_offset, 5,
               f"the dispatcher to reach {s.commitlog.confirmed_offset}",
               show=lambda: f"dispatched to {dispatcher.dispatched_offset}")


def _open(data: Path, clock: ManualClock) -> MessageStore:
    s = MessageStore(_config(data), clock)
    s.open()
    s.start()
    return s


def _put(s: MessageStore, bodies: list[bytes]) -> list[DispatchInfo]:
    infos = s.put([Message("", TOPIC, b) for b in bodies]).result(10)
    _dispatched(s)
    return infos


@dataclass(frozen=True)
class Image:
    """A data directory to damage, and what it holds."""

    data: Path
    sent: list[DispatchInfo]  # in CommitLog order
    consumed: dict[int, int]  # a reader that read everything: its next queue offsets
    clock_ms: int


def _build(root: Path, crashed: bool) -> Image:
    clock = ManualClock()
    live = root / "live"
    s = _open(live, clock)
    s.create_topic(Topic(TOPIC, QUEUES))
    sent: list[DispatchInfo] = []
    for b in range(6):
        sent += _put(s, [f"{b}-{i}-".encode() * 40 for i in range(5)])
    consumed = {q: s.queue_bounds(TOPIC, q)[1] for q in range(QUEUES)}
    assert sum(consumed.values()) == len(sent)
    if not crashed:
        s.stop()
        return Image(live, sent, consumed, clock.now_ms())
    end = s.commitlog.confirmed_offset
    cq_checkpoint = OffsetCheckpoint(str(live / "checkpoint" / "consumequeue"))
    clock.advance(5_000)  # the dispatcher's periodic flush persists every position
    wait_until(lambda: cq_checkpoint.read() == end, 5, f"the consume-queue checkpoint at {end}",
               show=cq_checkpoint.read)
    image = root / "image"
    shutil.copytree(live, image)  # the files as a kill -9 at this moment leaves them
    s.stop()
    return Image(image, sent, consumed, clock.now_ms())


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Image:
    return _build(tmp_path_factory.mktemp("stopped"), crashed=False)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Image:
    return _build(tmp_path_factory.mktemp("crashed"), crashed=True)


def _segments(data: Path) -> list[Path]:
    return sorted((data / "commitlog").glob("*.log"))


def _newest_segment(data: Path) -> tuple[Path, int]:
    seg = _segments(data)[-1]
    return seg, int(seg.name[:-4])


def _verified(s: MessageStore, q: int, e: CqEntry) -> Message | None:
    """The message an entry points at, if it is the one the entry stands for (what a
    consumer must check before it delivers)."""
    try:
        m = s.read_message(e.commit_offset, e.record_size)
    except (ChronomqError, ValueError):
        return None
    if (m.topic, m.queue_id, m.queue_offset) != (TOPIC, q, e.queue_offset):
        return None
    return m


def _delivered(s: MessageStore, start: dict[int, int] | None = None) -> list[str]:
    """The ids a consumer reading every queue from ``start`` (0) gets, queue by queue."""
    ids: list[str] = []
    for q in range(QUEUES):
        at = (start or {}).get(q, 0)
        while entries := s.consume_queue_entries(TOPIC, q, at, 64):
            ids += [m.message_id for e in entries if (m := _verified(s, q, e)) is not None]
            at = entries[-1].queue_offset + 1
    return ids


def _by_queue(infos: list[DispatchInfo]) -> list[str]:
    return [i.message_id for q in range(QUEUES) for i in infos if i.queue_id == q]


def _entries(s: MessageStore) -> list[CqEntry]:
    out: list[CqEntry] = []
    for q in range(QUEUES):
        lo, hi = s.queue_bounds(TOPIC, q)
        at = lo
        while at < hi and (got := s.consume_queue_entries(TOPIC, q, at, 64)):
            out += got
            at = got[-1].queue_offset + 1
    return out


def _no_dispatch_errors(caplog: pytest.LogCaptureFixture, when: str) -> None:
    """No dispatcher tripped over a record boundary (a position inside a record)."""
    bad = [m for r in caplog.records if "damaged record" not in (m := r.getMessage())
           and ("bad magic" in m or (r.levelno >= logging.ERROR
                                     and r.name.startswith("store.dispatcher")))]
    assert not bad, f"{when}: {bad[:3]}"


def _restart_and_check(image: Image, data: Path, kept: list[DispatchInfo],
                       caplog: pytest.LogCaptureFixture, when: str) -> list[DispatchInfo]:
    """Open the damaged copy and check it: ``kept`` (in CommitLog order) is what must
    survive; everything else sent is gone; new sends get fresh queue offsets and reach
    both a new reader and the reader that had consumed everything.  Returns the new
    sends."""
    caplog.clear()
    clock = ManualClock(image.clock_ms + RESTART_MS)
    s = _open(data, clock)
    try:
        end = kept[-1].commit_offset + kept[-1].record_size
        assert s.commitlog.confirmed_offset == end, when
        # no queue entry points at what recovery removed
        assert all(e.commit_offset + e.record_size <= end for e in _entries(s)), when
        _dispatched(s)
        assert _delivered(s) == _by_queue(kept), when
        gone = [i for i in image.sent if i not in kept]
        for info in gone:
            assert s.query_by_message_id(info.message_id) == [], when
        # When new messages are sent after the restart
        new = _put(s, [f"new-{i}-".encode() * 30 for i in range(4)])
        # Then their queue offsets are new ones: never one handed out before the damage
        for info in new:
            assert info.queue_offset >= image.consumed[info.queue_id], (when, info)
        # and both a new reader and the one that had read everything get them
        assert _delivered(s) == _by_queue(kept + new), when
        assert _delivered(s, image.consumed) == _by_queue(new), when
        for info in gone:
            assert s.query_by_message_id(info.message_id) == [], when
        _no_dispatch_errors(caplog, when)
        return new
    finally:
        s.stop()


def _copy(image: Image, to: Path) -> Path:
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(image.data, to)
    return to


# ---------------------------------------------------------------------- torn tails


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["stopped", "crashed"])
def test_a_torn_tail_of_every_length_is_truncated(kind: str, tmp_path: Path,
                                                  request: pytest.FixtureRequest,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    image: Image = request.getfixturevalue(kind)
    last = image.sent[-1]
    assert last.record_size > max(CUTS)  # every cut stays inside the last record
    assert len(_segments(image.data)) >= 3  # the newest segment follows sealed ones
    for k in CUTS:
        # Given the last k bytes of the newest segment lost
        data = _copy(image, tmp_path / "data")
        seg, _ = _newest_segment(data)
        os.truncate(seg, seg.stat().st_size - k)
        # Then the store opens without the cut record and keeps going
        _restart_and_check(image, data, image.sent[:-1], caplog, f"{kind}, cut {k} bytes")


def _next_offsets(image: Image, new: list[DispatchInfo]) -> dict[int, int]:
    """Past every queue offset handed out: before the damage, then ``new``."""
    out = dict(image.consumed)
    for i in new:
        out[i.queue_id] = max(out[i.queue_id], i.queue_offset + 1)
    return out


def test_a_torn_tail_stays_truncated_across_another_restart(
        crashed: Image, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(crashed, tmp_path / "data")
    seg, _ = _newest_segment(data)
    os.truncate(seg, seg.stat().st_size - HEADER.size)
    new = _restart_and_check(crashed, data, crashed.sent[:-1], caplog, "first restart")
    # When the store, with its new messages, restarts again
    s = _open(data, ManualClock(crashed.clock_ms + 2 * RESTART_MS))
    try:
        _dispatched(s)
        assert _delivered(s, crashed.consumed) == _by_queue(new)
        # Then no queue offset handed out before is used again
        more = _put(s, [b"again"] * 4)
        after = _next_offsets(crashed, new)
        assert all(i.queue_offset >= after[i.queue_id] for i in more), more
        assert _delivered(s, crashed.consumed) == _by_queue(new + more)
    finally:
        s.stop()


# ---------------------------------------------------------------------- flipped bytes

# (name, byte offset inside the record; negative: from its end)
FLIPS = [("header: magic", 1), ("header: total size", 6), ("header: queue offset", 23),
         ("header: topic length", 54), ("crc", 9), ("body", -3)]


@pytest.mark.parametrize(("field", "at"), FLIPS, ids=[f for f, _ in FLIPS])
def test_a_damaged_record_is_skipped_and_reported(field: str, at: int, crashed: Image,
                                                  tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(crashed, tmp_path / "data")
    seg, base = _newest_segment(data)
    in_newest = [i for i in crashed.sent if i.commit_offset >= base]
    assert len(in_newest) >= 3
    victim = in_newest[1]  # neither the first nor the last of the newest segment
    # Given one byte of that record flipped
    pos = victim.commit_offset - base + (at if at >= 0 else victim.record_size + at)
    raw = bytearray(seg.read_bytes())
    raw[pos] ^= 0xFF
    seg.write_bytes(bytes(raw))
    # Then the store opens (recovery scanned the record), skips it and reports it
    kept = [i for i in crashed.sent if i is not victim]
    _restart_and_check(crashed, data, kept, caplog, field)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    offsets = (str(victim.commit_offset), str(victim.commit_offset - base))
    assert any("damaged record" in m and seg.name in m and any(o in m for o in offsets)
               for m in errors), errors


def test_a_flipped_byte_in_the_last_record_is_a_torn_tail(
        crashed: Image, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(crashed, tmp_path / "data")
    seg, _ = _newest_segment(data)
    raw = bytearray(seg.read_bytes())
    raw[-crashed.sent[-1].record_size // 2] ^= 0xFF
    seg.write_bytes(bytes(raw))
    _restart_and_check(crashed, data, crashed.sent[:-1], caplog, "last record flipped")


# ---------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("checkpoint", ["commitlog/checkpoint", "checkpoint/consumequeue"])
def test_a_missing_checkpoint_costs_a_replay_only(checkpoint: str, crashed: Image,
                                                  tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(crashed, tmp_path / "data")
    os.remove(data / checkpoint)
    new = _restart_and_check(crashed, data, crashed.sent, caplog, f"without {checkpoint}")
    # and with nothing lost, the queues went on exactly where they were, and still do
    assert sorted((i.queue_id, i.queue_offset) for i in new) == sorted(
        (q, crashed.consumed[q] + n) for q in range(QUEUES)
        for n in range(sum(1 for i in new if i.queue_id == q)))
    os.remove(data / checkpoint)
    s = _open(data, ManualClock(crashed.clock_ms + 2 * RESTART_MS))
    try:
        _dispatched(s)
        assert _delivered(s) == _by_queue(crashed.sent + new)
        assert [s.queue_bounds(TOPIC, q)[1] for q in range(QUEUES)] == [
            _next_offsets(crashed, new)[q] for q in range(QUEUES)]
    finally:
        s.stop()
