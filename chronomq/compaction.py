"""Compaction wiring: with ``tier.upload``, the timer snapshots (``cluster.timersnapshot``)
and the system streams' deletion below their snapshots, composed into a broker at start.

The compactor reads the broker's own committed delayed and timer streams back from its
tier; tier retention (``TieredDispatcher.run_retention``) deletes system-stream segments
wholly below the floors the tier's pointers name (the timer snapshot's and the journal
snapshot's), and the old snapshots' objects go once a new one is pointed at: each
deletion only after a write of the lease confirms this broker still holds it (a broker
taken over deletes nothing its successor may read).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cluster.timersnapshot import TimerCompactor, stream_floors
from store.errors import ChronomqError

if TYPE_CHECKING:
    from chronomq.broker import Broker

log = logging.getLogger(__name__)


def attach_compaction(broker: Broker) -> TimerCompactor:
    """The broker's timer compactor (run by the server's scheduler), with the tier's
    retention told where the system streams may be cut and when deletes are safe."""
    tiered, lease = broker.tiered, broker.lease
    assert tiered is not None, "compaction needs tier.upload"
    name = broker.config.tier.broker_name
    if lease is not None:
        def confirm() -> bool:
            try:
                lease.commit()
            except ChronomqError as exc:
                log.warning("not deleting from the tier now: %s", exc)
                return False
            return True
        tiered.confirm_deletes = confirm
    tiered.system_floors = lambda: stream_floors(broker.tier, name)

    def committed(stream: str) -> int:
        q = tiered.queue(stream, 0)
        return max(0, q.committed_queue_offset) if q is not None else 0

    return TimerCompactor(broker.tier, name, lambda s, qo, n: tiered.read(s, 0, qo, n),
                          committed, tiered.confirm_deletes,
                          broker.config.tier.journal_snapshot_records)
