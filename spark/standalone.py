"""A Spark standalone cluster on this machine, from pyspark's own distribution: one master
and N worker processes started with ``spark-class`` (the ``Master`` and ``Worker``
classes), bound to loopback, stopped by PID.  The jobs of ``spark.jobs`` run on it
unchanged with ``--master spark://127.0.0.1:PORT``.

It is what the cluster tests and ``bench/bench_spark.py --cluster N`` use; an operator
with a real cluster points ``--master`` at it instead.  Each worker gets ``cores`` cores
and ``memory`` of executor memory, and runs Python workers with this interpreter
(``PYSPARK_PYTHON``), so the project's packages are importable on the executors.

Start-up waits until every worker has registered with the master (its log says so), for
at most ``timeout_s``; a process that exits early fails the start with its log's tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pyspark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneCluster:
    """``with StandaloneCluster(workers=2) as cluster: ... cluster.master_url ...``"""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    timeout_s: float = 90.0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="spark-cluster-")))
    master_url: str = ""
    _procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._procs]

    def _env(self) -> dict[str, str]:
        home = os.path.dirname(pyspark.__file__)
        return {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(self.root),
                "SPARK_WORKER_DIR": str(self.root / "work")}

    def _spawn(self, name: str, *args: str) -> Path:
        home = os.path.dirname(pyspark.__file__)
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                    start_new_session=True)
        self._procs.append((proc, log))
        return log

    def _wait_for(self, log: Path, text: str, count: int = 1) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if log.exists() and log.read_text(errors="replace").count(text) >= count:
                return
            for proc, plog in self._procs:
                if proc.poll() is not None:
                    tail = plog.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{plog.name} exited with {proc.returncode}:\n{tail}")
            time.sleep(0.2)
        raise RuntimeError(f"no {text!r} in {log} within {self.timeout_s} s")

    def start(self) -> str:
        """Start the master and the workers; returns the master URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        master_log = self._spawn("master", "org.apache.spark.deploy.master.Master",
                                 "--host", "127.0.0.1", "--port", str(port),
                                 "--webui-port", str(_free_port()))
        try:
            self._wait_for(master_log, "Starting Spark master")
            for n in range(self.workers):
                self._spawn(f"worker{n}", "org.apache.spark.deploy.worker.Worker",
                            "--host", "127.0.0.1", "--cores", str(self.cores),
                            "--memory", self.memory, "--webui-port", str(_free_port()),
                            "--work-dir", str(self.root / f"work{n}"), self.master_url)
            self._wait_for(master_log, "Registering worker", self.workers)
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def stop(self) -> None:
        """SIGTERM every process (its session: the JVM and what it started), then SIGKILL
        what is left after 10 s."""
        for proc, _ in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._procs.clear()
