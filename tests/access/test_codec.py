"""The users' document: ``encode``/``decode`` round-trip, and damage refused whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from access.codec import FORMAT, VERSION, decode, encode
from access.errors import DamagedUsers
from access.model import Action, Effect, Permission, User, new_user

names = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
patterns = st.one_of(st.just("*"), st.from_regex(r"[A-Za-z0-9_-]{1,127}\*?", fullmatch=True))
permissions = st.lists(st.builds(Permission, st.sampled_from(list(Effect)),
                                 st.sampled_from(list(Action)), patterns),
                       max_size=6, unique_by=lambda p: (p.action, p.pattern))
users = st.builds(User, names, st.binary(min_size=32, max_size=32),
                  st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
                  st.integers(0, 2**63 - 1), permissions.map(tuple))


@given(st.lists(users, max_size=5, unique_by=lambda u: u.name))
def test_round_trip(given_users: list[User]) -> None:
    data = encode(given_users)
    assert decode(data) == {u.name: u for u in given_users}
    assert encode(decode(data).values()) == data  # one encoding per set of users


def _doc(**changes: object) -> bytes:
    u, _ = new_user("billing", 1)
    doc = json.loads(encode([u]))
    entry = doc["users"][0]
    for key, value in changes.items():
        if key in ("format", "version", "users"):
            doc[key] = value
        else:
            entry[key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize("data", [
    b"", b"{", b"[]", b"null", b"\xff\xfe", b"[" * 100_000,
    _doc(format="other"), _doc(version=VERSION + 1), _doc(users={}),
    _doc(name="bad name"), _doc(name=7), _doc(token_sha256="00"),
    _doc(token_sha256="G" * 64), _doc(rocketmq_secret="x"), _doc(created_ms=-1),
    _doc(created_ms=1.5), _doc(permissions=[["allow", "send"]]),
    _doc(permissions=[["allow", "write", "*"]]), _doc(permissions=[["allow", "send", "a**"]]),
    _doc(permissions=[["allow", "send", "a"], ["deny", "send", "a"]]),
    _doc(permissions="allow"),
    json.dumps({"format": FORMAT, "version": VERSION,
                "users": [json.loads(_doc())["users"][0]] * 2}).encode(),
])
def test_damage_is_refused_whole(data: bytes) -> None:
    with pytest.raises(DamagedUsers):
        decode(data)
