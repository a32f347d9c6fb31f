"""A Provider over S3 (any S3-compatible endpoint) through boto3.

Objects are keys under ``prefix`` in ``bucket``.  Requests: exists/size = 1 HEAD,
read = 1 ranged GET, write = 1 PUT (atomic per object; both bare signed requests for an
S3-compatible endpoint, under half of boto3's CPU: ``tiered.providers.s3bare``), delete
= 1 DELETE, list = 1 GET per 1,000 keys.  botocore errors are wrapped: a missing key is
``TierNotFound``, a connection failure, throttling or 5xx is ``TierUnavailable``.
Thread-safe (a boto3 client is).

Every request is bounded: ``connect_timeout_s`` to open a connection, ``read_timeout_s``
for each wait on the socket (an S3 that accepts a request and never answers), and at most
``max_attempts`` attempts in all (botocore's ``standard`` retry mode: connection errors,
time-outs, throttling and 5xx are retried with jittered exponential back-off).  So one
call against a stalled S3 gives up after about ``max_attempts`` x ``read_timeout_s`` (a
PUT's attempt also waits up to 1 s for S3's "100 Continue" before it sends the body:
botocore); the tiered dispatcher bounds its own wait further (``upload_timeout_s``).

Conditional writes (``swap``, ``create``: ``If-Match`` / ``If-None-Match``; ``delete_if``:
a DeleteObject with ``If-Match``) have three outcomes besides success, told apart in
``_conditional`` only: the object is not at that
version (None / False); the outcome is unknown (``TierOutcomeUnknown``: an attempt may
have been applied, its answer lost, so botocore's retry met the object changed by it);
an error.  409 ConditionalRequestConflict (two conditional writes at once) is retried
there, not taken for a conflict.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from tiered.errors import (
    TierError,
    TierNotFound,
    TierOutcomeUnknown,
    TierUnavailable,
    check_path,
)
from tiered.providers.s3bare import BareRequests

_MISSING = {"404", "NoSuchKey", "NotFound"}
_RETRYABLE = {"SlowDown", "Throttling", "RequestTimeout", "ServiceUnavailable",
              "InternalError", "503", "500"}
# a conditional write's refusals: the object is not at that version (AWS: 404 for
# If-Match on a missing key; SeaweedFS: 412) / a concurrent conditional write (retry)
_CONFLICT = {"PreconditionFailed", "412", "NoSuchKey", "404"}
_BUSY = {"ConditionalRequestConflict", "409"}
_BUSY_ATTEMPTS = 4  # in all, for 409 ConditionalRequestConflict
_BUSY_BACKOFF_S = 0.05  # x 2**attempt, jittered to 50-100 %
DELETE_BATCH = 1000  # keys per DeleteObjects (S3's limit)


@dataclass(frozen=True, slots=True)
class S3Settings:
    bucket: str
    prefix: str = ""
    endpoint_url: str = ""  # empty: AWS
    region: str = "us-east-1"
    access_key_id: str = ""  # empty: boto3's usual credential chain
    secret_access_key: str = ""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0  # each wait for bytes on the socket
    max_attempts: int = 3  # in all, the first included
    max_pool_connections: int = 32  # the tier's uploader and reader threads at once
    timeout_s: float = 0.0  # when set: both time-outs (the older single setting)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mapped(exc: ClientError | BotoCoreError, path: str) -> TierError:
    """The tier's error for a botocore one (the one place they are translated)."""
    if isinstance(exc, BotoCoreError):
        return TierUnavailable(f"S3 cannot be reached for {path}: {exc}")
    code = _code(exc)
    if code in _MISSING:
        return TierNotFound(f"{path} does not exist in the tier")
    if code in _RETRYABLE:
        return TierUnavailable(f"S3 is unavailable ({code}) for {path}")
    return TierError(f"S3 refused {path}: {code} {exc}")


@contextmanager
def _wrapped(path: str) -> Iterator[None]:
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise _mapped(exc, path) from exc


def _refused(exc: ClientError, path: str, maybe_applied: bool, attempts: int) -> None:
    """Return when S3's refusal of a conditional write means "not at that version";
    raise otherwise (see ``S3Provider._put_if``)."""
    code = _code(exc)
    if maybe_applied:
        raise TierOutcomeUnknown(
            f"the conditional write of {path} may have been applied: S3 answered {code} "
            "after botocore retried an attempt whose answer it did not get; read it back "
            "and compare") from exc
    if code in _CONFLICT:
        return
    if code in _BUSY:
        raise TierUnavailable(f"S3 kept refusing the conditional write of {path} ({code}, "
                              f"{attempts} attempts): retry later") from exc
    raise _mapped(exc, path) from exc


