"""Compaction wiring: with ``tier.upload``, the timer snapshots (``cluster.timersnapshot``)
and the system streams' deletion below their snapshots, composed into a broker at start.

The timer snapshots also take in the delayed messages this broker adopted in its
takeovers (``AdoptionFolds``): once a takeover is done (its local record says so, and
the timer stream committed to the tier covers what it journaled of them), the next
snapshot holds the adoption's pending messages under their adopted offsets and names
its manifest as folded; a takeover of this broker then reads them in its snapshot
instead of the tiers of every broker it had taken over (``cluster.adoption``).

The compactor reads the broker's own committed delayed and timer streams back from its
tier; tier retention (``TieredDispatcher.run_retention``) deletes system-stream segments
wholly below the floors the tier's pointers name (the timer snapshot's and the journal
snapshot's), and the old snapshots' objects go once a new one is pointed at: each
deletion only after a write of the lease confirms this broker still holds it (a broker
taken over deletes nothing its successor may read).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from cluster.adoption import brokers_of, is_manifest, manifest_digest, pending
from cluster.timersnapshot import Fold, PendingRecord, TimerCompactor, stream_floors
from store.errors import ChronomqError
from tiered.errors import TierNotFound
from tiered.mount import MountedBroker

if TYPE_CHECKING:
    from cluster.host import Host

log = logging.getLogger(__name__)


def attach_compaction(broker: Host) -> TimerCompactor:
    """The broker's timer compactor (run by the server's scheduler), with the tier's
    retention told where the system streams may be cut and when deletes are safe."""
    tiered, lease = broker.tiered, broker.lease
    assert tiered is not None, "compaction needs tier.upload"
    name = broker.prefix
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
                          broker.config.tier.journal_snapshot_records, AdoptionFolds(broker),
                          broker.config.tier.journal_snapshot_s, broker.clock.monotonic_ms,
                          lambda: {p.rsplit("/", 1)[0]
                                   for p in broker.timer_store.adopted_prefixes()})


class AdoptionFolds:
    """The adoptions of this broker's finished takeovers, as ``Fold``s for its timer
    snapshots: ``folds(t)`` gives those whose journal records are below ``t`` in its
    timer stream.  Reads the local takeover records (``<data>/takeovers/``), again only
    when one changed.  Called on the compactor's thread."""

    def __init__(self, broker: Host) -> None:
        self._b = broker
        self._dir = os.path.join(broker.config.store.data_dir, "takeovers")
        self._seen: dict[str, tuple[int, tuple[str, dict[str, Any], int] | None]] = {}

    def __call__(self, timer_committed: int) -> list[Fold]:
        names = sorted(n for n in os.listdir(self._dir) if n.endswith(".json")) \
            if os.path.isdir(self._dir) else []
        out = []
        for name in names:
            path = os.path.join(self._dir, name)
            try:
                mtime = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue
            seen = self._seen.get(name)
            if seen is None or seen[0] != mtime:
                seen = self._seen[name] = (mtime, self._read(path))
            if seen[1] is not None and seen[1][2] <= timer_committed:
                digest, m, _ = seen[1]
                out.append(Fold(digest, brokers_of(m), partial(self._rows, m)))
        return out

    @staticmethod
    def _read(path: str) -> tuple[str, dict[str, Any], int] | None:
        """A finished takeover's manifest, its digest, and the end of what it journaled
        (None: not finished, or by a release that did not journal what it found
        delivered: its manifest stays named, read by a takeover of this broker)."""
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            m, journaled = state.get("timers"), state.get("timers_journaled")
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("not folding the takeover %s into a timer snapshot: %s", path, exc)
            return None
        if not state.get("done") or not is_manifest(m) or not isinstance(journaled, int):
            return None
        return manifest_digest(m), m, journaled

    def _rows(self, m: dict[str, Any]) -> Iterator[list[PendingRecord]]:
        """The manifest's pending messages (before this broker's journal), from the
        tiers of the brokers it names, mounted for this fold only."""
        mounts: dict[str, MountedBroker] = {}
        data_dir = self._b.config.store.data_dir

        def mount(name: str) -> MountedBroker:
            if name not in mounts:
                where = os.path.join(data_dir, "mounts", name)
                try:
                    mounts[name] = MountedBroker(self._b.tier, name, where)
                except TierNotFound:  # nothing of it in the tier: it held nothing, if
                    if not _held_nothing(m, name):  # its takeover found nothing either
                        raise
                    mounts[name] = MountedBroker(self._b.tier, name, where, empty=True)
            return mounts[name]
        for chunk in pending(self._b.tier, m, mount):
            yield [PendingRecord(offset, due, record) for _, due, offset, record in chunk]


def _held_nothing(m: dict[str, Any], broker: str) -> bool:
    """Whether the adoption manifest ``m`` says ``broker``'s streams held nothing when
    it was taken over (no delayed and no timer record: a broker that died before it
    uploaded anything, or one that only adopted, its timer snapshot read by path), so
    that a mount of it reads nothing ``m`` names."""
    if m.get("broker") == broker:
        return int(m.get("delayed_end", -1)) == 0 and int(m.get("timer_end", -1)) == 0
    return any(_held_nothing(child, broker) for child in m.get("adopted", ()))
