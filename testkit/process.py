"""Runs ``chronomq serve`` as a real subprocess (for crash tests and benchmarks)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testkit.wait import wait_until

# Debian's libfaketime (package faketime), preloaded into the server itself: the
# ``faketime`` command forks and waits, so a kill -9 of it would leave the server running
LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))), "")


def _clock_ahead(seconds: int) -> dict[str, str]:
    """The environment that sets a process's wall clock ``seconds`` ahead."""
    if not seconds:
        return {}
    if not LIBFAKETIME:
        raise RuntimeError("libfaketime is missing (apt-get install faketime)")
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": f"{seconds:+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


class ServerProcess:
    def __init__(self, data_dir: Path, *settings: str, nofile: int | None = None,
                 log_level: str = "WARNING", clock_ahead_s: int = 0,
                 start_timeout_s: float = 60.0) -> None:
        """``nofile``: the server runs with RLIMIT_NOFILE set to it (soft and hard), as
        under ``ulimit -n``; ``log_level``: the server's ``--log-level``;
        ``clock_ahead_s``: its wall clock runs this far ahead of the machine's (Debian's
        libfaketime preloaded, ``LIBFAKETIME``; its monotonic clocks are the machine's);
        ``start_timeout_s``: how long it may take to listen (a rejoining broker waits for
        its old life's takeover first) before it is killed and ``RuntimeError`` raised."""
        # The limit is set by a tiny Python that then execs the server, not by a
        # preexec_fn: with one, Popen forks (not vfork), gRPC's fork handlers restart its
        # poller in the child, and close_fds closes the poller's epoll fd under it, so the
        # child can die before exec (``epoll_wait error: Bad file descriptor``; grpc/grpc
        # #43055), a rare flake seen in CI.
        limit = [] if nofile is None else [
            sys.executable, "-c", "import os, resource, sys; resource.setrlimit("
            f"resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "os.execv(sys.argv[1], sys.argv[1:])"]
        args = [*limit, sys.executable, "-m", "chronomq.cli", "serve",
                "--log-level", log_level,
                "--set", f"store.data_dir={data_dir}", "--set", "server.port=0",
                "--set", "server.metrics_port=0", "--set", "console.port=0",
                *[a for s in settings for a in ("--set", s)]]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                     **_clock_ahead(clock_ahead_s)})
        assert self.proc.stdout is not None
        deadline = time.monotonic() + start_timeout_s
        self.output: list[str] = []
        rocketmq = "rocketmq.enabled=true" in settings
        self.rocketmq_target = ""  # host:port of the RocketMQ front, when enabled
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = re.search(r"^(chronomq|RocketMQ 5 front) listening on ([\d.]+):(\d+)", line)
            if m and m.group(1) == "RocketMQ 5 front":
                self.rocketmq_target = f"{m.group(2)}:{m.group(3)}"
            elif m:
                self.target = f"{m.group(2)}:{m.group(3)}"
            if m and (self.rocketmq_target or not rocketmq):
                self._drainer = threading.Thread(target=self._drain, daemon=True)
                self._drainer.start()
                return
        self.proc.kill()
        self.proc.wait(30)  # reaped and its pipe closed: no ResourceWarning later
        self.proc.stdout.close()
        raise RuntimeError("server did not start:\n" + "".join(self.output))

    def _drain(self) -> None:
        """Keep reading the server's output so it never blocks on a full pipe."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._close()

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and its exit code; a server still running ``timeout_s`` later is
        made to print its threads' stacks (SIGUSR1), killed, and named in the error with
        the end of its output."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.proc.kill()
            self.proc.wait(30)
            self._close()
            raise RuntimeError(f"the server did not stop {timeout_s:g} s after SIGTERM; "
                               "its output's end:\n" + "".join(self.output[-300:])) from None
        self._close()
        return code

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait for the server to leave on its own (a crash point); its exit code."""
        code = self.proc.wait(timeout_s)
        self._close()
        return code

    def _close(self) -> None:
        self._drainer.join(10)  # the process is gone, so the pipe reaches EOF
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def wait_tier_caught_up(client: Any, timeout_s: float = 60.0, poll_s: float = 0.05) -> float:
    """Wait until the broker's tier holds everything in its CommitLog (Stats
    ``tier.lag_bytes`` is 0); returns the seconds it took, fails after ``timeout_s``."""
    t0 = time.monotonic()
    lag: list[float] = []

    def caught_up() -> bool:
        lag[:] = [client.stats()["tier.lag_bytes"]]
        return lag[0] <= 0

    wait_until(caught_up, timeout_s, "the tier to catch up (Stats tier.lag_bytes 0)",
               show=lambda: f"tier.lag_bytes {lag[0]:.0f}", poll_s=poll_s)
    return time.monotonic() - t0
