"""A PUT whose body the server never gets whole is refused, not stored (SeaweedFS).

Seen in the failover chaos (``cut-s3``): the S3 connection of broker B was cut while it
overwrote its delayed stream's metadata copy, and SeaweedFS kept an empty object under
that key (its ETag the MD5 of nothing).  A takeover then read the copy as a queue with
nothing in it and adopted none of B's pending delayed messages: 14 sends answered OK
were never delivered.  Every PUT now carries ``Content-MD5``, which S3 and SeaweedFS
check against the body they got: a body lost on the way is a ``BadDigest``, the write
fails (and is retried by its caller), and the object keeps its last whole content.

The loss is made here by a proxy in front of SeaweedFS that passes each PUT on with its
body dropped (``Content-Length: 0``), as a server that lost the body sees it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import CREDS
from tiered.errors import TierError
from tiered.providers.s3 import S3Provider, S3Settings


class BodyDropper:
    """A one-request-per-connection HTTP proxy that forwards every PUT without its body."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: socket.socket) -> None:
        with client, socket.create_connection(self._upstream) as up:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in
                      (line.partition(b":") for line in lines[1:])}
            length = int(fields.get(b"content-length", b"0"))
            if fields.get(b"expect", b"").lower() == b"100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            while len(body) < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                body += chunk
            keep = [line for line in lines[1:] if not line.lower().startswith(
                (b"content-length:", b"expect:", b"connection:"))]
            if lines[0].startswith(b"PUT "):
                self.dropped += 1
                forwarded = b"\r\n".join([lines[0], *keep, b"Content-Length: 0",
                                          b"Connection: close"]) + b"\r\n\r\n"
            else:
                forwarded = b"\r\n".join([lines[0], *keep, b"Content-Length: %d" % length,
                                          b"Connection: close"]) + b"\r\n\r\n" + body
            up.sendall(forwarded)
            while chunk := up.recv(65536):
                client.sendall(chunk)


@pytest.fixture
def dropper(seaweed_endpoint: str) -> Iterator[BodyDropper]:
    proxy = BodyDropper(seaweed_endpoint)
    yield proxy
    proxy.close()


def _provider(endpoint: str, bucket: str) -> S3Provider:
    return S3Provider(S3Settings(bucket=bucket, prefix="b0", endpoint_url=endpoint,
                                 max_attempts=1, **CREDS))  # type: ignore[arg-type]


def test_a_put_whose_body_is_lost_is_refused_and_the_object_keeps_its_content(
        seaweed_endpoint: str, seaweed_bucket: str, dropper: BodyDropper) -> None:
    whole = _provider(seaweed_endpoint, seaweed_bucket)
    torn = _provider(dropper.endpoint, seaweed_bucket)
    # Given a metadata copy in the tier
    whole.write("meta/q/0.json", b'{"version": 1, "end": 40}')
    # When its next copy is put and the server gets none of its body
    with pytest.raises(TierError):
        torn.write("meta/q/0.json", b'{"version": 1, "end": 47}')
    # Then the write failed, and the tier still holds the last whole copy, not nothing
    assert dropper.dropped == 1
    assert whole.read("meta/q/0.json") == b'{"version": 1, "end": 40}'


def test_a_conditional_put_whose_body_is_lost_is_refused(
        seaweed_endpoint: str, seaweed_bucket: str, dropper: BodyDropper) -> None:
    whole = _provider(seaweed_endpoint, seaweed_bucket)
    torn = _provider(dropper.endpoint, seaweed_bucket)
    # Given a lease in the tier, at a version its holder knows
    version = whole.swap("brokers/b.json", b'{"renewals": 1}', "")
    assert version is not None
    # When the holder's next conditional write loses its body on the way
    with pytest.raises(TierError):
        torn.swap("brokers/b.json", b'{"renewals": 2}', version)
    # Then the lease is as it was
    assert whole.read("brokers/b.json") == b'{"renewals": 1}'
