"""Failover wiring: a broker's lease in the bucket and the watch of the others'
(``tiered.lease``), composed into a broker at start when ``tier.failover`` is on.

From ``start_failover`` on no OK is answered while the lease is not valid (the journal's
fence, ``tiered.journal``); a lease the watch wins is taken over in a thread of its own
(``Broker.takeover``), so the watch goes on meanwhile.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from tiered.lease import BrokerLease, LeaseWatch

if TYPE_CHECKING:
    from chronomq.broker import Broker

log = logging.getLogger(__name__)


def start_failover(broker: Broker, address: str, rocketmq_address: str) -> LeaseWatch:
    """Acquire ``broker``'s lease (the fence is set first: no OK until it is held) and
    return the watch of the other brokers' leases."""
    t = broker.config.tier
    lease = BrokerLease(broker.tier, t.broker_name, address, rocketmq_address, t.lease_s,
                        lambda: broker.clock.monotonic_ms() / 1000)
    lease.load = lambda: len(broker.topics())
    broker.journal.fence = lease.check
    lease.acquire()
    broker.lease = lease

    def take_over(departed: str) -> None:
        def run() -> None:
            try:
                broker.takeover(departed, force=True)
            except Exception:  # logged; the takeover can be run again by hand
                log.exception("automatic takeover of %s failed", departed)
        threading.Thread(target=run, name=f"takeover-{departed}", daemon=True).start()
    return LeaseWatch(broker.tier, lease, take_over)
