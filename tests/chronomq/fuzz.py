"""Hostile requests for any gRPC method, generated from the method's own descriptors, and
the oracles every answer must satisfy.  Shared by the CI property tests
(``test_hostile_rpc.py``) and the long mode (``bench/bench_fuzz.py``).

Requests are built field by field from the input message's descriptor: strings lean on
names that have broken brokers (``..``, ``/``, ``%RETRY%``, a trailing newline, very
long, empty), numbers on the edges of their types, bytes on garbage; a share of requests
are raw bytes that are not the message at all.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import strategies as st

NASTY_NAMES = ["", ".", "..", "../x", "%/../../x", "/etc", "a/b", "t\n", "t\x00", " t",
               "%RETRY%g", "%DLQ%g", "%RETRY%", "canary", "t", "g", "T" * 128, "é", "t%",
               "x" * 300, "\u202e", "*", "a|b", "CON", "-", "_"]
INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1,
             1_800_000_000_000, 10**10, 10**19]
BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(NASTY_NAMES), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"\xff" * 8]))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    lo, hi = _INT_RANGES[t]
    return st.one_of(st.sampled_from([v for v in INT_EDGES if lo <= v <= hi]),
                     st.integers(lo, hi))


def message_strategy(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of type ``desc`` with any subset of fields set to hostile values."""
    cls = message_factory.GetMessageClass(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if f.message_type.GetOptions().map_entry:
                key = _scalar(f.message_type.fields_by_name["key"])
                value = _scalar(f.message_type.fields_by_name["value"])
                fields[f.name] = st.dictionaries(key, value, max_size=4)
                continue
            inner = message_strategy(f.message_type, depth + 1)
        else:
            inner = _scalar(f)
        if f.is_repeated:
            inner = st.lists(inner, max_size=4)
        fields[f.name] = inner

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        msg = cls()
        chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True)) if fields else []
        for name in chosen:
            value = draw(fields[name])
            f = desc.fields_by_name[name]
            try:
                if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions(
                        ).map_entry:
                    getattr(msg, name).update(value)
                elif f.is_repeated:
                    getattr(msg, name).extend(value)
                elif f.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).CopyFrom(value)
                else:
                    setattr(msg, name, value)
            except (ValueError, TypeError):
                pass  # a value the field cannot hold (a bad enum number in a map, ...)
        return msg
    return build()


def frames(method: MethodDescriptor) -> st.SearchStrategy[list[bytes]]:
    """The request frames of one call: serialized messages, now and then raw garbage."""
    one = st.one_of(message_strategy(method.input_type).map(lambda m: m.SerializeToString()),
                    st.binary(max_size=48))
    return st.lists(one, min_size=1, max_size=3 if method.client_streaming else 1)


def call(channel: grpc.Channel, service: str, method: MethodDescriptor,
         requests: list[bytes], answers: list[bytes],
         metadata: tuple[tuple[str, str], ...] = (), timeout_s: float = 1.0,
         max_answers: int = 4, details: list[str] | None = None) -> grpc.StatusCode:
    """Make one call with raw frames, collecting the raw answers (and, into ``details``,
    an error status's message); its final status (OK for a stream we stopped reading
    after ``max_answers`` answers, or one that ran into the deadline: a long poll or an
    idle stream waits its time)."""
    path = f"/{service}/{method.name}"
    raw = {"request_serializer": None, "response_deserializer": None}
    try:
        if method.server_streaming:
            stub = (channel.stream_stream(path, **raw)(iter(requests), timeout=timeout_s,
                                                       metadata=metadata)
                    if method.client_streaming else
                    channel.unary_stream(path, **raw)(requests[0], timeout=timeout_s,
                                                      metadata=metadata))
            for answer in stub:
                answers.append(answer)
                if len(answers) >= max_answers:
                    stub.cancel()
                    break
        elif method.client_streaming:
            answers.append(channel.stream_unary(path, **raw)(
                iter(requests), timeout=timeout_s, metadata=metadata))
        else:
            answers.append(channel.unary_unary(path, **raw)(
                requests[0], timeout=timeout_s, metadata=metadata))
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        if details is not None:
            details.append(exc.details() or "")
        if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
            return grpc.StatusCode.OK
        return code
    return grpc.StatusCode.OK


def tree(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (but not under ``skip``): path -> (size, mtime ns)."""
    out: dict[str, tuple[int, int]] = {}
    skipped = {p.resolve() for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath).resolve() in skipped:
            dirnames.clear()
            continue
        for name in filenames:
            p = os.path.join(dirpath, name)
            try:
                st_ = os.stat(p)
            except FileNotFoundError:
                continue
            out[p] = (st_.st_size, st_.st_mtime_ns)
    return out


class Tally:
    """Status counts of a fuzz run, and the defects found (bad status, with the call)."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.defects: list[str] = []

    def record(self, method: str, code: grpc.StatusCode, requests: list[bytes]) -> None:
        self.statuses[code.name] += 1
        if code in BAD_CODES:
            self.defects.append(f"{method} -> {code.name}: {[r[:80] for r in requests]}")

    def lines(self) -> Iterator[str]:
        yield f"requests: {sum(self.statuses.values())}"
        for name, n in self.statuses.most_common():
            yield f"  {name}: {n}"
        yield f"defects: {len(self.defects)}"
