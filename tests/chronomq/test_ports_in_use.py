"""A listener whose port is taken: ``chronomq serve`` says which setting and address, in
one line and without a traceback, exits 2 and leaves nothing half-started (the data
directory is free for the next start, no thread keeps running).

Every listener is covered: the API (``server.port``), the console (``console.port``),
Prometheus (``server.metrics_port``) and the RocketMQ front (``rocketmq.port``).  The port
is held by a listening socket of the test, as another broker on the machine would.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.config import BrokerConfig, ConsoleConfig, RocketMQConfig, load_config
from chronomq.listeners import ListenError
from chronomq.server import BrokerServer
from store.errors import InvalidArgument
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.conftest import broker_config

SETTINGS = ["server.port", "console.port", "server.metrics_port", "rocketmq.port"]


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A port on 127.0.0.1 another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def _serve(data_dir: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    """``chronomq serve`` at the default log level with every port free (0) but
    ``settings``; it must leave on its own."""
    cmd = [sys.executable, "-m", "chronomq.cli", "serve",
           "--set", f"store.data_dir={data_dir}", "--set", "server.port=0",
           "--set", "server.metrics_port=0", "--set", "console.port=0",
           "--set", "rocketmq.enabled=true", "--set", "rocketmq.port=0",
           *[a for s in settings for a in ("--set", s)]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_taken_port_is_one_line_exit_2_and_nothing_left(
        setting: str, taken: socket.socket, tmp_path: Path) -> None:
    # Given a data directory a broker has used, and a port another program listens on
    data = tmp_path / "data"
    ServerProcess(data).terminate()
    port = taken.getsockname()[1]
    # When a broker is started with one of its listeners on that port
    t0 = time.monotonic()
    run = _serve(data, f"{setting}={port}")
    # Then it says which setting and address, once, and leaves with 2
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    line = lines[0]
    assert line.startswith("error: ") and setting in line, line
    assert f"127.0.0.1:{port}" in line and "already in use" in line, line
    assert f"--set {setting}=" in line, line  # what to do
    assert time.monotonic() - t0 < 30  # no thread kept it alive
    # and the data directory is free: the next start with free ports opens it at once
    again = ServerProcess(data)
    assert again.terminate() == 0


def test_two_settings_on_one_port_are_named_together(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"console\.port and server\.metrics_port"):
        load_config(None, ["console.port=7612", "server.metrics_port=7612"])
    run = _serve(tmp_path / "data", "console.port=7612", "server.metrics_port=7612")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run
    assert "console.port and server.metrics_port are both 7612" in run.stderr, run.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def _config(tmp_path: Path, setting: str, port: int) -> BrokerConfig:
    config = broker_config(tmp_path / "data")
    rocketmq = RocketMQConfig(enabled=True, host="127.0.0.1", port=0)
    if setting == "server.port":
        return dataclasses.replace(config, server=dataclasses.replace(config.server,
                                                                      port=port))
    if setting == "server.metrics_port":
        config = dataclasses.replace(config, server=dataclasses.replace(
            config.server, metrics_port=port))
    if setting == "console.port":
        config = dataclasses.replace(config, console=ConsoleConfig(port=port))
    if setting == "rocketmq.port":
        rocketmq = dataclasses.replace(rocketmq, port=port)
    return dataclasses.replace(config, rocketmq=rocketmq)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_port_taken_during_start_releases_everything(setting: str,
                                                       tmp_path: Path) -> None:
    # Given a broker whose ports were free when it was made, in this process
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = set(threading.enumerate())
    server = BrokerServer(_config(tmp_path, setting, port))
    # When another program takes one of them before the broker listens
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        with pytest.raises(ListenError) as refused:
            server.start()
    # Then the error names the setting and the address
    assert setting in str(refused.value) and f"127.0.0.1:{port}" in str(refused.value)
    # and nothing keeps running: no thread of the broker, its store closed
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before], 10,
               "the broker's threads to end",
               show=lambda: [t for t in threading.enumerate() if t not in before], poll_s=0.05)
    again = BrokerServer(broker_config(tmp_path / "data"))  # RocksDB's locks were released
    again.start()
    again.stop()
