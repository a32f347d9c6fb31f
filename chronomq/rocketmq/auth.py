"""Access-key signatures of RocketMQ 5 clients: what a signed call carries and the one
check of it (constant time).  Whose key it is, and what that principal may do, is
``chronomq.rocketmq.access``.

A signed call has exactly one ``authorization: MQv2-HMAC-SHA1 Credential=<access key>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the x-mq-date-time header
under the secret key>`` header and exactly one ``x-mq-date-time`` header.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from chronomq.api.handlers import Metadata, one_header

SCHEME = "MQv2-HMAC-SHA1 "


@dataclass(frozen=True, slots=True)
class Signature:
    """What a call says it was signed with: a key, the signature, the signed date."""

    access_key: str
    signature: str  # lower-case hex
    date: str  # the x-mq-date-time header's value


def signature_of(metadata: Metadata) -> Signature | None:
    """The call's signature; None when it carries none (or two headers of a kind)."""
    auth = one_header(metadata, "authorization")
    date = one_header(metadata, "x-mq-date-time")
    if auth is None or date is None:
        return None
    fields = {}
    for part in auth.removeprefix(SCHEME).split(","):
        name, _, value = part.strip().partition("=")
        fields[name] = value
    return Signature(fields.get("Credential", ""), fields.get("Signature", "").lower(), date)


def sign(secret_key: str, date: str) -> str:
    """The signature a client holding ``secret_key`` sends for ``date`` (hex)."""
    return hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()


def verified(signature: Signature, secret_key: str) -> bool:
    """Whether ``signature`` was made with ``secret_key`` (constant time)."""
    return hmac.compare_digest(signature.signature.encode(),
                               sign(secret_key, signature.date).encode())


def same_key(given: str, key: str) -> bool:
    """Access keys compared in constant time."""
    return hmac.compare_digest(given.encode(), key.encode())