def client_config(settings: S3Settings) -> Config:
    """The botocore configuration: explicit time-outs and attempts (``total_max_attempts``
    counts the first attempt; botocore's ``max_attempts`` key would count retries only)."""
    return Config(connect_timeout=settings.timeout_s or settings.connect_timeout_s,
                  read_timeout=settings.timeout_s or settings.read_timeout_s,
                  retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},
                  max_pool_connections=settings.max_pool_connections)


def _bare_requests(settings: S3Settings) -> BareRequests | None:
    """Reads and writes without a boto3 call, for an S3-compatible endpoint with
    credentials (``tiered.providers.s3bare``); None: they go through boto3."""
    if not settings.endpoint_url:
        return None
    if settings.access_key_id:
        credentials: Any = Credentials(settings.access_key_id, settings.secret_access_key)
    else:
        credentials = boto3.Session().get_credentials()  # the chain the client uses
        if credentials is None:
            return None
    timeout = settings.timeout_s
    return BareRequests(settings.endpoint_url, settings.bucket, settings.region, credentials,
                     timeout or settings.connect_timeout_s, timeout or settings.read_timeout_s,
                     settings.max_attempts, settings.max_pool_connections)


class S3Provider:
    name = "s3"

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        if settings.max_attempts < 1:
            raise TierError("S3 max_attempts must be at least 1 (the first attempt)")
        kwargs: dict[str, Any] = {"region_name": settings.region, "config": client_config(settings)}
        if settings.endpoint_url:
            kwargs["endpoint_url"] = settings.endpoint_url
        if settings.access_key_id:
            kwargs["aws_access_key_id"] = settings.access_key_id
            kwargs["aws_secret_access_key"] = settings.secret_access_key
        self._s3 = boto3.client("s3", **kwargs)
        self._bucket = settings.bucket
        self._prefix = settings.prefix.strip("/") + "/" if settings.prefix.strip("/") else ""
        self._bare = _bare_requests(settings)

    def on_request(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(operation name)`` before every S3 request (for counting)."""
        self._s3.meta.events.register(
            "before-call.s3", lambda model, **_: callback(model.name))
        if self._bare is not None:
            self._bare.on_request.append(callback)

    def _key(self, path: str) -> str:
        return self._prefix + check_path(path)

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except TierNotFound:
            return False
        return True

    def size(self, path: str) -> int:
        with _wrapped(path):
            head = self._s3.head_object(Bucket=self._bucket, Key=self._key(path))
        return int(head["ContentLength"])

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        if length == 0:
            return b""
        if self._bare is not None:
            got = self._bare.read(self._key(path), offset, length, path)
            if got is None:  # past the end of the object, or no object
                self.size(path)  # missing -> TierNotFound
                return b""
            return got
        rng = f"bytes={offset}-" if length < 0 else f"bytes={offset}-{offset + length - 1}"
        with _wrapped(path):
            try:
                obj = self._s3.get_object(Bucket=self._bucket, Key=self._key(path), Range=rng)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    self.size(path)  # missing -> TierNotFound; else past the end
                    return b""
                raise
            return bytes(obj["Body"].read())

    def write(self, path: str, data: bytes) -> None:
        if self._bare is not None:
            self._bare.write(self._key(path), data, path)
            return
        with _wrapped(path):
            self._s3.put_object(Bucket=self._bucket, Key=self._key(path), Body=data)

    def create(self, path: str, data: bytes) -> bool:
        """A conditional PutObject (``If-None-Match: *``): S3 answers 412 when the key
        exists, and of two concurrent creators exactly one succeeds."""
        return self._put_if(path, data, "") is not None

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        with _wrapped(path):
            obj = self._s3.get_object(Bucket=self._bucket, Key=self._key(path))
            return bytes(obj["Body"].read()), str(obj["ETag"])

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        """A conditional PutObject: ``If-Match: <etag>`` (``If-None-Match: *`` for no
        version)."""
        return self._put_if(path, data, version)

    def delete_if(self, path: str, version: str) -> bool:
        """A conditional DeleteObject (``If-Match: <etag>``): 412 when the object changed,
        404 (AWS, moto) or 412 (SeaweedFS) when it is gone."""
        if not version:
            return False

        def delete() -> str:
            self._s3.delete_object(Bucket=self._bucket, Key=self._key(path), IfMatch=version)
            return version
        return self._conditional(path, delete) is not None

    def _put_if(self, path: str, data: bytes, version: str) -> str | None:
        """The one conditional PutObject (``If-Match: <version>``; ``If-None-Match: *``
        for ``""``): the new ETag, or None (``_conditional``)."""
        return self._conditional(path, lambda: self._put_once(path, data, version))

    def _conditional(self, path: str, once: Callable[[], str]) -> str | None:
        """One conditional request (``once``: a PutObject or DeleteObject with its
        condition), its outcomes mapped here once: ``once``'s answer; None when the object
        is not at that version (412 PreconditionFailed; 404
        NoSuchKey for ``If-Match`` on a missing key at AWS); 409
        ConditionalRequestConflict (a concurrent conditional write) is retried after a
        short jittered back-off, as AWS says to.  Once an attempt may have been applied
        without our seeing the answer (botocore retried it: a lost response, a time-out,
        a 5xx; or no answer came at all), no refusal is trusted: ``TierOutcomeUnknown``.
        Else ``TierUnavailable`` / ``TierError`` as for every request."""
        attempt, maybe_applied = 1, False
        while True:
            try:
                return once()
            except ClientError as exc:
                maybe_applied |= exc.response.get("ResponseMetadata", {}).get(
                    "RetryAttempts", 0) > 0
                if _code(exc) not in _BUSY or attempt == _BUSY_ATTEMPTS:
                    _refused(exc, path, maybe_applied, attempt)
                    return None
            except BotoCoreError as exc:
                raise self._unanswered(exc, path) from exc
            time.sleep(random.uniform(0.5, 1.0) * _BUSY_BACKOFF_S * 2 ** attempt)
            attempt += 1

    def _put_once(self, path: str, data: bytes, version: str) -> str:
        if version:
            put = self._s3.put_object(Bucket=self._bucket, Key=self._key(path), Body=data,
                                      IfMatch=version)
        else:
            put = self._s3.put_object(Bucket=self._bucket, Key=self._key(path), Body=data,
                                      IfNoneMatch="*")
        return str(put["ETag"])

    def _unanswered(self, exc: BotoCoreError, path: str) -> TierError:
        """A conditional write that got no answer: applied perhaps when a request went out
        (read time-out, connection closed), or when the last attempt could not connect
        but an earlier one may have gone out."""
        if isinstance(exc, HTTPClientError) or (isinstance(exc, BotoConnectionError)
                                                and self.settings.max_attempts > 1):
            return TierOutcomeUnknown(f"the conditional write of {path} got no answer from "
                                      f"S3 ({exc}): it may have been applied; read it back "
                                      "and compare")
        return _mapped(exc, path)

    def delete(self, path: str) -> None:
        with _wrapped(path):
            self._s3.delete_object(Bucket=self._bucket, Key=self._key(path))

    def delete_many(self, paths: list[str]) -> None:
        """DeleteObjects, ``DELETE_BATCH`` keys a request (quiet: only failures answer)."""
        for at in range(0, len(paths), DELETE_BATCH):
            batch = paths[at : at + DELETE_BATCH]
            with _wrapped(batch[0]):
                answer = self._s3.delete_objects(Bucket=self._bucket, Delete={
                    "Objects": [{"Key": self._key(p)} for p in batch], "Quiet": True})
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise TierError(f"could not delete {len(errors)} of {len(batch)} objects, "
                                f"{first.get('Key')!r} the first: {first.get('Code')} "
                                f"{first.get('Message')}")

    def list_versions(self, prefix: str = "", start_after: str = "") -> dict[str, str]:
        """ListObjectsV2's ETags: the ETag a GetObject of the key answers (one request
        per 1,000 keys, however many changed)."""
        out: dict[str, str] = {}
        with _wrapped(prefix or "."):
            paginator = self._s3.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix,
                                       StartAfter=self._prefix + start_after) \
                if start_after else paginator.paginate(Bucket=self._bucket,
                                                       Prefix=self._prefix + prefix)
            for page in pages:
                out.update((obj["Key"][len(self._prefix):], str(obj["ETag"]))
                           for obj in page.get("Contents", []))
        return dict(sorted(out.items()))

    def list(self, prefix: str = "") -> list[str]:
        return list(self.list_versions(prefix))  # (the same request)
