"""The web console: the broker's schedule, groups and lateness at a glance, and actions
on a message, served by the broker itself (``console.port``).

``chronomq.console.server`` is the HTTP server (login, CSRF, limits), ``views`` what each
page shows, ``pages`` the HTML, ``actions`` cancel / reschedule / redrive through the
API's own servicer, ``rates`` the per-second rates of the overview, ``session`` logins.
``open_console`` wires them for ``chronomq.server``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chronomq.api.guard import Guard
from chronomq.api.servicer import BrokerServicer
from chronomq.broker import Broker
from chronomq.config import BrokerConfig
from chronomq.console.actions import ConsoleActions
from chronomq.console.rates import RateSampler
from chronomq.console.server import Console, start_console
from chronomq.console.session import Sessions
from chronomq.console.views import ConsoleViews
from chronomq.listeners import binding, console_listener

SAMPLE_INTERVAL_S = 5


def open_console(config: BrokerConfig, broker: Broker, servicer: BrokerServicer,
                 guard: Guard, rocketmq: Any = None
                 ) -> tuple[int, RateSampler, Callable[[], None]]:
    """Start the console on ``server.host:console.port``: ``(bound port, its rate
    sampler (call ``sample`` every ``SAMPLE_INTERVAL_S``), a function that stops it)``.
    Logins are the broker's users and ``server.auth_token``; ``guard`` checks actions by
    the API's rows and counts refusals with the API's."""

    def counters() -> dict[str, float]:
        p = broker.pop.statistics()
        return {"rpc.sent": servicer.sent,
                "rocketmq.sent": rocketmq.sent if rocketmq is not None else 0,
                "timer.delivered": broker.timer.statistics().delivered,
                "pop.popped": p.popped, "pop.acked": p.acked}

    def totals() -> dict[str, float]:
        c = counters()
        return {"sent": c["rpc.sent"] + c["rocketmq.sent"], "popped": c["pop.popped"],
                "acked": c["pop.acked"]}

    sampler = RateSampler(counters, time.time)
    sampler.sample()
    console = Console(ConsoleViews(broker, sampler, totals),
                      ConsoleActions(servicer, broker, guard),
                      Sessions(broker.access, config.console.session_ttl_s), guard,
                      config.console.actions, config.console.refresh_s)
    with binding(console_listener(config)):  # a taken port: one line naming console.port
        port, stop = start_console(config.server.host, config.console.port, console)
    return port, sampler, stop
