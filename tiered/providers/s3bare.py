"""BareRequests: the tier's plain reads and writes (ranged GETs, PUTs of whole objects) as
bare SigV4-signed HTTP requests, without a boto3 client call.

Why: a boto3 ``get_object`` costs 1.2-1.5 ms of CPU in the calling process (its event
hooks, parameter validation, parsing), a bare signed urllib3 GET 0.5-0.6 ms
(``bench/bench_s3_get_cost.py``).  A takeover reads thousands of small objects (a
durable-ack stream is an object per commit) on a process serving its own load, and a
durable-ack commit writes an object per queue it touched and their metadata copies:
both are bound by that CPU, not by the store (bench/RESULTS.md).  Listings, HEADs,
deletes and the conditional requests stay with boto3: they are few, and a conditional
write's outcomes need botocore's care (``tiered.providers.s3``).  A plain PUT is safe to
retry: it writes the same bytes again.

Only for an S3-compatible endpoint (``endpoint_url`` set): path-style addressing, as
botocore uses for one.  AWS itself (no endpoint) keeps boto3's reads (virtual-hosted
addressing, region redirects).  The requests are signed with botocore's own S3 SigV4
signer and the same credentials the client uses; keys are quoted as botocore quotes
them.

Bounds as the client's: a connect and a read time-out for each attempt, at most
``max_attempts`` attempts, connection errors, time-outs, throttling and 5xx retried
after a jittered exponential back-off (botocore's ``standard`` mode).  Outcomes of a
read: the bytes; None for a range past the object's end (416: the caller tells a missing
object from a short one); ``TierNotFound`` for a missing key.  Of both:
``TierUnavailable`` once the attempts are spent on what is retried; ``TierError`` for
any other refusal (403, a missing bucket), naming S3's code.  Thread-safe (urllib3's
pool is).
"""

from __future__ import annotations

import base64
import hashlib
import random
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.httpsession import get_cert_path

from tiered.errors import TierError, TierNotFound, TierUnavailable

_MISSING = {"NoSuchKey", "NotFound", ""}  # a 404 without a body is a missing key too
_RETRY_STATUS = {429, 500, 502, 503, 504}
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MAX_BACKOFF_S = 20.0


class BareRequests:
    """Ranged GETs and PUTs of ``bucket`` at ``endpoint_url`` (module docstring)."""

    def __init__(self, endpoint_url: str, bucket: str, region: str, credentials: Any,
                 connect_timeout_s: float, read_timeout_s: float, max_attempts: int,
                 max_connections: int) -> None:
        """``credentials``: botocore credentials (refreshable ones are frozen per
        request)."""
        self._base = endpoint_url.rstrip("/") + "/" + quote(bucket, safe="") + "/"
        self._region = region
        self._credentials = credentials
        self._attempts = max(1, max_attempts)
        self._timeout = urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s)
        tls: dict[str, Any] = {}
        if self._base.startswith("https:"):
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": get_cert_path(True)}
        self._http = urllib3.PoolManager(maxsize=max_connections, retries=False, **tls)
        self.on_request: list[Callable[[str], None]] = []

    def read(self, key: str, offset: int, length: int, path: str) -> bytes | None:
        """Bytes ``[offset, offset + length)`` of ``key`` (-1: to the end); ``path``
        names the object in errors."""
        rng = f"bytes={offset}-" if length < 0 else f"bytes={offset}-{offset + length - 1}"
        r = self._request("GET", "GetObject", key, {"Range": rng}, b"", path)
        if r.status in (200, 206):
            return bytes(r.data)
        if r.status == 416:
            return None
        code = _code(r)
        if r.status == 404 and code in _MISSING:
            raise TierNotFound(f"{path} does not exist in the tier")
        raise TierError(f"S3 refused {path}: {r.status} {code}")

    def write(self, key: str, data: bytes, path: str) -> None:
        """Put ``data`` as the whole object ``key`` (atomic: S3 shows old or new).  With
        ``Content-MD5``, which the server checks against the body it got: a connection
        cut in the middle of a PUT made SeaweedFS keep an empty object under the key
        (``tests/tiered/test_torn_put.py``); with it the write fails instead (boto3's own
        PUTs carry a CRC-32 the same way)."""
        digest = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        r = self._request("PUT", "PutObject", key, {"Content-Length": str(len(data)),
                                                     "Content-MD5": digest}, data, path)
        if r.status != 200:
            raise TierError(f"S3 refused {path}: {r.status} {_code(r)}")

    def _request(self, method: str, operation: str, key: str, headers: dict[str, str],
                 body: bytes, path: str) -> urllib3.BaseHTTPResponse:
        """One request, retried as the module docstring says; its last answer that is
        not retried (``TierUnavailable`` when the attempts are spent)."""
        url = self._base + quote(key, safe="/~")
        attempt = 0
        while True:
            attempt += 1
            for callback in self.on_request:
                callback(operation)
            try:
                r = self._http.request(method, url, body=body or None,
                                       headers=self._signed(method, url, headers, body),
                                       timeout=self._timeout, preload_content=True,
                                       redirect=False)
            except urllib3.exceptions.HTTPError as exc:
                why = f"S3 cannot be reached for {path}: {exc}"
            else:
                if r.status not in _RETRY_STATUS:
                    return r
                why = f"S3 is unavailable ({r.status} {_code(r)}) for {path}"
            if attempt >= self._attempts:
                raise TierUnavailable(why)
            time.sleep(random.uniform(0, min(_MAX_BACKOFF_S, 2 ** (attempt - 1))))

    def _signed(self, method: str, url: str, headers: dict[str, str], body: bytes
                ) -> dict[str, str]:
        creds = self._credentials
        frozen = creds.get_frozen_credentials() if hasattr(creds, "get_frozen_credentials") \
            else creds
        req = AWSRequest(method=method, url=url, headers=headers, data=body)
        S3SigV4Auth(Credentials(frozen.access_key, frozen.secret_key, frozen.token), "s3",
                    self._region).add_auth(req)
        return dict(req.headers.items())


def _code(r: urllib3.BaseHTTPResponse) -> str:
    """S3's error code in an answer's XML body ("" when it has none)."""
    m = _CODE.search(r.data or b"")
    return m.group(1).decode(errors="replace") if m else ""
