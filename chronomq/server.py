"""The server process: wires the broker, the gRPC services, metrics and scheduled jobs.

``serve(config)`` runs until SIGINT/SIGTERM, then stops taking RPCs, lets running ones
finish (``server.shutdown_grace_s``), and flushes everything to disk.  SIGUSR1 prints
every thread's stack on stderr (``faulthandler``).

Every listener's address is checked before the data directory is opened
(``chronomq.listeners``): a taken port is refused at once, holding nothing.  A start that
fails later (a port taken since the check) stops what it started, so the store is closed
and no thread is left.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import grpc
from apscheduler.schedulers.background import BackgroundScheduler
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from access.directory import REFRESH_S
from chronomq import collector, memtrace
from chronomq.api.budget import CallBudget
from chronomq.api.guard import BrokerLookup, Guard
from chronomq.api.handlers import add_service
from chronomq.api.notify import ArrivalNotifier
from chronomq.api.servicer import BrokerServicer
from chronomq.api.users import UserServicer
from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from chronomq.listeners import (
    Listener,
    api_listener,
    binding,
    check_free,
    metrics_listener,
    rocketmq_listener,
    unreachable,
)
from chronomq.metrics import start_metrics
from chronomq.v1 import broker_pb2
from cluster.layout import OWNERS as OWNERS_PREFIX
from cluster.ownership import owner_of
from pop.service import origin_of
from store import crashpoint
from store.clock import Clock, SystemClock
from store.message import DispatchInfo
from store.names import is_name
from tiered.errors import TierError
from tiered.provider import Provider

log = logging.getLogger(__name__)

_OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MAX_MESSAGE_BYTES = 64 << 20


def _grpc_server(workers: int, thread_prefix: str, max_rpcs: int) -> grpc.Server:
    return grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_prefix),
        maximum_concurrent_rpcs=max_rpcs,
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.so_reuseport", 0),
                 # clients ping open calls to notice a paused or lost broker
                 # (``ChronomqClient`` keepalive_s): allowed every second, with no data
                 # (gRPC core's GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS)
                 ("grpc.http2.min_ping_interval_without_data_ms", 1000)])


class BrokerServer:
    """One broker and its gRPC server.  ``start`` returns the bound port."""

    def __init__(self, config: BrokerConfig, clock: Clock | None = None,
                 background: bool = True) -> None:
        """``background=False`` leaves the timer and revive threads off: tests with a manual
        clock drive them by hand."""
        self.config = config
        self.background = background
        self.clock = clock or SystemClock()
        crashpoint.arm_from_setting(config.server.crash_at)
        check_free(config)  # before the data directory is opened: a refusal holds nothing
        self.broker = Broker(config, self.clock)
        self._opened = False
        self.notifier = ArrivalNotifier()
        self.port = 0
        self.servicer: BrokerServicer | None = None
        self.guard: Guard | None = None
        self._server: grpc.Server | None = None
        self.rocketmq_port = 0
        self.rocketmq: Any = None  # the RocketMQServicer when [rocketmq] is enabled
        self._rocketmq_server: grpc.Server | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._metrics_stop: Callable[[], None] | None = None
        self.console_port = 0
        self._console_stop: Callable[[], None] | None = None

    def start(self) -> int:
        """Open the store (recovery), start its threads and the gRPC server.  On failure
        everything started is stopped again and the store closed."""
        try:
            return self._start()
        except BaseException:
            if self._opened:
                self.stop()
            raise

    def _start(self) -> int:
        cfg = self.config.server
        self.broker.open()
        self._opened = True
        self.broker.add_dispatch_listener(self._on_dispatched)
        self.broker.pop.flow.add_listener(self.notifier.arrived)  # held keys with room
        self.broker.start(timer_thread=self.background)
        self.servicer = BrokerServicer(
            self.broker, self.notifier, self.config.pop.max_wait_ms,
            CallBudget(cfg.max_streams, cfg.max_long_polls, cfg.max_waiting_per_connection))
        server = _grpc_server(cfg.worker_threads + cfg.max_streams + cfg.max_long_polls,
                              "rpc", cfg.max_concurrent_rpcs)
        # every call's principal and rights (chronomq.api.guard), the user RPCs beside
        self.guard = Guard(self.broker.access, BrokerLookup(self.broker))
        self.servicer.more_figures.append(self.guard.figures)
        add_service(server, self.servicer, broker_pb2.DESCRIPTOR.services_by_name["Broker"],
                    gate=self.guard, also=[UserServicer(self.broker.access)])
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = (broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,
                 health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        self.port = self._bind(server, api_listener(self.config))
        server.start()
        self._server = server
        for name in ("", names[0]):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._unhealthy_once_taken_over(health_servicer, ("", names[0]))
        if self.config.rocketmq.enabled:
            self._start_rocketmq()
        if self.config.tier.claim_topics:  # after binding: the owner records the addresses
            self._claim_topics()
        if self.config.tier.failover:
            self._start_failover()
        elif self.broker.lease is not None:  # tier.upload: the addresses in the lease
            self.broker.advertise(*self._addresses())
        if self.config.tier.takeover or any(not r.done for r in
                                            self.broker.takeovers.results.values()):
            # serving meanwhile: sends are accepted early on
            threading.Thread(target=self._take_over, name="takeover", daemon=True).start()
        self._scheduler = BackgroundScheduler()
        self._scheduler.add_job(self._retention, "interval", id="retention",
                                seconds=cfg.retention_interval_s, max_instances=1,
                                coalesce=True)
        self._scheduler.add_job(self._preload, "interval", id="timer-preload",
                                seconds=self.config.timer.preload_interval_ms / 1000,
                                max_instances=1, coalesce=True, next_run_time=datetime.now())
        self._scheduler.add_job(self.broker.timer.write_parked, "interval",
                                id="timer-flat-write",
                                seconds=min(self.config.timer.flat_batch_ms, 1000) / 1000 or 0.1,
                                max_instances=1, coalesce=True)
        self._scheduler.add_job(self.broker.watch_disk, "interval", id="disk", seconds=1,
                                max_instances=1, coalesce=True)
        self._scheduler.add_job(self.broker.access.directory.refresh, "interval",
                                id="users-refresh", seconds=REFRESH_S, max_instances=1,
                                coalesce=True)  # another broker's changes, within ~1 s
        if self.broker.snapshots is not None:  # tier.upload: the journal's snapshots
            self._scheduler.add_job(self.broker.snapshots.step, "interval",
                                    id="journal-snapshots", seconds=1, max_instances=1,
                                    coalesce=True)
        if self.broker.compactor is not None:  # tier.upload: the timer's snapshots
            self._scheduler.add_job(self.broker.compactor.step, "interval",
                                    id="timer-snapshots", seconds=1, max_instances=1,
                                    coalesce=True)
        if self.config.tier.failover:  # (the lease renews itself: cluster.lease)
            self._scheduler.add_job(self._watch_leases, "interval", id="lease-watch",
                                    seconds=self.config.tier.lease_s / 10, max_instances=1,
                                    coalesce=True)
        if self.rocketmq is not None and self.background:
            self._scheduler.add_job(self.rocketmq.renew_leases, "interval",
                                    id="rocketmq-renew", seconds=1, max_instances=1,
                                    coalesce=True)
        if self.config.console.port:
            from chronomq.console import SAMPLE_INTERVAL_S, open_console
            assert self.guard is not None
            self.console_port, sampler, self._console_stop = open_console(
                self.config, self.broker, self.servicer, self.guard, self.rocketmq)
            self._scheduler.add_job(sampler.sample, "interval", id="console-rates",
                                    seconds=SAMPLE_INTERVAL_S, max_instances=1, coalesce=True)
            log.info("console on http://%s:%d/ (%s)", cfg.host, self.console_port,
                     "actions on" if self.config.console.actions else "read-only")
        self._scheduler.start()
        if cfg.metrics_port:
            with binding(metrics_listener(self.config)):
                self._metrics_stop = start_metrics(cfg.host, cfg.metrics_port, self.servicer)
        log.info("chronomq serving on %s:%d (data in %s)", cfg.host, self.port,
                 self.config.store.data_dir)
        return self.port

    def _unhealthy_once_taken_over(self, servicer: health.HealthServicer,
                                   names: tuple[str, ...]) -> None:
        """Once this broker is taken over its health check answers NOT_SERVING, so a
        liveness probe (a Kubernetes gRPC probe) restarts it and it rejoins under its
        name as a new incarnation (``cluster.rejoin``); until then it answers "taken
        over by" to the clients that still come to it."""
        def unhealthy(_by: str) -> None:
            for name in names:
                servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.broker.fence.on_taken(unhealthy)  # (at once when fenced before)

    def _addresses(self) -> tuple[str, str]:
        """The addresses clients reach this broker's API and RocketMQ front at."""
        cfg, rmq = self.config.server, self.config.rocketmq
        api = cfg.advertise_address or f"{cfg.host}:{self.port}"
        front = (rmq.advertise_address or f"{rmq.host or cfg.host}:{self.rocketmq_port}"
                 if self.rocketmq_port else "")
        return api, front

    def _start_failover(self) -> None:
        """Publish the addresses in the lease (held since ``open``) and watch the
        others'."""
        self._lease_watch = self.broker.start_failover(*self._addresses())

    def _watch_leases(self, expire: bool = False) -> None:
        """A look at the leases (``expire``: a claim of those of the last look that
        expired, at the moment they do, not at the next look: ``LeaseWatch.due_in_s``)."""
        watch = self._lease_watch
        try:
            if expire:
                watch.expire()
                return
            watch.step()
            due = watch.due_in_s()
            if due is not None and due < self.config.tier.lease_s / 10 and self._scheduler:
                self._scheduler.add_job(self._watch_leases, "date", id="lease-expiry",
                                        replace_existing=True, kwargs={"expire": True},
                                        run_date=datetime.now() + timedelta(seconds=due))
        except TierError as exc:  # the tier is failing (this broker fences itself): one line
            log.warning("watching the brokers' leases failed: %s", exc)
        except Exception:  # the next look tries again
            log.exception("watching the brokers' leases failed")

    def _take_over(self) -> None:
        try:
            self.broker.take_over_at_start()
        except Exception:  # the broker serves on; the command can be run again
            log.exception("the takeover of %s (tier.takeover) failed",
                          self.config.tier.takeover)

    def _start_rocketmq(self) -> None:
        """The RocketMQ 5 front on a port of its own (imported only when enabled)."""
        from chronomq.rocketmq.access import front_guard, refusal
        from chronomq.rocketmq.front import RocketMQServicer
        from chronomq.rocketmq.pb import service as rs

        cfg = self.config.rocketmq
        host = cfg.host or self.config.server.host
        server = _grpc_server(cfg.worker_threads + cfg.max_streams + cfg.max_long_polls,
                              "rmq", cfg.max_concurrent_rpcs)
        self.rocketmq_port = self._bind(server, rocketmq_listener(self.config))
        try:
            self.rocketmq = RocketMQServicer(
                self.broker, self.notifier, self.config.pop.max_wait_ms,
                cfg.advertise_address or f"{host}:{self.rocketmq_port}",
                CallBudget(cfg.max_streams, cfg.max_long_polls,
                           cfg.max_waiting_per_connection, "rocketmq"))
            assert self.guard is not None  # signatures and rights, the API's count
            gate = front_guard(self.broker.access, self.guard.lookup, self.guard.denials,
                               cfg.access_key, cfg.secret_key, self.clock)
            add_service(server, self.rocketmq,
                        rs.DESCRIPTOR.services_by_name["MessagingService"], gate=gate,
                        refuse=refusal)
        finally:  # a bound gRPC server keeps its port until it has been started and stopped
            server.start()
            self._rocketmq_server = server
        assert self.servicer is not None
        self.servicer.more_figures.append(self.rocketmq.figures)
        log.info("RocketMQ 5 front serving on %s:%d", host, self.rocketmq_port)

    def _bind(self, server: grpc.Server, listener: Listener) -> int:
        """Listen on ``listener``'s address (TLS when ``server.tls_*`` is set); the bound
        port."""
        cfg = self.config.server
        address = listener.address  # an IPv6 host in brackets, as gRPC wants it
        if not cfg.tls_cert_file:
            with binding(listener):
                return int(server.add_insecure_port(address))
        with open(cfg.tls_key_file, "rb") as k, open(cfg.tls_cert_file, "rb") as c:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        with binding(listener):
            return int(server.add_secure_port(address, creds))

    def _claim_topics(self) -> None:
        """Record this broker as its topics' owner at the addresses other brokers' clients
        are sent to; warn when those addresses cannot reach it from another machine."""
        cfg, rmq = self.config.server, self.config.rocketmq
        api, front = self._addresses()
        self.broker.start_retry("claiming its topics",  # (a slow tier at start)
                                lambda: self.broker.mounts.claim_topics(api, front))
        others = ""
        for setting, address, given in (("server", api, cfg.advertise_address),
                                        ("rocketmq", front, rmq.advertise_address)):
            why = "" if given or not address else unreachable(address)
            if why == "loopback" and not others:
                others = _other_owner(self.broker.tier, self.broker.prefix) or "-"
            if why == "any":
                log.warning("tier.claim_topics records %s in the shared tier for clients "
                            "of other brokers, but %s.host %s is no address they can "
                            "dial: set %s.advertise_address = \"HOST:PORT\" to an address "
                            "of this broker they reach", address, setting,
                            address.rpartition(":")[0], setting)
            elif why == "loopback" and others != "-":
                log.warning("tier.claim_topics records %s in the shared tier, which reaches "
                            "only this machine, and broker %s records its topics there "
                            "too: if it or its clients run on another machine, set %s."
                            "advertise_address = \"HOST:PORT\" to an address of this "
                            "broker they reach", address, others, setting)

    def _on_dispatched(self, records: list[DispatchInfo]) -> None:
        self.notifier.arrived({origin_of(r.topic) for r in records})  # retries wake their topic

    def _preload(self) -> None:
        moved = self.broker.timer.preload_due(self.clock.now_ms())
        if moved:
            log.info("preloaded %d delayed messages from TimerFlatFiles", moved)

    def _retention(self) -> None:
        self.broker.run_retention()

    def stop(self) -> None:
        """Graceful: stop accepting, finish RPCs in flight, flush and close the store."""
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self.notifier.close()  # long polls answer now instead of at their deadline
        grace = self.config.server.shutdown_grace_s
        stopped = [s.stop(grace) for s in (self._server, self._rocketmq_server) if s]
        for event in stopped:
            event.wait()
        for stop in (self._metrics_stop, self._console_stop):
            if stop is not None:
                stop()
        self._metrics_stop = self._console_stop = None
        self.broker.stop()


