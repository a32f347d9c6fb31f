"""A broker with its console on a free port, and a small cookie-keeping HTTP client."""

from __future__ import annotations

import http.client
import re
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from chronomq.config import ConsoleConfig
from tests.conftest import RunningServer, broker_config

TOKEN = "console-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def console_server(data: Path, token: str = TOKEN, actions: bool = True,
                   refresh_s: float = 5.0) -> RunningServer:
    config = broker_config(data, auth_token=token)
    config = replace(config, console=ConsoleConfig(port=free_port(), actions=actions,
                                                   refresh_s=refresh_s))
    return RunningServer(config)


class Browser:
    """HTTP/1.1 to the console with a cookie jar of one cookie (what a browser keeps)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookie = ""
        self.csrf = ""

    def request(self, method: str, path: str, form: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None, body: bytes | None = None
                ) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = dict(headers or {})
        if self.cookie:
            h["Cookie"] = self.cookie
        if form is not None:
            body = urlencode(form, doseq=True).encode()
            h["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        got = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        if "set-cookie" in got:
            value = got["set-cookie"].split(";", 1)[0]
            self.cookie = "" if value.endswith("=") else value
        found = re.search(r'name="csrf-token" content="([^"]+)"', text)
        if found:
            self.csrf = found.group(1)
        return r.status, got, text

    def get(self, path: str) -> tuple[int, dict[str, str], str]:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, Any]) -> tuple[int, dict[str, str], str]:
        return self.request("POST", path, form=form)

    def login(self, token: str = TOKEN) -> int:
        status, _, _ = self.post("/login", {"token": token})
        self.get("/")
        return status


@pytest.fixture
def console(tmp_path: Path) -> Iterator[RunningServer]:
    s = console_server(tmp_path / "data")
    yield s
    s.stop()


@pytest.fixture
def browser(console: RunningServer) -> Browser:
    return Browser(console.server.console_port)
