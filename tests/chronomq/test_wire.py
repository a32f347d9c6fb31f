"""The hand-written SendResponse encoder matches the generated protobuf code."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronomq.v1 import broker_pb2 as pb
from chronomq.wire import encode_send_response

results = st.lists(st.tuples(st.text(alphabet="0123456789ABCDEF", max_size=200),
                             st.integers(0, 2**63 - 1)), max_size=20)


@given(results)
def test_matches_generated_code(rs: list[tuple[str, int]]) -> None:
    expected = pb.SendResponse(results=[pb.SendResult(message_id=m, deliver_at_ms=d)
                                        for m, d in rs])
    assert pb.SendResponse.FromString(encode_send_response(rs)) == expected
    assert encode_send_response(rs) == expected.SerializeToString()
