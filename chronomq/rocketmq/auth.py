"""Access-key signatures of RocketMQ 5 clients: what a signed call carries and the one
check of it (constant time).  Whose key it is, and what that principal may do, is
``chronomq.rocketmq.access``.

A signed call has exactly one ``authorization: MQv2-HMAC-SHA1 Credential=<access key>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the x-mq-date-time header
under the secret key>`` header and exactly one ``x-mq-date-time`` header, the time it was
signed as ``yyyyMMdd'T'HHmmss'Z'``.

**Freshness** (``fresh``): a signature dated more than ``MAX_SKEW_MS`` from the broker's
clock, or whose date is no such time, is refused, so a captured one cannot be replayed
for ever.  The official clients disagree on the zone: Node.js writes UTC, but Java
(``SimpleDateFormat``) and Python (``datetime.now()``) write their machine's local time
followed by a literal ``Z``.  So a date passes when it is within ``MAX_SKEW_MS`` of the
broker's clock read in UTC or in a zone in use (``UTC_OFFSETS_MIN``): a captured signature
can be replayed for up to about 26 hours (in the windows where some zone's clock shows
its date) instead of for ever.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

from chronomq.api.handlers import Metadata, one_header

SCHEME = "MQv2-HMAC-SHA1 "
# a signature dated further than this from the broker's clock is refused (in any zone in
# use): clocks kept by NTP are well inside it, and a captured signature stops working
# soon after (AWS Signature V4 allows the same 15 minutes)
MAX_SKEW_MS = 15 * 60_000
# every offset from UTC in use, in minutes (the tz database's zones, standard and summer
# time; tests/rocketmq/test_access.py checks them against the machine's)
UTC_OFFSETS_MIN = (-720, -660, -600, -570, -540, -480, -420, -360, -300, -240, -210, -180,
                   -150, -120, -60, 0, 60, 120, 180, 210, 240, 270, 300, 330, 345, 360, 390,
                   420, 480, 525, 540, 570, 600, 630, 660, 720, 765, 780, 825, 840)
_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")


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


def date_ms(date: str) -> int | None:
    """The x-mq-date-time ``yyyyMMdd'T'HHmmss'Z'`` read as UTC, in epoch ms; None when it
    is no such time."""
    if not _DATE.fullmatch(date):
        return None
    try:
        return calendar.timegm(time.strptime(date, "%Y%m%dT%H%M%SZ")) * 1000
    except ValueError:  # month 13, hour 25, ...
        return None


def fresh(date: str, now_ms: int) -> bool:
    """Whether a signature dated ``date`` is in force at the broker's ``now_ms``: within
    ``MAX_SKEW_MS`` of it read in UTC or in a zone in use (see the module doc)."""
    at_ms = date_ms(date)
    if at_ms is None:
        return False
    ahead_ms = at_ms - now_ms
    return any(abs(ahead_ms - offset * 60_000) <= MAX_SKEW_MS for offset in UTC_OFFSETS_MIN)


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
