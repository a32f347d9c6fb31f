"""The tiered store's parts of a broker with ``tier.upload``, wired in one place
(``Broker.open``): the dispatcher that uploads every queue (``tiered.dispatcher``), the
``Fence`` every OK passes (``cluster.fence``: with durable-ack, the tier's durable
position too), the commit record in the lease write (``tiered.carried``), and the reader
Pop falls through to (``tiered.reader``, behind a read-ahead cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from chronomq.config import BrokerConfig
from cluster.fence import Fence
from cluster.lease import BrokerLease
from store.clock import Clock
from store.store import MessageStore
from tiered.dispatcher import TieredDispatcher
from tiered.mount import MountReader
from tiered.provider import Provider
from tiered.readahead import ReadAheadCache
from tiered.reader import TieredReader


@dataclass
class TierParts:
    tiered: TieredDispatcher
    fence: Fence
    reader: TieredReader
    mount_reader: MountReader | None  # what Pop reads through (None: tier.read = disable)


def open_tier_upload(store: MessageStore, tier: Provider, prefix: str, config: BrokerConfig,
                     lease: BrokerLease | None, clock: Clock) -> TierParts:
    """Build and open the tier's parts (the dispatcher loads its metadata and position)."""
    t = config.tier
    tiered = TieredDispatcher(store, tier, prefix,
                              os.path.join(config.store.data_dir, "tiered"), t, clock)
    fence = Fence(lease, tiered.durable, t.durable_ack, prefix)
    tiered.open()
    if t.durable_ack and lease is not None:  # a commit record in the lease write
        tiered.record.carry(lease.held)
        lease.carried, lease.confirmed = tiered.record.carried, tiered.record.confirmed
    cache = None
    if t.read_ahead_bytes > 0:
        cache = ReadAheadCache(tiered.read, clock, t.read_ahead_bytes, t.read_ahead_ttl_ms)
    reader = TieredReader(tiered, store, t.read, cache, t.hot_bytes)
    return TierParts(tiered, fence, reader,
                     MountReader(reader) if t.read != "disable" else None)
