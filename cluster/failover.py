"""Failover wiring: a broker's own lease and the watch of the other brokers' leases
(``cluster.lease``), composed into a broker at start.

Every broker with ``tier.upload`` holds its lease from ``Broker.open`` on, before the
store opens: no OK, no timer, no port before it (``hold_lease``).  Which lease is
decided first (``cluster.rejoin``): a broker taken over, or one whose data directory
holds nothing of what its name holds in the tier (a lost machine started again under its
old name), waits for the takeover of its old incarnation, sets its old data aside and
serves again under its name as a new incarnation, with a tier prefix of its own; it
never holds a lease whose state it lacks (that would strand its topics and keep every
survivor away).  With ``tier.failover`` the
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

from cluster.layout import broker_prefix
from cluster.lease import BrokerLease
from cluster.leasewatch import LeaseWatch
from cluster.rejoin import KEPT, Rejoin
from store.clock import Clock
from store.errors import FailedPrecondition
from tiered.provider import Provider

if TYPE_CHECKING:
    from cluster.host import Host, HostConfig

log = logging.getLogger(__name__)


def hold_lease(config: HostConfig, tier: Provider, clock: Clock
               ) -> tuple[BrokerLease, Rejoin]:
    """Find the incarnation this broker runs as (``cluster.rejoin``: waiting for the
    takeover of its old self, its old data set aside), acquire its lease and start
    renewing it.  Returns the lease and the rejoin, whose ``retry`` asks the tier again
    within ``tier.start_timeout_s`` (the other requests of the start)."""
    t = config.tier
    data_dir = config.store.data_dir
    rejoin = Rejoin(tier, t.broker_name, data_dir, clock, t.start_timeout_s,
                    t.rejoin_timeout_s, keep=_kept(config))
    incarnation = rejoin.resolve()
    lease = BrokerLease(tier, broker_prefix(t.broker_name, incarnation), "", "", t.lease_s,
                        clock, watched=t.failover, name=t.broker_name,
                        incarnation=incarnation)
    lease.acquire(rejoin.remaining_s())
    lease.start()  # renewing from now on: a long recovery does not let it lapse
    return lease, rejoin


def _kept(config: HostConfig) -> frozenset[str]:
    """What stays in the data directory when an old incarnation's data moves aside: the
    disk guard's reserve, earlier incarnations, and a local tier kept inside it."""
    kept = set(KEPT)
    if config.tier.provider == "local":
        data = os.path.realpath(config.store.data_dir)
        tier = os.path.realpath(config.tier_local_dir())
        if os.path.commonpath([data, tier]) == data and tier != data:
            kept.add(os.path.relpath(tier, data).split(os.sep)[0])
    return frozenset(kept)


def start_failover(broker: Host, address: str, rocketmq_address: str) -> LeaseWatch:
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
            except FailedPrecondition as exc:  # taken by another, or not to be taken now
                log.warning("automatic takeover of %s not run: %s", departed, exc)
            except Exception:  # logged; the takeover can be run again by hand
                log.exception("automatic takeover of %s failed", departed)
        threading.Thread(target=run, name=f"takeover-{departed}", daemon=True).start()
    # its bounded requests; the first in line reads ahead of a claim (``cluster.warmup``)
    return LeaseWatch(lease.provider, lease, take_over, broker.takeovers.warmups.begin)
