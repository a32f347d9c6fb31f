"""Access-key signatures of RocketMQ 5 clients on the front (``rocketmq.access_key`` and
``rocketmq.secret_key``): the one check, constant-time, shared by every RPC."""

from __future__ import annotations

import hashlib
import hmac

from chronomq.api.handlers import Metadata, one_header


class AccessKeyAuth:
    """Checks the RocketMQ clients' request signature: exactly one ``authorization:
    MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex
    HMAC-SHA1 of the x-mq-date-time header under the secret key>`` (constant-time)."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._access_key = access_key
        self._secret = secret_key.encode()

    def signed(self, metadata: Metadata) -> bool:
        auth = one_header(metadata, "authorization")
        date = one_header(metadata, "x-mq-date-time")
        if auth is None or date is None:
            return False
        fields = {}
        for part in auth.removeprefix("MQv2-HMAC-SHA1 ").split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value
        expected = hmac.new(self._secret, date.encode(), hashlib.sha1).hexdigest()
        return (hmac.compare_digest(fields.get("Credential", "").encode(),
                                    self._access_key.encode())
                and hmac.compare_digest(fields.get("Signature", "").lower().encode(),
                                        expected.encode()))
