"""Typed, frozen configuration, built in one place from a TOML file plus ``--set`` overrides.

Every duration and size carries its unit in its name.  Example ``chronomq.toml``::

    [server]
    host = "127.0.0.1"
    port = 7600
    metrics_port = 7601          # 0 turns the Prometheus endpoint off
    auth_token = ""              # when set, clients send "authorization: Bearer <token>"
    tls_cert_file = ""           # both set: serve TLS
    tls_key_file = ""

    [store]
    data_dir = "./chronomq-data"
    flush = "sync"               # or "async" (fsync every flush_interval_ms)
    max_body_bytes = 4194304
    max_open_files = 0           # ConsumeQueue files kept open (least recently used closed
    #                              first); 0: what RLIMIT_NOFILE leaves, at most 4096

    [pop]
    max_messages_cap = 32
    max_attempts = 16            # deliveries before a message goes to the dead-letter topic
    retry_backoff = "1s,5s,10s,30s,1m,2m,5m,10m,30m,1h,2h"  # Nack without a delay
    retry_jitter = 0.1           # a back-off is stretched by up to 10 %, never shortened

    [groups.orders-worker]       # per consumer group: any of the three above, and
    max_attempts = 5             # per-key flow control (0: off):
    retry_backoff = "10s,1m"
    max_in_flight_per_key = 1    # leases held at once for one message key
    rate_per_key = 50            # messages a second for one key (rate_burst_per_key:
    #                              the tokens a key saves up; default 1, smooth)
    max_held = 100000            # messages held for their keys at once, per topic
    #                              (then a Pop stops reading ahead)

    [timer]
    enabled = true
    wheel_window_ms = 60000      # the in-memory wheel holds the next minute
    max_delay_ms = 316224000000  # ten years

    [tier]
    provider = "local"           # or "s3" (s3_bucket, s3_endpoint_url, ...)

    [rocketmq]                   # RocketMQ 5 clients (gRPC) on a port of their own
    enabled = false
    port = 8081

    [console]                    # the web console (chronomq.console)
    port = 7602                  # 0 turns it off
    actions = false              # true: cancel, reschedule and redrive from the console
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pop.flowcontrol import MAX_HELD, KeyLimits
from pop.policy import RetryPolicy, parse_backoff
from recurring.book import ScheduleConfig
from store.errors import InvalidArgument
from store.names import INCARNATION_SEP, check_name, is_name
from store.store import StoreConfig
from tiered.config import TierConfig
from timer.model import TimerConfig

KEY_LIMITS = frozenset({"max_in_flight_per_key", "rate_per_key", "rate_burst_per_key",
                        "max_held"})

@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7600
    metrics_port: int = 7601
    advertise_address: str = ""  # host:port recorded for other brokers' clients
    #                              (tier.claim_topics); default: host:port
    auth_token: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    worker_threads: int = 64  # short calls served at once; waiting calls have their own:
    max_streams: int = 1000  # Subscribe/SendStream streams open at once (chronomq.api.budget)
    max_long_polls: int = 1000  # Pops waiting for messages at once
    max_waiting_per_connection: int = 200  # streams + long polls one connection may hold
    max_concurrent_rpcs: int = 4000  # beyond this, calls are refused with RESOURCE_EXHAUSTED
    shutdown_grace_s: float = 5.0
    retention_interval_s: int = 60
    crash_at: str = ""  # tests only: "label:N" exits at the Nth hit of a crash point
    #                     (store/crashpoint.py lists the labels)


@dataclass(frozen=True, slots=True)
class PopConfig:
    max_messages_cap: int = 32
    max_wait_ms: int = 30_000
    secret_file: str = ""  # default: <data_dir>/pop-secret (created on first start)
    max_attempts: int = 16
    retry_backoff: str = "1s,5s,10s,30s,1m,2m,5m,10m,30m,1h,2h"
    retry_jitter: float = 0.1


@dataclass(frozen=True, slots=True)
class RocketMQConfig:
    """The RocketMQ 5 gRPC front (``apache.rocketmq.v2.MessagingService``)."""

    enabled: bool = False
    host: str = ""  # default: server.host
    port: int = 8081
    advertise_address: str = ""  # host:port QueryRoute hands out; default: the address
    #                              the client connected to
    worker_threads: int = 64  # short calls served at once; waiting calls have their own:
    max_streams: int = 1000  # Telemetry streams (one per connected client)
    max_long_polls: int = 1000  # ReceiveMessage calls waiting for messages
    max_waiting_per_connection: int = 200
    max_concurrent_rpcs: int = 4000
    access_key: str = ""  # the front's admin: clients signing with it and secret_key may
    secret_key: str = ""  # do everything; set, or users or server.auth_token: signed only


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """The web console (``chronomq.console``), served on ``server.host``."""

    port: int = 7602  # 0: off
    actions: bool = False  # cancel, reschedule and redrive from the console
    session_ttl_s: int = 43_200  # an idle login lasts this long
    refresh_s: float = 5.0  # pages update their live parts and charts this often


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    store: StoreConfig = field(default_factory=lambda: StoreConfig(data_dir="./chronomq-data"))
    pop: PopConfig = field(default_factory=PopConfig)
    timer: TimerConfig = field(default_factory=TimerConfig)
    tier: TierConfig = field(default_factory=TierConfig)
    rocketmq: RocketMQConfig = field(default_factory=RocketMQConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    schedules: ScheduleConfig = field(default_factory=ScheduleConfig)
    groups: dict[str, RetryPolicy] = field(default_factory=dict)  # per-group retry policy
    key_limits: dict[str, KeyLimits] = field(default_factory=dict)  # per-group, per-key

    def tier_local_dir(self) -> str:
        """The local-directory tier: ``tier.local_dir``, else ``chronomq-tier`` beside the
        data directory."""
        data = os.path.abspath(self.store.data_dir)
        return self.tier.local_dir or os.path.join(os.path.dirname(data), "chronomq-tier")

    def retry_policy(self) -> RetryPolicy:
        """The broker-wide default retry policy of ``[pop]``."""
        return RetryPolicy(self.pop.max_attempts, parse_backoff(self.pop.retry_backoff),
                           self.pop.retry_jitter)

    def validate(self) -> None:
        self.retry_policy()  # raises for a bad [pop] retry setting
        if self.store.flush not in ("sync", "async"):
            raise InvalidArgument("store.flush must be 'sync' or 'async'")
        t = self.timer
        if t.rocks_horizon_ms < t.preload_ahead_ms + t.bucket_ms:
            raise InvalidArgument("timer.rocks_horizon_ms must be at least "
                                  "timer.preload_ahead_ms + timer.bucket_ms")
        if self.tier.read not in ("disable", "not_in_disk", "not_in_mem", "force"):
            raise InvalidArgument("tier.read must be one of disable, not_in_disk, "
                                  "not_in_mem, force")
        if self.tier.retention_ms < 0:
            raise InvalidArgument("tier.retention_ms must not be negative (0: forever)")
        if 0 < self.tier.retention_ms < self.store.retention_ms:
            raise InvalidArgument(
                f"tier.retention_ms ({self.tier.retention_ms}) is shorter than local "
                f"retention store.retention_ms ({self.store.retention_ms}): the tier "
                "keeps data at least as long as local disk")
        if self.tier.provider not in ("local", "s3", "memory"):
            raise InvalidArgument("tier.provider must be 'local', 's3' or 'memory'")
        if self.tier.provider == "s3" and not self.tier.s3_bucket:
            raise InvalidArgument("tier.provider = 's3' needs tier.s3_bucket")
        for name in filter(None, (n.strip() for n in self.tier.mounts.split(","))):
            if not is_name(name):
                raise InvalidArgument(f"tier.mounts: {name!r} is not a broker name")
        if self.tier.durable_ack and not self.tier.upload:
            raise InvalidArgument("tier.durable_ack needs tier.upload: an OK can wait for "
                                  "the tier only when this broker uploads to it")
        if self.tier.durable_ack_ms < 1:
            raise InvalidArgument("tier.durable_ack_ms must be at least 1")
        if self.tier.takeover and not is_name(self.tier.takeover):
            raise InvalidArgument(f"tier.takeover: {self.tier.takeover!r} is not a broker name")
        if self.tier.takeover and not self.tier.upload:
            raise InvalidArgument("tier.takeover needs tier.upload: what this broker takes "
                                  "over must outlive it too")
        if self.tier.failover and not (self.tier.upload and self.tier.claim_topics):
            raise InvalidArgument("tier.failover needs tier.upload and tier.claim_topics: "
                                  "a broker taking over reads the tier, clients follow the "
                                  "owner records")
        if self.tier.journal_snapshot_s < 0:
            raise InvalidArgument("tier.journal_snapshot_s must be 0 (by records only) or more")
        if self.tier.journal_snapshot_records < 0:
            raise InvalidArgument("tier.journal_snapshot_records must be 0 (only at start) "
                                  "or more")
        if self.tier.lease_s < 1:
            raise InvalidArgument("tier.lease_s must be at least 1 (second)")
        if self.tier.start_timeout_s < 0 or self.tier.rejoin_timeout_s < 0:
            raise InvalidArgument("tier.start_timeout_s and tier.rejoin_timeout_s must not "
                                  "be negative (seconds)")
        if not is_name(self.tier.broker_name) or len(self.tier.broker_name) > 100 or \
                re.search(f"{INCARNATION_SEP}[0-9]+$", self.tier.broker_name):
            raise InvalidArgument(
                f"tier.broker_name {self.tier.broker_name[:140]!r} is invalid: use 1-100 "
                "characters from A-Z a-z 0-9 _ -, not ending in --<number> (the tier "
                "prefix of a later incarnation: cluster/layout.py)")
        if self.tier.claim_topics and self.store.auto_create_topics:
            raise InvalidArgument("tier.claim_topics cannot be combined with "
                                  "store.auto_create_topics: a topic is claimed in the "
                                  "shared tier before it is created, so create topics "
                                  "explicitly")
        if min(self.tier.s3_connect_timeout_s, self.tier.s3_read_timeout_s,
               self.tier.s3_max_attempts, self.tier.upload_timeout_s) <= 0:
            raise InvalidArgument("tier.s3_connect_timeout_s, tier.s3_read_timeout_s, "
                                  "tier.s3_max_attempts and tier.upload_timeout_s must be "
                                  "positive")
        r = self.rocketmq
        if bool(r.access_key) != bool(r.secret_key):
            raise InvalidArgument("set both rocketmq.access_key and rocketmq.secret_key")
        if r.advertise_address and not _is_host_port(r.advertise_address):
            raise InvalidArgument(
                f"rocketmq.advertise_address must be host:port, got {r.advertise_address!r}")
        for name, port in (("server.port", self.server.port),
                           ("server.metrics_port", self.server.metrics_port),
                           ("rocketmq.port", self.rocketmq.port),
                           ("console.port", self.console.port)):
            if not 0 <= port <= 65535:
                raise InvalidArgument(f"{name} must be a port number (0 to 65535)")
        self._check_distinct_ports()
        if self.server.advertise_address and not _is_host_port(self.server.advertise_address):
            raise InvalidArgument("server.advertise_address must be host:port, got "
                                  f"{self.server.advertise_address!r}")
        if not 0.1 <= self.console.refresh_s <= 3600:
            raise InvalidArgument("console.refresh_s must be from 0.1 to 3600")
        if self.console.session_ttl_s <= 0:
            raise InvalidArgument("console.session_ttl_s must be positive")
        if bool(self.server.tls_cert_file) != bool(self.server.tls_key_file):
            raise InvalidArgument("set both server.tls_cert_file and server.tls_key_file")
        for name, value in (("store.max_body_bytes", self.store.max_body_bytes),
                            ("store.segment_bytes", self.store.segment_bytes),
                            ("store.flush_interval_ms", self.store.flush_interval_ms),
                            ("store.queue_flush_interval_ms",
                             self.store.queue_flush_interval_ms),
                            ("pop.max_messages_cap", self.pop.max_messages_cap),
                            ("timer.wheel_window_ms", self.timer.wheel_window_ms),
                            ("timer.max_delay_ms", self.timer.max_delay_ms),
                            ("timer.delivery_batch", self.timer.delivery_batch),
                            ("timer.load_interval_ms", self.timer.load_interval_ms),
                            ("timer.bucket_ms", self.timer.bucket_ms),
                            ("timer.preload_interval_ms", self.timer.preload_interval_ms)):
            if value <= 0:
                raise InvalidArgument(f"{name} must be positive")

    def _check_distinct_ports(self) -> None:
        """Two listeners set to one port on one host would find it taken by the other."""
        r = self.rocketmq
        on = [("server.port", self.server.host, self.server.port),
              ("console.port", self.server.host, self.console.port),
              ("server.metrics_port", self.server.host, self.server.metrics_port),
              ("rocketmq.port", r.host or self.server.host, r.port if r.enabled else 0)]
        for i, (name, host, port) in enumerate(on):
            for other, other_host, other_port in on[i + 1:]:
                if port and port == other_port and (host == other_host or
                                                    {host, other_host} & {"0.0.0.0", "::", ""}):
                    raise InvalidArgument(f"{name} and {other} are both {port}: give each "
                                          "listener a port of its own")


def _is_host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def _coerce(kind: Any, value: Any, where: str) -> Any:
    if isinstance(kind, types.UnionType):
        kind = next(a for a in kind.__args__ if a is not type(None))
    if kind is bool and isinstance(value, str):
        if value.lower() in ("true", "1", "yes", "on"):
            return True
        if value.lower() in ("false", "0", "no", "off"):
            return False
        raise InvalidArgument(f"{where}: expected true/false, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: expected {kind.__name__}, got {value!r}") from exc


def _section(cls: type, values: dict[str, Any], name: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise InvalidArgument(f"unknown setting(s) in [{name}]: {', '.join(sorted(unknown))}")
    return cls(**{k: _coerce(hints[k], v, f"{name}.{k}") for k, v in values.items()})


def load_config(path: str | None = None, overrides: list[str] | None = None) -> BrokerConfig:
    """Read ``path`` (TOML; optional) and apply ``section.key=value`` overrides."""
    raw: dict[str, dict[str, Any]] = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise InvalidArgument(f"config file {path} not found (a commented example: "
                                  "chronomq.example.toml)") from None
        except OSError as exc:
            raise InvalidArgument(f"config file {path} cannot be read: "
                                  f"{exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    for item in overrides or []:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise InvalidArgument(f"--set expects section.key=value, got {item!r}")
        raw.setdefault(section, {})[name] = value.strip()
    sections = {f.name: f.type for f in dataclasses.fields(BrokerConfig)}
    for item in overrides or []:  # groups.<name>.<key>=value: one level deeper
        key, _, value = item.partition("=")
        if key.strip().startswith("groups."):
            _, group, name = key.strip().split(".", 2) if key.count(".") >= 2 else ("", "", "")
            if not group or not name:
                raise InvalidArgument(f"--set expects groups.<group>.<key>=value, got {item!r}")
            raw["groups"].pop(f"{group}.{name}", None)
            raw.setdefault("groups", {}).setdefault(group, {})[name] = value.strip()
    unknown = set(raw) - set(sections)
    if unknown:
        raise InvalidArgument(f"unknown config section(s): {', '.join(sorted(unknown))}")
    store_raw = {"data_dir": "./chronomq-data", **raw.get("store", {})}
    store_raw["data_dir"] = os.path.expanduser(str(store_raw["data_dir"]))
    config = BrokerConfig(
        server=_section(ServerConfig, raw.get("server", {}), "server"),
        store=_section(StoreConfig, store_raw, "store"),
        pop=_section(PopConfig, raw.get("pop", {}), "pop"),
        timer=_section(TimerConfig, raw.get("timer", {}), "timer"),
        tier=_section(TierConfig, raw.get("tier", {}), "tier"),
        rocketmq=_section(RocketMQConfig, raw.get("rocketmq", {}), "rocketmq"),
        console=_section(ConsoleConfig, raw.get("console", {}), "console"),
        schedules=_section(ScheduleConfig, raw.get("schedules", {}), "schedules"),
    )
    pop = config.pop
    groups = {}
    key_limits = {}
    for group, values in raw.get("groups", {}).items():
        if not isinstance(values, dict):
            raise InvalidArgument(f"[groups.{group}] must be a table of settings")
        check_name(group, "group")
        unknown = set(values) - {"max_attempts", "retry_backoff", "retry_jitter",
                                 *KEY_LIMITS}
        if unknown:
            raise InvalidArgument(f"unknown setting(s) in [groups.{group}]: "
                                  f"{', '.join(sorted(unknown))}")
        where = f"groups.{group}"
        groups[group] = RetryPolicy(
            _coerce(int, values.get("max_attempts", pop.max_attempts), where + ".max_attempts"),
            parse_backoff(str(values.get("retry_backoff", pop.retry_backoff))),
            _coerce(float, values.get("retry_jitter", pop.retry_jitter),
                    where + ".retry_jitter"))
        if KEY_LIMITS & set(values):
            key_limits[group] = KeyLimits(
                _coerce(int, values.get("max_in_flight_per_key", 0),
                        where + ".max_in_flight_per_key"),
                _coerce(float, values.get("rate_per_key", 0), where + ".rate_per_key"),
                _coerce(int, values.get("rate_burst_per_key", 0),
                        where + ".rate_burst_per_key"),
                _coerce(int, values.get("max_held", MAX_HELD),
                        where + ".max_held"))
    config = dataclasses.replace(config, groups=groups, key_limits=key_limits)
    config.validate()
    return config
