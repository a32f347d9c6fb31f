"""FlatFile on real providers (memory, local directory, moto S3): objects per batch, reads
across segments, switch-segment on failure and timeout (a late success is never read),
retention, metadata round trip."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.tiered.faults import FaultyProvider
from tiered.errors import TierError
from tiered.flatfile import FlatFile, FlatFileMeta
from tiered.provider import Provider


def test_batches_become_objects_and_reads_span_them(provider: Provider) -> None:
    ff = FlatFile(provider, "b0/data/t/0/log", segment_bytes=100)
    rnd = random.Random(1)
    stream = b""
    for _ in range(30):
        for _ in range(rnd.randrange(1, 4)):
            chunk = os.urandom(rnd.randrange(1, 40))
            assert ff.append(chunk, at_ms=len(stream)) == len(stream)
            stream += chunk
        assert ff.commit()
    assert ff.commit_position == ff.append_position == len(stream)
    assert len(ff.meta.segments) > 3  # segment_bytes = 100 rolled them
    assert sum(len(s.objects) for s in ff.meta.segments) == len(provider.list("b0/")) == 30
    for _ in range(200):
        a = rnd.randrange(len(stream))
        n = rnd.randrange(1, 150)
        assert ff.read(a, n) == stream[a : a + n]
    back = FlatFile(provider, "b0/data/t/0/log", FlatFileMeta.from_json(ff.meta.to_json()))
    assert back.read(0, len(stream)) == stream and back.commit_position == len(stream)


def test_a_failed_upload_switches_segment_and_loses_nothing(provider: Provider) -> None:
    faulty = FaultyProvider(provider)
    ff = FlatFile(faulty, "p")
    ff.append(b"one")
    assert ff.commit()
    faulty.failures = 2
    ff.append(b"two")
    assert not ff.commit()  # failed: the segment is sealed at 3 bytes
    ff.append(b"three")  # appends go on meanwhile
    assert not ff.commit()
    assert ff.commit()
    assert ff.switches == 2 and ff.commit_position == len(b"onetwothree")
    assert [(s.base, s.length, s.sealed) for s in ff.meta.segments] == \
        [(0, 3, True), (3, 0, True), (3, 8, False)]
    assert ff.read(0, 100) == b"onetwothree"


def test_a_timed_out_upload_that_succeeds_late_is_never_read(provider: Provider) -> None:
    faulty = FaultyProvider(provider)
    with ThreadPoolExecutor(2) as uploader:
        # the short time-out only for the upload held back (a real S3 server's first
        # PUT may take longer than it on a busy machine: seen in CI)
        ff = FlatFile(faulty, "p", upload_timeout_s=30, uploader=uploader)
        ff.append(b"aaaa")
        assert ff.commit()
        faulty.hold()
        ff.append(b"bbbb")
        ff.upload_timeout_s = 0.2
        assert not ff.commit()  # timed out; the upload is still in flight
        ff.upload_timeout_s = 30
        ff.append(b"cccc")
        faulty.release()  # ... now it lands, late, in the sealed segment
        assert ff.commit()  # the buffer, re-uploaded into a new segment
        uploader.shutdown(wait=True)
    assert faulty.writes == 3
    late = ff.object_path(0, 4)
    assert provider.exists(late)  # written, but beyond the sealed length
    assert ff.meta.segments[0].length == 4 and ff.meta.segments[0].sealed
    assert ff.read(0, 100) == b"aaaabbbbcccc"


def test_retention_drops_whole_segments_after_the_metadata(provider: Provider) -> None:
    ff = FlatFile(provider, "p", segment_bytes=4)
    for chunk in (b"aaaa", b"bbbb", b"cccc"):
        ff.append(chunk)
        assert ff.commit()
    doomed = ff.expire_before(8)
    assert len(doomed) == 2 and ff.start_position == 8
    for path in doomed:
        provider.delete(path)
    assert ff.read(8, 4) == b"cccc"
    with pytest.raises(TierError, match="expired"):
        ff.read(0, 4)
    # the last segment too, once all of it is past: the stream goes on after it
    assert ff.expire_before(100) == ["p/00000000000000000008/00000000000000000008"]
    assert ff.start_position == ff.commit_position == 12
    ff.append(b"dddd")
    assert ff.commit() and ff.read(12, 4) == b"dddd"


def test_segments_close_by_time_and_expire_by_time(provider: Provider) -> None:
    ff = FlatFile(provider, "p", segment_bytes=1 << 20, segment_ms=1000)
    for at_ms, chunk in ((1000, b"aaaa"), (1500, b"bbbb"), (2200, b"cccc"), (2300, b"dddd")):
        ff.append(chunk, at_ms)
        assert ff.commit()
    assert [(s.base, s.length) for s in ff.meta.segments] == [(0, 8), (8, 8)]
    assert ff.segments_before(1500) == 0  # the first segment has data at 1500
    assert ff.segments_before(1501) == 8
    assert ff.segments_before(2301) == 16
    doomed = ff.expire_before(ff.segments_before(2000))
    assert len(doomed) == 2 and ff.start_position == 8
    assert ff.read(8, 8) == b"ccccdddd"


def test_metadata_of_an_unknown_version_is_refused() -> None:
    with pytest.raises(TierError, match="version"):
        FlatFileMeta.from_json('{"version": 9, "start": 0, "segments": []}')
