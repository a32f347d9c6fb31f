"""The users' document: every user of a broker (or of a fleet) in one JSON object.

Layout (UTF-8 JSON, keys sorted, compact)::

    {"format": "chronomq.users",            magic: what the object is
     "version": 1,                          of this layout; another is refused
     "users": [                             sorted by name, names unique
       {"name": "billing",                  access.model.check_user_name
        "token_sha256": "<64 hex>",         SHA-256 of the token
        "rocketmq_secret": "<40 hex>",      the RocketMQ clients' secret key
        "created_ms": 1767225600000,
        "permissions": [                    at most one per (action, pattern)
          ["allow", "consume", "billing*"],  [effect, action, pattern]
          ["deny", "consume", "billing-audit"]]}]}

``encode`` and ``decode`` are a pure pair (a round-trip property test holds them so);
``decode`` checks every field with the rules a change is checked with, and refuses the
whole document (``DamagedUsers``) rather than keep part of it: a broker then keeps the
users it knew.  The document is read whole at most ``MAX_DOCUMENT_BYTES``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from access.errors import DamagedUsers
from access.model import (
    MAX_PERMISSIONS,
    MAX_USERS,
    User,
    check_user_name,
    permission,
)
from store.errors import InvalidArgument

FORMAT = "chronomq.users"
VERSION = 1
MAX_DOCUMENT_BYTES = 16 << 20
_HEX = re.compile(r"[0-9a-f]*")


def encode(users: Iterable[User]) -> bytes:
    doc = {"format": FORMAT, "version": VERSION, "users": [
        {"name": u.name, "token_sha256": u.token_sha256.hex(),
         "rocketmq_secret": u.rocketmq_secret, "created_ms": u.created_ms,
         "permissions": [[str(p.effect), str(p.action), p.pattern] for p in u.permissions]}
        for u in sorted(users, key=lambda u: u.name)]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, User]:
    """The users of a document by name (``DamagedUsers`` if any part is wrong)."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DamagedUsers(f"the users' document is {len(data)} bytes, more than "
                           f"{MAX_DOCUMENT_BYTES}")
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DamagedUsers(f"not a users' document (no \"format\": {FORMAT!r})")
        if doc.get("version") != VERSION:
            raise DamagedUsers(f"users' document version {str(doc.get('version'))[:20]} "
                               f"is not {VERSION} (written by another chronomq?)")
        entries = doc.get("users")
        if not isinstance(entries, list) or len(entries) > MAX_USERS:
            raise DamagedUsers(f"\"users\" must be a list of at most {MAX_USERS}")
        users: dict[str, User] = {}
        for entry in entries:
            user = _user(entry)
            if user.name in users:
                raise DamagedUsers(f"user {user.name!r} appears twice")
            users[user.name] = user
        return users
    except (ValueError, TypeError, KeyError, RecursionError, InvalidArgument) as exc:
        raise DamagedUsers(f"the users' document does not decode: {str(exc)[:200]}") from exc


def _user(entry: Any) -> User:
    if not isinstance(entry, dict):
        raise DamagedUsers("a user must be an object")
    name = entry["name"]
    digest, secret, created = entry["token_sha256"], entry["rocketmq_secret"], \
        entry["created_ms"]
    if not isinstance(name, str) or not isinstance(digest, str) or \
            not isinstance(secret, str) or type(created) is not int:
        raise DamagedUsers("a user's fields have the wrong types")
    check_user_name(name)
    if len(digest) != 64 or not _HEX.fullmatch(digest) or len(secret) != 40 or \
            not _HEX.fullmatch(secret) or not 0 <= created < 2**63:
        raise DamagedUsers(f"user {name!r}: token_sha256, rocketmq_secret or created_ms "
                           "is malformed")
    grants = entry["permissions"]
    if not isinstance(grants, list) or len(grants) > MAX_PERMISSIONS:
        raise DamagedUsers(f"user {name!r}: permissions must be a list of at most "
                           f"{MAX_PERMISSIONS}")
    perms = []
    for g in grants:
        if not isinstance(g, list) or len(g) != 3 or not all(isinstance(w, str) for w in g):
            raise DamagedUsers(f"user {name!r}: a permission is [effect, action, pattern]")
        perms.append(permission(*g))
    if len({(p.action, p.pattern) for p in perms}) != len(perms):
        raise DamagedUsers(f"user {name!r}: two permissions on one action and pattern")
    return User(name, bytes.fromhex(digest), secret, created, tuple(perms))
