"""Round-trip property tests for every on-disk / RocksDB codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pop.checkpoint import HELD, PopCheckpoint, decode_checkpoint, encode_checkpoint
from pop.handle import HandleCodec, InvalidReceiptHandle, ReceiptHandle
from store import checkpoint as offset_ckpt
from store.consumequeue import ENTRY
from store.message import (
    Message,
    MessageIdFormat,
    RecordError,
    check_record,
    decode_dispatch_infos,
    decode_properties,
    decode_record,
    draft_of_record,
    encode_properties,
    encode_record,
    reframe_record,
)

text = st.text(max_size=40)
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**63 - 1)

messages = st.builds(
    Message,
    message_id=st.text(alphabet="0123456789ABCDEF-_", max_size=64),
    topic=st.text(min_size=1, max_size=30),
    body=st.binary(max_size=300),
    key=text,
    tag=text,
    properties=st.dictionaries(text, text, max_size=5),
    born_at_ms=u64,
    store_at_ms=u64,
    deliver_at_ms=u64,
    queue_id=u16,
    queue_offset=u64,
    delivery_attempt=u32,
    flags=u16,
)


@given(messages)
def test_record_round_trip(m: Message) -> None:
    data = encode_record(m)
    back = decode_record(data, 0, commit_offset=7)
    m.commit_offset, m.record_size = 7, len(data)
    assert back == m


@given(messages, st.integers(12, 400))
def test_any_flipped_byte_fails_the_crc(m: Message, at: int) -> None:
    data = bytearray(encode_record(m))
    at %= len(data)
    data[at] ^= 0x5A
    with pytest.raises(RecordError):
        check_record(bytes(data), 0)


@given(st.lists(messages, min_size=1, max_size=5))
def test_dispatch_infos_match_full_decode(batch: list[Message]) -> None:
    data = b"".join(encode_record(m) for m in batch)
    infos, used = decode_dispatch_infos(data + b"\x00" * 10, 1000)
    assert used == len(data)
    assert [(i.message_id, i.topic, i.key, i.tag, i.queue_offset) for i in infos] == [
        (m.message_id, m.topic, m.key, m.tag, m.queue_offset) for m in batch]


@given(st.dictionaries(text, text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


@given(u64)
def test_offset_checkpoint_round_trip(offset: int) -> None:
    assert offset_ckpt.decode_checkpoint(offset_ckpt.encode_checkpoint(offset)) == offset


@given(u64, u32, u32, u64)
def test_consume_queue_entry_round_trip(off: int, size: int, tag: int, at: int) -> None:
    assert ENTRY.unpack(ENTRY.pack(off, size, tag, at)) == (off, size, tag, at)


@given(u64, u64, u64, st.integers(1, 200), st.data())
def test_pop_checkpoint_round_trip(start: int, pop_at: int, expire: int, count: int,
                                   data: st.DataObject) -> None:
    ck = PopCheckpoint(start, pop_at, expire, count, bytearray((count + 7) // 8))
    for i in data.draw(st.sets(st.integers(0, count - 1))):
        ck.overrides[i] = data.draw(u64)
    for i in data.draw(st.sets(st.integers(0, count - 1))):
        ck.mark(i)
    back = decode_checkpoint(start, encode_checkpoint(ck))
    assert back == ck
    # an entry held for its key (an override of HELD) has no deadline (pop.flowcontrol)
    assert back.deadlines() == {ck.expire_of(i) for i in range(count) if not ck.is_acked(i)
                                and ck.overrides.get(i, -1) != HELD}
    assert back.held() == sorted(i for i, e in ck.overrides.items()
                                 if e == HELD and not ck.is_acked(i))


handles = st.builds(ReceiptHandle, topic=st.text(min_size=1, max_size=50), queue_id=u16,
                    ck_start=u64, queue_offset=u64, expire_at_ms=u64,
                    attempt=st.integers(0, 2**16 - 1), renewable=st.booleans())


@given(handles, st.text(min_size=1, max_size=20))
def test_receipt_handle_round_trip_and_group_binding(h: ReceiptHandle, group: str) -> None:
    codec = HandleCodec(b"s" * 32)
    text_handle = codec.encode(group, h)
    assert codec.decode(group, text_handle) == h
    with pytest.raises(InvalidReceiptHandle):
        codec.decode(group + "x", text_handle)


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**16 - 1), u64)
def test_message_ids_locate_their_record(now_ms: int, node: int, offset: int) -> None:
    ids = MessageIdFormat(node)
    mid = ids.make(ids.prefix(now_ms), offset)
    assert len(mid) == 32 and mid == mid.upper()
    assert ids.locate(mid) == offset
    assert MessageIdFormat((node + 1) & 0xFFFF).locate(mid) is None
    assert ids.locate(mid[:-1]) is None and ids.locate("Z" * 32) is None


def test_message_ids_sort_by_time_then_offset() -> None:
    ids = MessageIdFormat(3)
    a = [ids.make(ids.prefix(1_000), off) for off in (0, 5, 10_000)]
    b = [ids.make(ids.prefix(1_001), off) for off in (0, 7)]
    assert a + b == sorted(a + b) and len(set(a + b)) == 5


@given(messages, u16, u16, u64, u64, u64, u32)
def test_reframed_record_keeps_contents_and_takes_new_header(
        m: Message, flags: int, qid: int, qo: int, store_at: int, deliver: int,
        attempt: int) -> None:
    again = reframe_record(encode_record(m), flags, qid, qo, m.born_at_ms, store_at, deliver,
                           attempt)
    back = decode_record(again)
    assert (back.message_id, back.topic, back.key, back.tag, back.properties, back.body) == (
        m.message_id, m.topic, m.key, m.tag, m.properties, m.body)
    assert (back.flags, back.queue_id, back.queue_offset, back.store_at_ms,
            back.deliver_at_ms, back.delivery_attempt) == (flags, qid, qo, store_at, deliver,
                                                            attempt)
    d = draft_of_record(encode_record(m), deliver, flags)
    assert (d.message_id, d.topic, d.key, d.tag, d.born_at_ms, d.delivery_attempt) == (
        m.message_id, m.topic, m.key, m.tag, m.born_at_ms, m.delivery_attempt)
