"""The fault proxy's ``latency`` mode (``testkit.proxy``), over real sockets: a small
HTTP/1.1 server that keeps connections alive, and ``http.client`` (or a raw socket)
talking to it through the proxy."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from testkit.proxy import FaultProxy

LATENCY_MS = 50.0


class _Echo(BaseHTTPRequestHandler):
    """Answers at once: GET with ``ok``, PUT with the body's length; keeps the connection
    open (HTTP/1.1) and answers ``Expect: 100-continue`` with ``100 Continue``."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(b"ok")

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(str(len(body)).encode())

    def _answer(self, text: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(upstream: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream) as p:
        yield p


def _get_ms(conn: http.client.HTTPConnection) -> float:
    t0 = time.perf_counter()
    conn.request("GET", "/")
    answer = conn.getresponse()
    assert answer.read() == b"ok"
    return (time.perf_counter() - t0) * 1000


def test_each_request_on_a_keep_alive_connection_waits(proxy: FaultProxy) -> None:
    # Given the proxy delaying every request by LATENCY_MS
    proxy.set_mode("latency", latency_ms=LATENCY_MS)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        # When three requests go one after another over one connection
        took_ms = [_get_ms(conn) for _ in range(3)]
    finally:
        conn.close()
    # Then each waited, the first (which opened the connection) and the later ones alike
    assert all(ms >= LATENCY_MS for ms in took_ms), took_ms
    assert proxy.connections == 1
    assert proxy.requests == 3


def test_pass_mode_does_not_wait(proxy: FaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        _get_ms(conn)
    finally:
        conn.close()
    assert proxy.requests == 0


def test_a_body_after_100_continue_is_the_same_request(proxy: FaultProxy) -> None:
    """botocore sends ``Expect: 100-continue`` with a file-like body: the proxy waits
    once for the request, not again for the body after the interim answer."""
    latency_ms = 300.0  # wide, so a second wait stands out on a busy machine
    proxy.set_mode("latency", latency_ms=latency_ms)
    body = b"x" * 1000
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        t0 = time.perf_counter()
        sock.sendall(b"PUT /k HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        interim = sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        sock.sendall(body)
        answer = b""
        while not answer.endswith(b"\r\n\r\n1000"):
            data = sock.recv(1024)
            assert data, answer
            answer += data
        took_ms = (time.perf_counter() - t0) * 1000
    assert latency_ms <= took_ms < 2 * latency_ms
    assert proxy.requests == 1


def test_both_legs_send_small_writes_at_once(proxy: FaultProxy) -> None:
    """A request written in pieces (head, then body) must not wait for the peer's delayed
    ACK at the proxy (Nagle): S3 clients and servers set TCP_NODELAY, so the proxy does
    on both of its sockets.  Without it, half the PUTs of the durable-ack bench took
    ~40 ms more than the latency set (a 20 ms bench measured 7 round trips for 4.8)."""
    proxy.set_mode("latency", latency_ms=1)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        _get_ms(conn)
        with proxy._lock:
            legs = list(proxy._open)
        assert len(legs) == 2  # the client's connection and the one to the server
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in legs)
    finally:
        conn.close()
