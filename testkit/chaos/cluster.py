"""The brokers of the failover chaos (``bench/bench_failover.py``): broker processes with
``tier.failover`` and ``tier.durable_ack`` on one bucket, each reaching S3 through a
``FaultProxy`` of its own (so one broker can be cut off from S3 or slowed down alone),
and what the bench reads of the bucket directly (not through a proxy): the leases
(``brokers/<name>.json``: ``taken_by``, ``claimed_ms``) and the topics' owners.

A broker keeps its name, data directory, port and proxy across restarts.  Restarted
after its takeover (or with its data directory deleted) it rejoins as a new incarnation,
under the prefix ``<name>--<n>`` in the bucket (``cluster.rejoin``), and the harness
goes on using it: its lives are ``Broker.lives``, and what the bucket names (owners,
``taken_by``) is a prefix (``by_prefix``).  A broker that stays fenced is retired and a
new name joins (``spawn``).  One can run with its wall clock ahead (``start``:
libfaketime preloaded, ``ServerProcess(clock_ahead_s=...)``).  Every process's output
is kept (``logs``) for the evidence of a violation.

Not thread-safe: the bench's main thread drives it; the workload's threads only read
``addresses``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from chronomq.client import ChronomqClient, RpcError
from cluster.layout import broker_prefix
from cluster.lease import successor
from cluster.ownership import owner_of
from cluster.rejoin import read_incarnation
from testkit.ledger import TopicSeen, now_ms
from testkit.process import ServerProcess
from testkit.proxy import FaultProxy
from testkit.seaweed import free_ports
from tiered.providers.s3 import S3Provider, S3Settings

KEYS = ("tier.s3_access_key_id=testing", "tier.s3_secret_access_key=testing")
START_TIMEOUT_S = 240  # a rejoining broker waits for its old life's takeover (under load:
#                        up to a minute or more) before it listens


def broker_settings(endpoint: str, bucket: str, name: str, lease_s: float) -> list[str]:
    """``chronomq serve --set`` settings of one broker of the chaos."""
    return ["tier.provider=s3", f"tier.s3_bucket={bucket}", f"tier.s3_endpoint_url={endpoint}",
            *KEYS, f"tier.broker_name={name}", "tier.upload=true", "tier.claim_topics=true",
            "tier.durable_ack=true", "tier.failover=true", f"tier.lease_s={lease_s:g}"]


@dataclass
class Broker:
    """One broker name: its process (None while down), data directory, port, proxy."""

    name: str
    data_dir: Path
    port: int
    proxy: FaultProxy
    process: ServerProcess | None = None
    retired: bool = False  # taken over or reborn empty: this name never serves again
    logs: list[list[str]] = field(default_factory=list)  # each start's output (evidence)
    incarnation: int = 0  # the life its last start runs as (cluster.rejoin)
    lives: list[str] = field(default_factory=list)  # every prefix it ran as, in order

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def prefix(self) -> str:
        """Its name in the bucket now: its lease, owner records (``broker_prefix``)."""
        return broker_prefix(self.name, self.incarnation)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None


class Cluster:
    """Brokers on the bucket ``bucket`` of the S3 server at ``endpoint``, serving
    ``topics``."""

    def __init__(self, root: Path, endpoint: str, bucket: str, lease_s: float,
                 topics: list[str], log_level: str = "WARNING") -> None:
        self.root, self.endpoint, self.bucket, self.lease_s = root, endpoint, bucket, lease_s
        self.log_level = log_level
        self.topics = topics
        self.brokers: dict[str, Broker] = {}
        self.tier = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint,
                                          access_key_id="testing", secret_access_key="testing",
                                          connect_timeout_s=5, read_timeout_s=10))
        self._names = 0
        self._lock = threading.Lock()  # ``addresses`` is read by the probers

    # ------------------------------------------------------------------ processes

    def spawn(self) -> Broker:
        """A new broker name with a new data directory, port and proxy, started."""
        self._names += 1
        name = f"broker-{self._names}"
        (port,) = free_ports(1)
        b = Broker(name, self.root / name, port, FaultProxy(self.endpoint))
        with self._lock:
            self.brokers[name] = b
        self.start(b)
        return b

    def start(self, b: Broker, clock_ahead_s: int = 0) -> ServerProcess:
        """Start ``b``'s process on its data directory and port, its wall clock
        ``clock_ahead_s`` ahead (``RuntimeError`` with its output when it refuses or fails
        to start).  Its life is known before it counts as up (``addresses``)."""
        settings = [*broker_settings(b.proxy.endpoint, self.bucket, b.name, self.lease_s),
                    f"server.port={b.port}"]
        try:
            p = ServerProcess(b.data_dir, *settings, log_level=self.log_level,
                              clock_ahead_s=clock_ahead_s, start_timeout_s=START_TIMEOUT_S)
        except RuntimeError as exc:
            b.logs.append([str(exc)])
            raise
        with self._lock:
            b.incarnation = read_incarnation(str(b.data_dir)) or 0
            if b.prefix not in b.lives:
                b.lives.append(b.prefix)
            b.process = p
        b.logs.append(p.output)  # the process's drainer goes on appending to it
        return p

    def kill9(self, b: Broker) -> None:
        if b.process is not None and b.process.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(b.process.proc.pid, signal.SIGCONT)
            b.process.kill9()
        with self._lock:
            b.process = None

    def signal(self, b: Broker, sig: signal.Signals) -> None:
        assert b.process is not None
        os.kill(b.process.proc.pid, sig)

    def retire(self, b: Broker) -> None:
        """``b``'s name serves no more: its process (if any) killed, its proxy closed."""
        self.kill9(b)
        b.retired = True
        b.proxy.close()

    def live(self) -> list[Broker]:
        return [b for b in self.brokers.values() if not b.retired]

    def by_prefix(self, prefix: str) -> Broker | None:
        """The broker whose current life is ``prefix`` (the bucket's name for it)."""
        return next((b for b in self.live() if b.prefix == prefix), None)

    def addresses(self) -> dict[str, str]:
        """Prefix -> address of every broker up and not retired (the probers' targets:
        one per life, so an OK is judged against that life's lease)."""
        with self._lock:
            return {b.prefix: b.address for b in self.brokers.values()
                    if not b.retired and b.process is not None}

    def stop(self) -> None:
        for b in self.brokers.values():
            self.kill9(b)
            b.proxy.close()

    def write_logs(self, directory: Path) -> None:
        """Every broker process's output, ``<name>.<run>.log``."""
        directory.mkdir(parents=True, exist_ok=True)
        for b in self.brokers.values():
            for i, lines in enumerate(b.logs):
                (directory / f"{b.name}.{i}.log").write_text("".join(lines))

    # ------------------------------------------------------------------ the bucket

    def lease(self, name: str) -> dict[str, object]:
        """``brokers/<name>.json`` as it is now ({} when missing or unreadable)."""
        with contextlib.suppress(Exception):
            parsed = json.loads(self.tier.read(f"brokers/{name}.json"))
            if isinstance(parsed, dict):
                return parsed
        return {}

    def taken_by(self, name: str) -> str:
        return str(self.lease(name).get("taken_by", ""))

    def owner(self, topic: str) -> str:
        """The broker serving ``topic`` now, by the bucket: its owner record, past the
        chain of ``taken_by`` ("" when unknown)."""
        with contextlib.suppress(Exception):
            o = owner_of(self.tier, topic)
            if o is None:
                return ""
            now = successor(self.tier, o.broker)
            return now.broker if now is not None else o.broker
        return ""

    def serving(self, topic: str) -> list[str]:
        """The lives (prefixes) of the live brokers that list ``topic`` as their own (not
        mounted) and do not say they were taken over: exactly the owner, when all is
        well."""
        out = []
        for b in self.live():
            if not b.alive:
                continue
            with contextlib.suppress(RpcError), ChronomqClient(b.address, timeout_s=5) as c:
                own = [t for t in c.list_topics() if t.name == topic and not t.mounted_from]
                if own and not c.stats().get("lease.taken_over"):
                    out.append(b.prefix)
        return out

    def seen(self, topics: list[str]) -> list[TopicSeen]:
        """Where any of ``topics`` (deleted ones) is still listed by a live broker (mounted
        or its own) or named by an owner record."""
        out = []
        for b in self.live():
            if not b.alive:
                continue
            with contextlib.suppress(RpcError), ChronomqClient(b.address, timeout_s=5) as c:
                listed = {t.name: t.mounted_from for t in c.list_topics()}
                out += [TopicSeen(t, f"listed by {b.prefix}" + (f" (mounted from "
                                  f"{listed[t]})" if listed[t] else ""), now_ms())
                        for t in topics if t in listed]
        for t in topics:
            with contextlib.suppress(Exception):
                o = owner_of(self.tier, t)
                if o is not None:
                    out.append(TopicSeen(t, f"its owner record names {o.broker}", now_ms()))
        return out

