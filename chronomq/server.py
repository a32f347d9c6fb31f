"""The server process: wires the broker, the gRPC services, metrics and scheduled jobs.

``serve(config)`` runs until SIGINT/SIGTERM, then stops taking RPCs, lets running ones
finish (``server.shutdown_grace_s``), and flushes everything to disk.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from chronomq.metrics import start_metrics
from chronomq.notify import ArrivalNotifier
from chronomq.servicer import BrokerServicer
from chronomq.v1 import broker_pb2, broker_pb2_grpc
from store.clock import Clock, SystemClock
from store.message import DispatchInfo

log = logging.getLogger(__name__)

_OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MAX_MESSAGE_BYTES = 64 << 20


class BearerAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects calls without ``authorization: Bearer <token>`` (health and reflection
    stay open so probes and grpcurl's listing work)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or wrong bearer token (metadata 'authorization')")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        if details.method.startswith(_OPEN_METHODS):
            return await continuation(details)
        for key, value in details.invocation_metadata or ():
            if key == "authorization" and value == self._expected:
                return await continuation(details)
        return self._deny


class BrokerServer:
    """One broker and its gRPC server on the running event loop."""

    def __init__(self, config: BrokerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.broker = Broker(config, self.clock)
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rpc-blocking")
        self._scheduler: AsyncIOScheduler | None = None
        self._metrics_stop: Callable[[], None] | None = None
        self.servicer: BrokerServicer | None = None

    async def start(self) -> int:
        """Open the store (recovery), start threads and the gRPC server; return the port."""
        loop = asyncio.get_running_loop()
        cfg = self.config.server
        await loop.run_in_executor(self._pool, self.broker.open)
        notifier = ArrivalNotifier(loop)
        assert self.broker.store.dispatcher is not None
        self.broker.store.dispatcher.add_listener(
            lambda records: _notify_topics(notifier, records))
        self.broker.start()
        self.servicer = BrokerServicer(self.broker, notifier, self._pool,
                                       self.config.pop.max_wait_ms)
        interceptors = [BearerAuth(cfg.auth_token)] if cfg.auth_token else []
        server = grpc.aio.server(
            interceptors=interceptors,
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0)],
        )
        broker_pb2_grpc.add_BrokerServicer_to_server(  # type: ignore[no-untyped-call]
            self.servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = (broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,
                 health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        address = f"{cfg.host}:{cfg.port}"
        if cfg.tls_cert_file:
            with open(cfg.tls_key_file, "rb") as k, open(cfg.tls_cert_file, "rb") as c:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        for name in ("", names[0]):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._start_jobs()
        if cfg.metrics_port:
            self._metrics_stop = start_metrics(cfg.host, cfg.metrics_port, self.servicer)
        log.info("chronomq serving on %s:%d (data in %s)", cfg.host, self.port,
                 self.config.store.data_dir)
        return self.port

    def _start_jobs(self) -> None:
        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._retention, "interval", seconds=self.config.server.retention_interval_s,
            id="retention", max_instances=1, coalesce=True)
        self._scheduler.start()

    async def _retention(self) -> None:
        loop = asyncio.get_running_loop()
        freed = await loop.run_in_executor(self._pool, self.broker.store.run_retention)
        if freed:
            log.info("retention deleted %d bytes of commitlog", freed)

    async def stop(self) -> None:
        """Graceful: stop accepting, finish RPCs in flight, flush and close the store."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        if self._server is not None:
            await self._server.stop(self.config.server.shutdown_grace_s)
        if self._metrics_stop is not None:
            self._metrics_stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.broker.stop)
        self._pool.shutdown(wait=True)

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


def _notify_topics(notifier: ArrivalNotifier, records: list[DispatchInfo]) -> None:
    notifier.arrived({r.topic for r in records})


async def serve(config: BrokerConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down gracefully."""
    server = BrokerServer(config)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    print(f"chronomq listening on {config.server.host}:{server.port}", flush=True)
    await stopping.wait()
    log.info("shutting down")
    await server.stop()
