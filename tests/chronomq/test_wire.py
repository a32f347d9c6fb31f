"""The hand-written SendResponse and SendRequest encoders match the generated code."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronomq.api.wire import encode_outgoing, encode_send_request, encode_send_response
from chronomq.v1 import broker_pb2 as pb

results = st.lists(st.tuples(st.text(alphabet="0123456789ABCDEF", max_size=200),
                             st.integers(0, 2**63 - 1)), max_size=20)


@given(results)
def test_matches_generated_code(rs: list[tuple[str, int]]) -> None:
    expected = pb.SendResponse(results=[pb.SendResult(message_id=m, deliver_at_ms=d)
                                        for m, d in rs])
    assert pb.SendResponse.FromString(encode_send_response(rs)) == expected
    assert encode_send_response(rs) == expected.SerializeToString()


outgoing = st.tuples(st.text(max_size=30), st.binary(max_size=300), st.text(max_size=20),
                     st.text(max_size=10),
                     st.dictionaries(st.text(max_size=10), st.text(max_size=40), max_size=4),
                     st.integers(0, 2**63 - 1), st.text(max_size=40))


@given(st.lists(outgoing, max_size=10))
def test_send_request_encoder_matches_generated_code(
        ms: list[tuple[str, bytes, str, str, dict[str, str], int, str]]) -> None:
    expected = pb.SendRequest(messages=[
        pb.OutgoingMessage(topic=t, body=b, key=k, tag=g, properties=p, message_id=i,
                           **({"deliver_at_ms": d} if d else {}))
        for t, b, k, g, p, d, i in ms])
    wire = encode_send_request(encode_outgoing(t, b, k, g, list(p.items()), d, i)
                               for t, b, k, g, p, d, i in ms)
    assert pb.SendRequest.FromString(wire) == expected
