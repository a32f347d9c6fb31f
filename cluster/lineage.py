"""Lineage: what a takeover keeps of itself, here and in the tier, and the chain it reads.

A takeover (``cluster.takeover``) makes each taken queue continue at the departed
broker's end in the tier; the offsets below that end stay in the departed broker's
tier, and older ones in the tiers of the brokers *it* had taken over.  Which tier holds
which offsets must outlive the takeover, for two readers, so it is written twice per
departed broker:

- **Here**, ``<data>/takeovers/<departed>.json`` (``save``, ``load``): the takeover's
  progress, JSON: who took it over (``by``) and when (``at_ms``), each taken queue's
  end (``ends``), the departed broker's chain (``chain``) and the manifests it had
  adopted (``adopted``), the manifest of the delayed messages adopted here
  (``timers``: ``cluster.adoption``), and the figures once ``done``.  A takeover cut
  short resumes from it; a restart serves the older offsets of the taken topics again
  from it (``Takeover.restore``, over every departed broker kept: ``departed``).
- **In the tier**, ``<me>/takeovers/<departed>.json`` (``publish``): the ends, the
  chain and the timer manifest, for a broker that takes *this* one over.

A chain is followed (``chain_of``): the departed broker's own takeovers
(``<broker>/takeovers/``, its ``publish``) name the brokers whose tiers hold the older
offsets of the topics it had taken, and the manifests of the delayed messages it had
adopted; each of those records carries its own chain, so the list read is flat, of any
length.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from cluster.adoption import is_manifest
from cluster.layout import chain_path, chain_prefix
from store.files import write_atomic
from store.names import split_broker_made
from tiered.errors import TierError, TierNotFound

if TYPE_CHECKING:
    from cluster.host import Host

log = logging.getLogger(__name__)


class Lineage:
    """The takeover records of one broker, by departed broker (see the module docstring).

    Holds the broker, not its tier: a broker makes its ``Takeover`` before it opens its
    tier."""

    def __init__(self, broker: Host) -> None:
        self._b = broker
        self._dir = os.path.join(broker.config.store.data_dir, "takeovers")

    # ------------------------------------------------------------------ here

    def departed(self) -> list[str]:
        """The brokers this one took over (or began to), sorted: those with a record here."""
        if not os.path.isdir(self._dir):
            return []
        return [name[:-5] for name in sorted(os.listdir(self._dir)) if name.endswith(".json")]

    def load(self, departed: str) -> dict[str, Any]:
        """The record of the takeover of ``departed``; {} when none began."""
        try:
            with open(self._path(departed), encoding="utf-8") as f:
                state = json.load(f)
            return state if isinstance(state, dict) else {}
        except FileNotFoundError:
            return {}

    def save(self, departed: str, state: dict[str, Any]) -> None:
        os.makedirs(self._dir, exist_ok=True)
        write_atomic(self._path(departed), json.dumps(state).encode())

    def _path(self, departed: str) -> str:
        return os.path.join(self._dir, f"{departed}.json")

    # ------------------------------------------------------------------ in the tier

    def publish(self, departed: str, state: dict[str, Any]) -> None:
        """``<me>/takeovers/<departed>.json``: what a later takeover of this broker
        needs to serve the backlog of the topics it took, and the delayed messages it
        adopted (``timers``: ``cluster.adoption``)."""
        me = self._b.prefix
        record = {"from": departed, "ends": state["ends"], "chain": state.get("chain", []),
                  "at_ms": state.get("at_ms"), "done": bool(state.get("done"))}
        if "timers" in state:
            record["timers"] = state["timers"]
        self._b.tier.write(chain_path(me, departed), json.dumps(record).encode())

    def chain_of(self, departed: str
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The brokers the departed broker had taken over, with their queues' ends
        (its ``<broker>/takeovers/`` objects), flattened: a chain of any length; and the
        manifests of the delayed messages it adopted (``cluster.adoption``; None when
        an object was unreadable: the timer step reads them again, or stops)."""
        out: list[dict[str, Any]] = []
        adopted: list[dict[str, Any]] | None = []
        prefix = chain_prefix(departed)
        for path in sorted(self._b.tier.list(prefix)):
            try:
                raw = json.loads(self._b.tier.read(path))
                if raw.get("done") is False:  # begun, not finished: not a link
                    continue  # (``unfinished``: taken from its first broker instead)
                out += [{k: c[k] for k in ("broker", "ends", "at_ms") if k in c}
                        for c in raw.get("chain", [])]
                out.append({"broker": str(raw["from"]), "ends": raw["ends"],
                            **({"at_ms": raw["at_ms"]} if "at_ms" in raw else {})})
                if adopted is not None and is_manifest(raw.get("timers")):
                    adopted.append(raw["timers"])
            except (TierError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("takeover of %s: skipping %s: %s", departed, path, exc)
                adopted = None
        return out, adopted


    def unfinished(self, departed: str) -> dict[str, dict[str, Any]]:
        """The takeovers ``departed`` had begun and not finished, by the broker it was
        taking over: its records in the tier that say ``done: false`` (an older record,
        without the field, was written once the takeover had its ends: a link)."""
        out: dict[str, dict[str, Any]] = {}
        for path in sorted(self._b.tier.list(chain_prefix(departed))):
            try:
                raw = json.loads(self._b.tier.read(path))
                if isinstance(raw, dict) and raw.get("done") is False:
                    out[str(raw["from"])] = raw
            except (TierError, ValueError, KeyError, TypeError) as exc:
                log.error("cannot read the takeover record %s: %s", path, exc)
        return out

    def finished(self, holder: str, departed: str) -> bool:
        """Whether ``holder``'s record in the tier says its takeover of ``departed`` is
        done (an older record, without the field, was written once it had its ends:
        done).  No record: it claimed and began nothing the tier knows of.  Raises
        ``TierError`` when the record cannot be read."""
        try:
            raw = json.loads(self._b.tier.read(chain_path(holder, departed)))
        except TierNotFound:
            return False
        except ValueError:  # damaged: what it holds cannot be followed
            return False
        return not (isinstance(raw, dict) and raw.get("done") is False)

    def withdraw(self, departed: str) -> None:
        """Remove the intent to take ``departed`` over (its claim was refused)."""
        try:
            self._b.tier.delete(chain_path(self._b.prefix, departed))
        except TierError as exc:
            log.warning("could not withdraw the intent to take %s over: %s", departed, exc)


def drop_topic(record: dict[str, Any], topic: str) -> bool:
    """Remove ``topic`` and its retry and dead-letter topics from a record's ends and
    from its chain's (the name is created anew here: nothing taken over under it before
    is served again); whether anything was removed."""
    dropped = False
    for r in [record, *record.get("chain", [])]:
        ends = r.get("ends", {}) if isinstance(r, dict) else {}
        for t in [t for t in ends if t == topic or
                  (split_broker_made(t) or ("", "", ""))[2] == topic]:
            del ends[t]
            dropped = True
    return dropped


def ends_of(record: dict[str, Any]) -> dict[str, dict[int, int]]:
    """A record's (or a chain link's) ends, topic -> queue -> end, as numbers (JSON
    keeps the queues as strings)."""
    return {t: {int(q): int(e) for q, e in qs.items()}
            for t, qs in record.get("ends", {}).items()}
