"""The broker's listeners, checked before anything is opened, and one error for each that
cannot listen.

A broker listens on up to four addresses, each set by its own setting: the API
(``server.port``), Prometheus (``server.metrics_port``), the web console
(``console.port``) and the RocketMQ front (``rocketmq.port``), all on ``server.host``
except the front (``rocketmq.host`` when set).  A port that is taken (another broker on
the machine: two brokers with different ``server.port`` share the default
``console.port``) must be found before the data directory is opened, so that the refusal
holds nothing (no RocksDB lock, no thread) and is one line naming the setting, the
address and what to do.

``check_free(config)`` binds and listens on every configured address with the options
the real servers use (``SO_REUSEADDR``, no ``SO_REUSEPORT``), holding all of them until
the last one, then closes them.  It is a check, not a reservation: a port taken between
the check and the real bind is reported by ``binding``, which translates the servers'
own failures (``OSError`` of the HTTP servers, gRPC's ``RuntimeError`` without an errno,
for which the address is probed again to learn why) into the same ``ListenError``.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from chronomq.config import BrokerConfig
from store.errors import ChronomqError


class ListenError(ChronomqError):
    """Raised when a listener cannot listen on its address; the message names the
    setting, the address and what to do."""


@dataclass(frozen=True, slots=True)
class Listener:
    """One address the broker listens on and the settings that choose it."""

    setting: str  # the port's setting, e.g. "console.port"
    host_setting: str  # where the host comes from, e.g. "server.host"
    host: str
    port: int  # 0: any free port
    can_be_off: bool  # 0 turns it off (instead of "any free port")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def api_listener(config: BrokerConfig) -> Listener:
    return Listener("server.port", "server.host", config.server.host, config.server.port,
                    False)


def metrics_listener(config: BrokerConfig) -> Listener:
    return Listener("server.metrics_port", "server.host", config.server.host,
                    config.server.metrics_port, True)


def console_listener(config: BrokerConfig) -> Listener:
    return Listener("console.port", "server.host", config.server.host, config.console.port,
                    True)


def rocketmq_listener(config: BrokerConfig) -> Listener:
    r = config.rocketmq
    return Listener("rocketmq.port", "rocketmq.host" if r.host else "server.host",
                    r.host or config.server.host, r.port, False)


def listeners(config: BrokerConfig) -> list[Listener]:
    """The listeners ``config`` turns on, in the order the server starts them."""
    out = [api_listener(config)]
    if config.rocketmq.enabled:
        out.append(rocketmq_listener(config))
    if config.console.port:
        out.append(console_listener(config))
    if config.server.metrics_port:
        out.append(metrics_listener(config))
    return out


def check_free(config: BrokerConfig) -> None:
    """Raise ``ListenError`` for the first listener of ``config`` that cannot listen."""
    with ExitStack() as held:
        for listener in listeners(config):  # port 0 too: its host must be one of ours
            held.enter_context(_listen(listener))


@contextmanager
def binding(listener: Listener) -> Iterator[None]:
    """Run a server's bind, turning its failure into ``ListenError``."""
    try:
        yield
    except OSError as exc:
        raise explain(listener, exc) from exc
    except RuntimeError as exc:  # gRPC: "Failed to bind to address ...", no errno
        if "Failed to bind" not in str(exc):
            raise
        try:
            with _listen(listener):
                pass
        except ListenError as known:
            raise known from exc
        raise ListenError(f"{listener.setting}: cannot listen on {listener.address} "
                          f"({exc})") from exc


def unreachable(address: str) -> str:
    """Why other machines cannot reach ``address`` (host:port): "any" for a wildcard
    host (0.0.0.0, ::), "loopback" for this machine only, "" when they may."""
    host = address.rpartition(":")[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "loopback" if host == "localhost" else "any" if not host else ""
    return "any" if ip.is_unspecified else "loopback" if ip.is_loopback else ""


def explain(listener: Listener, exc: OSError) -> ListenError:
    """The error for ``listener`` whose bind failed with ``exc``: the setting, the address,
    why, and what to do."""
    where = f"{listener.setting}: {listener.address}"
    other = ("; 0 turns it off" if listener.can_be_off
             else "; 0 picks any free port" if listener.setting == "server.port" else "")
    if isinstance(exc, socket.gaierror):
        return ListenError(f"{listener.host_setting} = {listener.host!r} is not a known "
                           "host name or address: set it to an address of this machine "
                           "(127.0.0.1, 0.0.0.0 or an interface's address)")
    if exc.errno == errno.EADDRINUSE:
        return ListenError(f"{where} is already in use (another chronomq serve, or another "
                           "program, listens there): stop that one, or choose a free port "
                           f"with --set {listener.setting}=PORT{other}")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ListenError(f"{where}: {listener.host} is not an address of this machine: "
                           f"set {listener.host_setting} to one (127.0.0.1, 0.0.0.0 or an "
                           "interface's address)")
    if exc.errno == errno.EACCES:
        return ListenError(f"{where}: not permitted (ports below 1024 need privileges): "
                           f"choose a port from 1024 up with --set {listener.setting}=PORT"
                           f"{other}")
    return ListenError(f"{where}: cannot listen there ({exc.strerror or exc})")


@contextmanager
def _listen(listener: Listener) -> Iterator[None]:
    """Listen on every address ``listener.host`` resolves to, as the servers do, for the
    duration of the block."""
    try:
        found = socket.getaddrinfo(listener.host or None, listener.port,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise explain(listener, exc) from exc
    with ExitStack() as held:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = held.enter_context(socket.socket(family, kind, proto))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
                sock.listen()
            except OSError as exc:
                raise explain(listener, exc) from exc
        yield
