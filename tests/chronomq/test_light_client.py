"""A light client (issue 54): the base install is the client, the rest are extras.

The quick tests hold ``chronomq.extras`` to ``pyproject.toml`` and check that the CLI
imports none of the extras' packages until a command needs them.

The slow ones install this repository, with no extra, into a fresh virtual environment
(``python -m venv``, no system site packages; pip builds the wheel from a copy of the
sources and takes grpcio and protobuf from its cache or the index), print its size, and
check that none of the extras' packages can be imported there, that ``chronomq serve``
and ``chronomq replay`` answer with the one line naming the extra to install (exit 2),
and that, against two brokers run from the project's own environment (one local tier,
``tier.failover``), the light install's CLI creates, sends and pops, and a script using
``RoutedClient`` sends, pops and acks, consumes a Subscribe stream (``Consumer``), and
follows its topic to the survivor when the owner is killed with kill -9.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest

from chronomq import extras
from chronomq.client import ChronomqClient
from testkit.process import ServerProcess
from testkit.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
# what an application that only sends and pops must not get (the extras' packages)
HEAVY = ("pyspark", "pyarrow", "pandas", "numpy", "rocksdict", "boto3", "botocore",
         "rocketmq", "apscheduler", "sortedcontainers", "prometheus_client")
LEASE_S = 2


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503), without extras or version."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def test_the_extras_table_is_pyproject_s() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {k: v for k, v in project["optional-dependencies"].items()
                if k in extras.EXTRAS}
    assert set(declared) == set(extras.EXTRAS)
    for extra, requirements in declared.items():
        own = [r for r in requirements if _name(r) == "chronomq"]
        includes = {x.strip() for r in own for x in r[r.index("[") + 1:r.index("]")].split(",")}
        assert includes == set(extras.EXTRAS[extra].includes), extra
        assert {_name(r) for r in requirements if r not in own} == \
            {_name(d) for d in extras.EXTRAS[extra].distributions}, extra
    assert {_name(r) for r in project["dependencies"]} == {"grpcio", "protobuf"}
    assert "chronomq[all]" in project["optional-dependencies"]["dev"]


def test_this_environment_has_every_extra() -> None:
    assert extras.missing("all") == ()  # the dev install: every part can be tested


CLI_PROBE = """
import json, sys
import chronomq.cli
chronomq.cli._parser()
print(json.dumps(sorted(sys.modules)))
"""


def test_the_cli_imports_no_extra_until_a_command_needs_it() -> None:
    # Given a fresh interpreter, When it imports the CLI and builds its parser (every
    # command group's module included)
    out = subprocess.run([sys.executable, "-c", CLI_PROBE], check=True, capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    loaded = json.loads(out.stdout)
    # Then none of the extras' packages is loaded: a base install runs the client commands
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == []


# ------------------------------------------------------------------ the fresh environment


@dataclass(frozen=True)
class LightInstall:
    python: Path
    chronomq: Path  # the console script
    site_packages: Path
    cwd: Path  # outside the repository: its sources are not on sys.path

    def env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    def run(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.chronomq), *args], capture_output=True, text=True,
                              timeout=timeout_s, cwd=self.cwd, env=self.env())


def _sources(dst: Path) -> None:
    """What pip needs to build the wheel: pyproject.toml, README.md and the packages
    pyproject.toml's ``packages.find`` includes (a copy: no build/ in the work tree)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    for d in ROOT.iterdir():
        if d.is_dir() and any(fnmatch(d.name, pattern) for pattern in include):
            shutil.copytree(d, dst / d.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _du_kib(path: Path) -> int:
    out = subprocess.run(["du", "-sk", str(path)], check=True, capture_output=True,
                         text=True, timeout=60)
    return int(out.stdout.split()[0])


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> LightInstall:
    """This repository installed with no extra into a fresh venv (without pip itself:
    the project's pip installs into it, so site-packages holds the base install only)."""
    tmp = tmp_path_factory.mktemp("light")
    _sources(tmp / "src")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-input", str(tmp / "src")], check=True, timeout=300)
    site = Path(subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    (tmp / "cwd").mkdir()
    return LightInstall(python, venv / "bin" / "chronomq", site, tmp / "cwd")


SPECS_PROBE = """
import importlib.util, json, sys
import chronomq, chronomq.client
print(json.dumps({"chronomq": chronomq.__file__,
                  "found": [m for m in sys.argv[1:] if importlib.util.find_spec(m)]}))
"""


@pytest.mark.slow
def test_the_base_install_is_the_client_only(light: LightInstall,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    kib = _du_kib(light.site_packages)
    with capsys.disabled():
        print(f"\nlight client: the base install is {kib / 1024:.1f} MiB "
              f"(du -sk {light.site_packages})")
    probe = subprocess.run([str(light.python), "-I", "-c", SPECS_PROBE, *HEAVY],
                           check=True, capture_output=True, text=True, timeout=60,
                           cwd=light.cwd, env=light.env())
    specs = json.loads(probe.stdout)
    assert specs["chronomq"].startswith(str(light.site_packages))  # the wheel, not the tree
    assert specs["found"] == []  # no package of an extra is importable
    assert kib < 100 * 1024  # grpcio and protobuf: tens of MB, not the data platform

    serve = light.run("serve")
    assert (serve.returncode, serve.stdout, serve.stderr) == (
        2, "", "error: the broker needs the server extra: pip install 'chronomq[server]'\n")
    replay = light.run("replay", "--topic", "orders")
    assert (replay.returncode, replay.stdout, replay.stderr) == (
        2, "", "error: chronomq replay needs the spark extra: "
               "pip install 'chronomq[spark]'\n")
    export = light.run("export", "--topic", "orders", "--output", str(light.cwd / "out"))
    assert export.returncode == 2
    assert export.stderr.endswith("needs the spark extra: pip install 'chronomq[spark]'\n")


CLIENT_SCRIPT = """
import json, sys
import chronomq
from chronomq.client import message
from chronomq.client.routing import BrokerDirectory, RoutedClient

a, b = sys.argv[1:3]
assert chronomq.__file__.startswith(sys.prefix), chronomq.__file__  # the light install
with RoutedClient(BrokerDirectory([a, b], timeout_s=5), follow_s=60) as rc:
    sent = rc.send([message("orders", b"m%d" % i, key="k%d" % i) for i in range(6)])
    assert all(o.ok for o in sent), sent
    first = []
    while len(first) < 3:  # three of the six popped and acked (a pop may give fewer)
        batch = rc.pop("orders", "poppers", 3 - len(first), 30, 1000)
        assert rc.ack("orders", "poppers", [m.receipt_handle for m in batch]) == \
            [""] * len(batch)
        first += batch
    consumer = rc.consumer("orders", "subscribers")
    streamed = []
    while len(streamed) < 6:
        m = consumer.receive(timeout_s=30)
        assert m is not None, streamed
        consumer.ack(m).result(30)  # answered: durable in the tier (tier.durable_ack)
        streamed.append(m.body.decode())
    print(json.dumps({"owner": rc.directory.locate("orders"),
                      "popped": [m.body.decode() for m in first],
                      "streamed": sorted(streamed)}), flush=True)

    sys.stdin.readline()  # meanwhile the owner is killed (kill -9)
    after = rc.send([message("orders", b"after", key="k-after")])
    assert after[0].ok, after
    owner = rc.directory.locate("orders")
    rest = []
    while batch := rc.pop("orders", "poppers", 32, 30, 1000):
        assert rc.ack("orders", "poppers", [m.receipt_handle for m in batch]) == \\
            [""] * len(batch)
        rest += [m.body.decode() for m in batch]
    m = consumer.receive(timeout_s=60)  # the stream broke: it follows to the new owner
    assert m is not None
    consumer.ack(m).result(30)
    consumer.close()
    print(json.dumps({"owner": owner, "popped": sorted(rest),
                      "streamed": [m.body.decode()]}), flush=True)
"""


def _broker(tmp: Path, name: str) -> ServerProcess:
    return ServerProcess(tmp / name, "tier.provider=local", f"tier.local_dir={tmp / 'tier'}",
                         f"tier.broker_name={name}", "tier.upload=true",
                         "tier.upload_batch_ms=50", "tier.claim_topics=true",
                         "tier.durable_ack=true", "tier.failover=true",
                         f"tier.lease_s={LEASE_S}")


@pytest.fixture
def brokers(tmp_path: Path, no_process_left: None) -> Iterator[tuple[ServerProcess, ...]]:
    """Two brokers from the project's environment on one local tier, with failover."""
    a = _broker(tmp_path, "broker-a")
    b = _broker(tmp_path, "broker-b")
    yield a, b
    for p in (a, b):
        if p.proc.poll() is None:
            p.kill9()


@pytest.mark.slow
def test_a_light_client_sends_pops_subscribes_and_follows_a_failover(
        light: LightInstall, brokers: tuple[ServerProcess, ...]) -> None:
    a, b = brokers
    # Given the light install's CLI: topics created, a message sent and popped (acked)
    for topic in ("orders", "cli"):
        made = light.run("topic", "create", topic, "--queues", "2", "--target", a.target)
        assert made.returncode == 0, made.stderr
    listed = light.run("topic", "list", "--json", "--target", a.target)
    assert listed.returncode == 0, listed.stderr
    assert {t["name"] for t in json.loads(listed.stdout)} == {"orders", "cli"}
    sent = light.run("send", "cli", "from the light CLI", "--key", "k1", "--target", a.target)
    assert sent.returncode == 0, sent.stderr
    popped = light.run("pop", "cli", "g", "--wait-ms", "5000", "--json", "--target", a.target)
    assert popped.returncode == 0, popped.stderr
    assert [m["body"] for m in json.loads(popped.stdout)] == ["from the light CLI"]

    # When a script of the light install sends, pops, acks and consumes a stream at the
    # owner (broker-a, found by ListTopics), then the owner is killed
    script = subprocess.Popen(
        [str(light.python), "-I", "-c", CLIENT_SCRIPT, a.target, b.target],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=light.cwd, env=light.env())
    assert script.stdin is not None and script.stdout is not None
    try:
        line = script.stdout.readline()
        assert line, script.communicate(timeout=30)[1]
        before = json.loads(line)
        assert before["owner"] == a.target
        assert len(before["popped"]) == 3
        assert before["streamed"] == [f"m{i}" for i in range(6)]
        a.kill9()
        killed = time.monotonic()
        with ChronomqClient(b.target) as cb:
            wait_until(lambda: any(t.name == "orders" and t.taken_over_from == "broker-a"
                                   for t in cb.list_topics()), 30,
                       "broker-b taking broker-a's topics over")
        took_s = time.monotonic() - killed
        out, err = script.communicate("go\n", timeout=90)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    # Then the same client found the topic at the survivor: the send went there, the
    # group popped what it had not acked, and the stream followed
    assert script.returncode == 0, err
    after = json.loads(out)
    not_acked = {f"m{i}" for i in range(6)} - set(before["popped"])
    assert after == {"owner": b.target, "popped": sorted({"after", *not_acked}),
                     "streamed": ["after"]}, (after, took_s)