def _other_owner(tier: Provider, me: str) -> str:
    """A broker other than ``me`` that owns a topic in the shared tier ("": none); reads
    owner objects only until it finds one."""
    for path in tier.list(OWNERS_PREFIX):
        topic = path[len(OWNERS_PREFIX):].removesuffix(".json")
        try:
            owner = owner_of(tier, topic) if is_name(topic) else None
        except TierError:  # damaged: says nothing about who else is there
            continue
        if owner is not None and owner.broker != me:
            return owner.broker
    return ""


def serve(config: BrokerConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down gracefully."""
    memtrace.limit_fragmentation()  # glibc: big freed blocks go back to the OS
    watch = collector.tune()  # fewer collections walking the heap under the GIL
    server = BrokerServer(config)
    server.start()
    assert server.servicer is not None  # made by start
    server.servicer.more_figures.append(watch.figures)
    collector.freeze()  # what startup built is never walked again
    memtrace.start_from_env(os.environ, server.broker)  # off unless asked for (debugging)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    # ``kill -USR1``: every thread's stack on stderr (a broker that does not stop, or
    # hangs, names where), and it goes on
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    print(f"chronomq listening on {config.server.host}:{server.port}", flush=True)
    if server.console_port:
        print(f"console on http://{config.server.host}:{server.console_port}/", flush=True)
    if server.rocketmq_port:
        print(f"RocketMQ 5 front listening on "
              f"{config.rocketmq.host or config.server.host}:{server.rocketmq_port}", flush=True)
    stopping.wait()
    log.info("shutting down")
    server.stop()
