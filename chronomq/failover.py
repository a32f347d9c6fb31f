"""Failover wiring: a broker's own lease and the watch of the other brokers' leases
(``cluster.lease``), composed into a broker at start.

Every broker with ``tier.upload`` holds its lease from ``Broker.open`` on, before the
store opens: no OK, no timer, no port before it (``hold_lease``).  A broker taken over
refuses to start there; so does one whose data directory holds nothing of what its name
holds in the tier (a lost machine started again under its old name would strand its
topics and, holding the lease, keep every survivor away).  With ``tier.failover`` the
lease is watched and renewed; ``start_failover`` publishes its addresses and builds the
watch.  A lease the watch wins is
taken over in a thread of its own (``Broker.takeover``), so the watch goes on meanwhile;
a lease this broker claimed before (its answer lost, or this broker restarted) is handed
on again, and a takeover already done is not run twice.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from cluster.layout import catalogue_path
from cluster.lease import BrokerLease, LeaseWatch, read_lease
from store.clock import Clock
from store.errors import FailedPrecondition
from tiered.provider import Provider

if TYPE_CHECKING:
    from chronomq.broker import Broker
    from chronomq.config import BrokerConfig

log = logging.getLogger(__name__)


def hold_lease(config: BrokerConfig, tier: Provider, clock: Clock) -> BrokerLease:
    """Acquire this broker's lease (see the module docstring) and start renewing it."""
    t = config.tier
    view, _ = read_lease(tier, t.broker_name)
    if view is None or not view.taken_by:  # (taken over: the lease says so, below)
        check_not_reborn(config, tier)
    lease = BrokerLease(tier, t.broker_name, "", "", t.lease_s, clock, watched=t.failover)
    lease.acquire()
    lease.start()  # renewing from now on: a long recovery does not let it lapse
    return lease


def check_not_reborn(config: BrokerConfig, tier: Provider) -> None:
    """Refuse a data directory that holds nothing of what this broker's name holds in
    the tier (its topic catalogue there says it uploaded before)."""
    name, data_dir = config.tier.broker_name, config.store.data_dir
    if os.path.isdir(os.path.join(data_dir, "tiered", "queues")):
        return
    catalogue = catalogue_path(name)
    if tier.exists(catalogue):
        raise FailedPrecondition(
            f"broker {name} has data in the tier ({catalogue}) but its data directory "
            f"{data_dir} holds none of it (a lost machine started again under its old "
            "name?): starting would strand what it holds. Start it with its data "
            "directory; or start this broker under a new tier.broker_name with "
            f"tier.takeover = \"{name}\" (or run `chronomq takeover {name}` at another "
            f"broker); with tier.failover a survivor takes {name} over by itself once its "
            "lease expires")


def start_failover(broker: Broker, address: str, rocketmq_address: str) -> LeaseWatch:
    """Publish ``broker``'s addresses in its lease and return the watch of the other
    brokers' leases."""
    lease = broker.lease
    assert lease is not None, "tier.failover needs tier.upload: the lease is held at open"
    broker.advertise(address, rocketmq_address)

    def take_over(departed: str) -> None:
        done = broker.takeovers.results.get(departed)
        if done is not None and done.done:
            return

        def run() -> None:
            try:
                broker.takeover(departed, force=True)
            except Exception:  # logged; the takeover can be run again by hand
                log.exception("automatic takeover of %s failed", departed)
        threading.Thread(target=run, name=f"takeover-{departed}", daemon=True).start()
    return LeaseWatch(lease.provider, lease, take_over)  # its bounded requests
