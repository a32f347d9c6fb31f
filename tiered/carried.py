"""Queue metadata carried in a broker's lease: the commit record of a two-round durable
commit (``tier.durable_ack``).

A reader of a broker's tier (a mount: a takeover, a Spark scan) learns what each queue
holds from the queue's metadata.  Its copy, ``<broker>/meta/<topic>/<queue>.json``, is
one object per queue; a commit that had to write them before its fenced lease write took
three request rounds (the data objects, the copies, the lease).  Now the lease write
itself carries the metadata whose copy is not in the tier yet (field ``meta``:
``{"<topic>/<queue>": "<metadata JSON>"}``), so a commit is two rounds: the data objects,
then the one conditional write that both names them and fences (refused once a successor
claimed the lease; ``cluster.lease``).  The copies follow off the path of an OK; a
copy's metadata leaves the lease once the copy is in.

Which is newer.  Each metadata carries ``generation`` (the topic's) and ``seq`` (one
more at every save by its owner, kept across restarts by the local file), so of a copy
and the lease's entry a reader takes the higher ``(generation, seq)``: a copy may lag
the lease (not written yet) or lead it (written by a commit whose lease write had not
happened, data never acknowledged, as before).  A reader reads the lease *before* the
copies: an entry leaves the lease only after its copy is in, so whichever it finds, it
sees at least what the lease confirmed.

Without ``tier.durable_ack`` nothing is carried: the copies go up before the position
moves, as they always did.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from store.crashpoint import crashpoint
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider
from tiered.uploads import Mirror

log = logging.getLogger(__name__)

LEASES = "brokers/"  # where brokers' leases live (``cluster.layout``)
FIELD = "meta"  # the lease's field of carried metadata


def lease_path(broker: str) -> str:
    return f"{LEASES}{broker}.json"


def meta_prefix(broker: str) -> str:
    """Where ``broker``'s queue metadata copies live."""
    return f"{broker}/meta/"


def meta_path(broker: str, topic: str, qid: int) -> str:
    """The copy of one queue's metadata (what a mount reads)."""
    return f"{meta_prefix(broker)}{topic}/{qid}.json"


def order(meta: bytes | str) -> tuple[int, int]:
    """``(generation, seq)`` of one queue's metadata: the higher is the newer.
    ``ValueError`` when it does not parse."""
    try:
        raw = json.loads(meta)
        return int(raw["generation"]), int(raw.get("seq", 0))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a tiered queue's metadata: {exc}") from exc


def freshest(copy: bytes | None, carried: bytes | None) -> bytes | None:
    """Of a queue's copy and the lease's entry (either may be missing), the newer; a
    damaged one loses to one that parses (both damaged: the copy, for its reader to
    report)."""
    if carried is None:
        return copy
    if copy is None:
        return carried
    try:
        mine = order(carried)
    except ValueError:
        return copy
    try:
        return copy if order(copy) >= mine else carried
    except ValueError:
        return carried


def read_meta(provider: Provider, path: str, lease: dict[str, bytes]) -> bytes | None:
    """A queue's metadata as a reader sees it: the newer of its copy at ``path`` and the
    entry of ``lease`` (``carried``, read before); None: neither (its topic deleted)."""
    try:
        copy: bytes | None = provider.read(path)
    except TierNotFound:
        copy = None
    return freshest(copy, lease.get(path))


def carried(provider: Provider, broker: str) -> dict[str, bytes]:
    """The queue metadata ``broker``'s lease carries, by copy path; {} without a lease
    (a broker without failover or durable-ack).  ``TierError`` when the lease cannot be
    read or is damaged: what it carries may be the only record of acknowledged data."""
    try:
        raw = provider.read(lease_path(broker))
    except TierNotFound:
        return {}
    return carried_in(raw, broker)


def carried_in(lease: bytes, broker: str) -> dict[str, bytes]:
    """``carried`` from the lease's bytes."""
    try:
        doc = json.loads(lease)
        field = (doc.get(FIELD) or {}) if isinstance(doc, dict) else None
        if not isinstance(field, dict):
            raise ValueError("its metadata field is not an object")
        prefix = meta_prefix(broker)
        return {f"{prefix}{key}": str(meta).encode() for key, meta in field.items()
                if isinstance(key, str) and "/" in key and ".." not in key}
    except ValueError as exc:
        raise TierError(f"the lease {lease_path(broker)} is damaged: {exc}") from exc


def entries(metas: dict[str, bytes], broker: str) -> dict[str, str]:
    """The lease's field for copy path -> metadata (the writer's side of ``carried``)."""
    prefix = meta_prefix(broker)
    return {path[len(prefix):]: meta.decode() for path, meta in metas.items()
            if path.startswith(prefix)}


def has_queues(provider: Provider, broker: str) -> bool:
    """Whether ``broker`` has any queue in the tier: a copy, or metadata its lease
    carries (a broker lost before its first copy went in)."""
    if provider.list(meta_prefix(broker)):
        return True
    try:
        return bool(carried(provider, broker))
    except TierError as exc:  # unreadable: count it as holding something
        log.warning("%s", exc)
        return True


class CommitRecord:
    """The writer's side: what this broker's lease writes carry, from its dispatcher's
    ``Mirror`` of metadata copies (``on`` once ``carry`` is called: with durable-ack).
    Thread-safe (the Mirror's lock)."""

    def __init__(self, mirror: Mirror, broker: str, checkpoint: Callable[[], int]) -> None:
        self._mirror, self._prefix, self._checkpoint = mirror, meta_prefix(broker), checkpoint
        self.on = False

    def carry(self, held: dict[str, bytes]) -> None:
        """From now on the lease write that confirms a commit carries the metadata whose
        copies are not in (``carried``), and a copy goes in only after one did.
        ``held``: what the lease carried when this broker started (after the
        dispatcher's ``open``)."""
        self._mirror.carry(self._prefix, held)
        self.on = True

    def carried(self) -> dict[str, bytes]:
        """What a lease write carries now: every queue's metadata whose copy is not known
        to be in the tier, as a reader may see it (the journal's streams once the
        checkpoint passed their records' ``after``)."""
        return self._mirror.due(self._checkpoint())

    def confirmed(self, carried: dict[str, bytes]) -> None:
        """A lease write carrying ``carried`` is in the tier: their copies may go in."""
        self._mirror.confirmed(carried)
        crashpoint("tier.after_commit_record")

    def floor(self, checkpoint: int) -> tuple[int, float] | None:
        """``Mirror.floor`` over what ``carried`` does not give as it is now."""
        return self._mirror.unready_floor(checkpoint)
