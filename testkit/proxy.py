"""FaultProxy: a real TCP proxy on 127.0.0.1 in front of an HTTP server (moto's or
SeaweedFS's S3), with the faults a flaky object store shows.

Modes (``set_mode``), applied to every connection opened after the change; the change
itself resets the connections already open, at once, so a client's pooled keep-alive
connections meet the new mode on their next request instead of going on as before:

``pass``    bytes go both ways untouched;
``reset``   a new connection is accepted and reset at once (RST, not FIN);
``stall``   a new connection is accepted, what the client sends is read and dropped, and
            nothing ever comes back: S3 "accepts connections but never answers";
``slow``    like ``pass``, but every chunk waits ``delay_s`` before it is forwarded;
``http``    every request gets an HTTP error (``status``, default 503 with an S3
            ``ServiceUnavailable`` body) and the connection is closed;
``latency`` like ``pass``, but every HTTP request waits ``latency_ms`` before it is
            forwarded (an object store's first-byte latency, e.g. 20 ms for S3 Standard
            in-region), the same on a fresh connection and on a keep-alive one:
            ``_Turns`` below says where a request starts.

``connections`` counts accepted connections, ``by_mode`` per mode, ``requests`` the
requests ``latency`` mode delayed.  Thread-safe: one accept thread, one or two threads per
connection (daemons), all named ``proxy-*``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

MODES = ("pass", "reset", "stall", "slow", "http", "latency")
_CHUNK = 64 << 10
_REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}


def _hard_close(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), the way a crashed or overloaded peer does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _cut(sock: socket.socket) -> None:
    """End a connection another thread may be reading, now.  A close alone sends nothing
    while that read waits (the kernel keeps the socket until the read returns), so a
    pooled keep-alive connection could carry one more request; the shutdown wakes the
    read and sends a FIN, the close after it a reset."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    _hard_close(sock)


class _Turns:
    """Where a request starts on one proxied connection, for ``latency`` mode: the
    client's first chunk after the server last spoke (or after the connection opened) is
    a new request's first bytes, and waits ``latency_s`` before it goes on; the rest of
    the request follows it.  An HTTP client sends its next request on a keep-alive
    connection only once the answer to the last has come, so this is one wait per
    request, not per TCP chunk.  An interim ``HTTP/1.1 1xx`` answer (``100 Continue``)
    does not end a turn: the body sent after it belongs to the same request, as on a
    real object store, whose 100 Continue costs a network round trip (under a
    millisecond in-region), not its first-byte latency.  Shared by the connection's two
    pumps; an ``Event`` carries the turn between their threads."""

    def __init__(self, latency_s: float, counted: Callable[[], None]) -> None:
        self.latency_s = latency_s
        self._counted = counted
        self._answered = threading.Event()
        self._answered.set()  # a connection's first request waits too

    def to_server(self, data: bytes) -> None:
        if self._answered.is_set():
            self._answered.clear()
            self._counted()
            time.sleep(self.latency_s)

    def to_client(self, data: bytes) -> None:
        """Called before ``data`` is forwarded, so the turn has passed by the time the
        client can send its next request."""
        if not data.startswith(b"HTTP/1.1 1"):
            self._answered.set()


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        """``upstream``: ``http://host:port`` of the real server."""
        parts = urlsplit(upstream)
        assert parts.hostname is not None and parts.port is not None
        self._upstream = (parts.hostname, parts.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._mode, self.delay_s, self.status = "pass", 0.0, 503
        self.latency_ms = 0.0
        self._open: set[socket.socket] = set()
        self.connections = 0
        self.requests = 0  # requests delayed in ``latency`` mode
        self.by_mode: Counter[str] = Counter()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._thread.start()

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str, delay_s: float = 0.0, status: int = 503,
                 latency_ms: float = 0.0) -> None:
        """Switch to ``mode`` and reset every connection open now."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; use one of {', '.join(MODES)}")
        with self._lock:
            self._mode, self.delay_s, self.status = mode, delay_s, status
            self.latency_ms = latency_ms
            doomed, self._open = self._open, set()
        for sock in doomed:
            _cut(sock)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        with contextlib.suppress(OSError):
            self._listener.close()
        self.set_mode("pass")  # resets what is open
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ connections

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.update(socks)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                mode = self._mode
                self.connections += 1
                self.by_mode[mode] += 1
            if mode == "reset":
                _hard_close(client)
                continue
            handler = {"stall": self._stall, "http": self._http_error}.get(mode, self._pipe)
            threading.Thread(target=handler, args=(client,), name=f"proxy-{mode}",
                             daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            _hard_close(client)
            return
        upstream.settimeout(None)
        for sock in (client, upstream):  # as the client and the server set it: without,
            # a request written in two pieces (head, body) waits out the peer's delayed
            # ACK (Nagle: ~40 ms on Linux), a latency neither end would see
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(client, upstream)
        up = down = None
        if self._mode == "latency":
            turns = _Turns(self.latency_ms / 1000, self._count_request)
            up, down = turns.to_server, turns.to_client
        back = threading.Thread(target=self._pump, args=(upstream, client, down),
                                name="proxy-pump", daemon=True)
        back.start()
        self._pump(client, upstream, up)
        back.join()

    def _count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def _pump(self, src: socket.socket, dst: socket.socket,
              before: Callable[[bytes], None] | None = None) -> None:
        """Forward ``src`` to ``dst`` until either end closes; ``before`` sees each chunk
        first (and may hold it back)."""
        try:
            while data := src.recv(_CHUNK):
                if self._mode == "slow" and self.delay_s:
                    time.sleep(self.delay_s)
                if before is not None:
                    before(data)
                dst.sendall(data)
        except OSError:
            pass  # reset by a mode change or by a peer
        _hard_close(src)
        _hard_close(dst)

    def _stall(self, client: socket.socket) -> None:
        """Read and drop whatever comes; never answer (until a mode change resets it)."""
        self._track(client)
        with contextlib.suppress(OSError):
            while client.recv(_CHUNK):
                pass
        _hard_close(client)

    def _http_error(self, client: socket.socket) -> None:
        """Read one request (head, and its body unless it waits for 100-continue), answer
        it with the error status and close."""
        self._track(client)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(_CHUNK)
                if not data:
                    raise OSError("closed before the request head ended")
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:]
                          if b":" in line)
            fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
            if fields.get(b"expect", b"").lower() != b"100-continue":
                left = int(fields.get(b"content-length", b"0")) - len(body)
                while left > 0 and (data := client.recv(min(left, _CHUNK))):
                    left -= len(data)
            status = self.status
            text = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>"
                    b"ServiceUnavailable</Code><Message>injected by the fault proxy"
                    b"</Message></Error>")
            reason = _REASONS.get(status, "Error").encode()
            client.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\n"
                           b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                           % (status, reason, len(text)) + text)
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(client)
            with contextlib.suppress(OSError):
                client.close()
