"""A Provider over S3 (any S3-compatible endpoint) through boto3.

Objects are keys under ``prefix`` in ``bucket``.  Requests: exists/size = 1 HEAD,
read = 1 ranged GET, write = 1 PUT (atomic per object), delete = 1 DELETE, list = 1 GET
per 1,000 keys.  botocore errors are wrapped: a missing key is ``TierNotFound``, a
connection failure, throttling or 5xx is ``TierUnavailable``.  Thread-safe (a boto3
client is).

Every request is bounded: ``connect_timeout_s`` to open a connection, ``read_timeout_s``
for each wait on the socket (an S3 that accepts a request and never answers), and at most
``max_attempts`` attempts in all (botocore's ``standard`` retry mode: connection errors,
time-outs, throttling and 5xx are retried with jittered exponential back-off).  So one
call against a stalled S3 gives up after about ``max_attempts`` x ``read_timeout_s`` (a
PUT's attempt also waits up to 1 s for S3's "100 Continue" before it sends the body:
botocore); the tiered dispatcher bounds its own wait further (``upload_timeout_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tiered.errors import TierError, TierNotFound, TierUnavailable, check_path

_MISSING = {"404", "NoSuchKey", "NotFound"}
_RETRYABLE = {"SlowDown", "Throttling", "RequestTimeout", "ServiceUnavailable",
              "InternalError", "503", "500"}


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


@contextmanager
def _wrapped(path: str) -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise TierNotFound(f"{path} does not exist in the tier") from exc
        if code in _RETRYABLE:
            raise TierUnavailable(f"S3 is unavailable ({code}) for {path}") from exc
        raise TierError(f"S3 refused {path}: {code} {exc}") from exc
    except BotoCoreError as exc:
        raise TierUnavailable(f"S3 cannot be reached for {path}: {exc}") from exc


def client_config(settings: S3Settings) -> Config:
    """The botocore configuration: explicit time-outs and attempts (``total_max_attempts``
    counts the first attempt; botocore's ``max_attempts`` key would count retries only)."""
    return Config(connect_timeout=settings.timeout_s or settings.connect_timeout_s,
                  read_timeout=settings.timeout_s or settings.read_timeout_s,
                  retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},
                  max_pool_connections=settings.max_pool_connections)


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

    def on_request(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(operation name)`` before every S3 request (for counting)."""
        self._s3.meta.events.register(
            "before-call.s3", lambda model, **_: callback(model.name))

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
        with _wrapped(path):
            self._s3.put_object(Bucket=self._bucket, Key=self._key(path), Body=data)

    def create(self, path: str, data: bytes) -> bool:
        """A conditional PutObject (``If-None-Match: *``): S3 answers 412 when the key
        exists, and of two concurrent creators exactly one succeeds."""
        try:
            with _wrapped(path):
                self._s3.put_object(Bucket=self._bucket, Key=self._key(path), Body=data,
                                    IfNoneMatch="*")
        except TierError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and str(cause.response.get("Error", {}).get(
                    "Code", "")) in ("PreconditionFailed", "412",
                                     "ConditionalRequestConflict"):
                return False
            raise
        return True

    def read_versioned(self, path: str) -> tuple[bytes, str]:
        with _wrapped(path):
            obj = self._s3.get_object(Bucket=self._bucket, Key=self._key(path))
            return bytes(obj["Body"].read()), str(obj["ETag"])

    def swap(self, path: str, data: bytes, version: str) -> str | None:
        """A conditional PutObject: ``If-Match: <etag>`` (``If-None-Match: *`` for no
        version); S3 answers 412 (or 404, 409) when the object is not at that version."""
        try:
            with _wrapped(path):
                if version:
                    put = self._s3.put_object(Bucket=self._bucket, Key=self._key(path),
                                              Body=data, IfMatch=version)
                else:
                    put = self._s3.put_object(Bucket=self._bucket, Key=self._key(path),
                                              Body=data, IfNoneMatch="*")
        except TierError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and str(cause.response.get("Error", {}).get(
                    "Code", "")) in ("PreconditionFailed", "412", "ConditionalRequestConflict",
                                     "NoSuchKey", "404", "409"):
                return None
            raise
        return str(put["ETag"])

    def delete(self, path: str) -> None:
        with _wrapped(path):
            self._s3.delete_object(Bucket=self._bucket, Key=self._key(path))

    def list(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        with _wrapped(prefix or "."):
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=self._prefix + prefix)
            for page in pages:
                out += [obj["Key"][len(self._prefix):] for obj in page.get("Contents", [])]
        return sorted(out)
