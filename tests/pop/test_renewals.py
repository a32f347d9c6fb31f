"""Renewal marks (``pop.renewals``): their codec, a damaged or foreign value left alone,
and a takeover's shift of their receive times."""

from __future__ import annotations

from pop.renewals import (
    KEY_PREFIX,
    RenewMark,
    decode_mark,
    encode_mark,
    mark_key,
    moved_marks,
)


def test_a_mark_reads_back_as_written() -> None:
    mark = RenewMark("AQID-handle_x", "pushers", "client-ü", 30, 1_700_000_000_000)
    key, value = encode_mark(mark)
    assert key == mark_key(mark.handle) and key.startswith(KEY_PREFIX)
    assert decode_mark(key, value) == mark


def test_a_damaged_or_foreign_value_is_no_mark() -> None:
    key, value = encode_mark(RenewMark("h", "g", "c", 30, 5))
    assert decode_mark(key, value[:5]) is None  # torn head
    assert decode_mark(key, b"\x02" + value[1:]) is None  # another version
    assert decode_mark(key, value[:-1] + b"\xff") is None  # not UTF-8
    assert decode_mark(b"Rc" + key[2:], value) is None  # another kind of state
    assert decode_mark(KEY_PREFIX + b"h" * 2000, value) is None  # no handle is that long
    head = bytearray(value)
    head[13:15] = (60000).to_bytes(2, "big")  # a group length past the value's end
    assert decode_mark(key, bytes(head)) is None


def test_a_takeover_moves_the_receive_times_and_keeps_only_marks() -> None:
    a = encode_mark(RenewMark("h1", "g", "c", 30, 1_000))
    b = encode_mark(RenewMark("h2", "g", "", 60, 2_000))
    other = (b"Rc" + b"broker-a", b"\x01" + bytes(8))
    moved = moved_marks([a, other, b, (KEY_PREFIX + b"x", b"junk")], 500)
    assert [decode_mark(k, v) for k, v in moved] == [
        RenewMark("h1", "g", "c", 30, 1_500), RenewMark("h2", "g", "", 60, 2_500)]
