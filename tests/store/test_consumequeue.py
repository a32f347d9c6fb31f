"""ConsumeQueue writes: ``put_many`` writes each run of consecutive queue offsets within
one file as one piece (a whole batch at once when it is one run); whatever the gaps and
file boundaries, every entry reads back where it was put and the gaps read as holes."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from store.consumequeue import ENTRY, ConsumeQueue
from store.filecache import FileCache


@settings(max_examples=80, deadline=None)
@given(offsets=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=40,
                        unique=True),
       per_file=st.integers(min_value=1, max_value=16))
def test_put_many_reads_back_every_entry_and_every_gap(offsets: list[int],
                                                       per_file: int) -> None:
    offsets.sort()
    with tempfile.TemporaryDirectory() as tmp:
        cq = ConsumeQueue(tmp, FileCache(8), entries_per_file=per_file)
        entries = [(qo, ENTRY.pack(1000 + qo, 10 + qo, qo, 5000 + qo)) for qo in offsets]
        cq.put_many(entries)
        assert cq.max_offset == offsets[-1] + 1
        got = {e.queue_offset: e for qo in range(0, cq.max_offset, per_file)
               for e in cq.get(qo, per_file)}  # a file at a time (none: never written)
        for qo in range(offsets[-1] + 1):
            if qo in offsets:
                e = got[qo]
                assert (e.commit_offset, e.record_size, e.tag_hash, e.store_at_ms) == \
                    (1000 + qo, 10 + qo, qo, 5000 + qo)
            else:
                assert qo not in got or got[qo].is_hole
