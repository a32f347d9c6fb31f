"""The replay of a departed broker's journal from its tier: what a takeover keeps of its
groups and its timer.

``replay`` reads the state stream from the latest snapshot the tier's
``<broker>/state/snapshot.json`` points at (the whole stream when the pointer names no
readable snapshot: a snapshot must start with its ``pop-reset`` record) and the timer
stream from its latest timer snapshot (``cluster.timersnapshot``; whole without one), and
applies them in order to a ``JournalState`` (``store.journal`` has the records' format).
``stream`` reads any of the departed broker's streams (``cluster.adoption`` reads its
delayed records: the snapshot's pending ones, then the delayed stream past it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from cluster.timersnapshot import Pointer, read_pointer, read_residual
from store.journal import POP_RESET, SNAPSHOT_POINTER, JournalState, read_snapshot_pointer
from store.message import decode_record
from store.names import DELAYED_STREAM, STATE_STREAM, TIMER_STREAM
from tiered.errors import TierError, TierNotFound
from tiered.mount import MountedBroker
from tiered.provider import Provider
from tiered.queue import TieredEntry

log = logging.getLogger(__name__)


def _snapshot_at(tier: Provider, mounted: MountedBroker) -> int:
    """The state stream's queue offset of the departed broker's latest snapshot in
    the tier (0: none, read the whole stream)."""
    try:
        raw = tier.read(f"{mounted.broker}/{SNAPSHOT_POINTER}")
    except TierNotFound:
        return 0
    except TierError as exc:
        log.warning("takeover of %s: cannot read its journal snapshot pointer (%s); "
                    "replaying the whole journal", mounted.broker, exc)
        return 0
    at = read_snapshot_pointer(raw)
    bounds = mounted.bounds(STATE_STREAM, 0)
    if at is None or bounds is None or not bounds[0] <= at < bounds[1]:
        log.error("takeover of %s: its journal snapshot pointer %r names no record of "
                  "its state stream %s; replaying the whole journal", mounted.broker,
                  raw[:100], bounds)
        return 0
    return at


def timer_pointer(tier: Provider, mounted: MountedBroker) -> Pointer | None:
    """The departed broker's latest timer snapshot, if the tier holds it whole (else
    None: its streams are read whole).  A whole snapshot holds every pending record
    below its ``C`` and every done or move it had read, so the streams' ends in the
    departed broker's metadata copies need not reach it."""
    pointer = read_pointer(tier, mounted.broker)
    if pointer is None:
        return None
    try:
        missing = [p for p in [*pointer.parts, pointer.residual] if not tier.exists(p)]
    except TierError as exc:
        missing = [str(exc)]
    if missing:
        log.error("takeover of %s: its timer snapshot %s is not whole in the tier (missing "
                  "%s): its delayed and timer streams are read whole", mounted.broker,
                  pointer, missing[:3])
        return None
    return pointer


def replay(tier: Provider, mounted: MountedBroker, label: str = "takeover") -> JournalState:
    """Replay a departed broker's journal (``mounted``: its tier, read after the claim):
    its state stream from the latest snapshot the tier holds (whole, when that snapshot
    cannot be read), its timer stream from its latest timer snapshot (whole without one;
    ``cluster.timersnapshot``).  ``label``: what the log lines say it is for (a
    ``cluster.warmup`` reads it before the claim)."""
    start = time.monotonic()
    steps: list[tuple[str, float]] = []  # what each part took, for the log line

    def step(name: str, since: float) -> float:
        now = time.monotonic()
        steps.append((name, now - since))
        return now

    first = _snapshot_at(tier, mounted)
    at = step("pointer", start)
    state = _replay_state(mounted, first) if first else None
    if state is None:
        if first:
            log.error("takeover of %s: the snapshot pointer names state record %d, "
                      "which starts no readable snapshot; replaying the whole journal",
                      mounted.broker, first)
        state = _replay_state(mounted, 0)
        assert state is not None  # from 0 nothing is checked
    state_records = state.records
    at = step("state", at)
    state.timer_snapshot = timer_pointer(tier, mounted)
    timer_from = 0
    if state.timer_snapshot is not None:
        timer_from = state.timer_snapshot.timer_from
        if state.timer_snapshot.residual:
            done, moved = read_residual(tier, state.timer_snapshot.residual)
            state.done |= done
            state.moved.update(moved)
    at = step("timer snapshot", at)
    for entry in stream(mounted, TIMER_STREAM, timer_from):
        m = decode_record(entry.record)
        state.apply(m.tag, m.body)
    step("timer stream", at)
    if state.bad:
        log.error("takeover of %s: %d journal records could not be read", mounted.broker,
                  state.bad)
    state.seconds = time.monotonic() - start
    log.info("%s of %s: %d journal records replayed in %.1f s (%d of the state "
             "stream from record %d, %d of the timer stream from record %d; %s)",
             label, mounted.broker, state.records, state.seconds, state_records, first,
             state.records - state_records, timer_from,
             ", ".join(f"{name} {took:.2f} s" for name, took in steps))
    return state


def _replay_state(mounted: MountedBroker, first: int) -> JournalState | None:
    """The state stream replayed from queue offset ``first``; None when ``first``
    (not 0) is not where a readable snapshot starts."""
    state = JournalState()
    for entry in stream(mounted, STATE_STREAM, first):
        m = decode_record(entry.record)
        if first and not state.records and (entry.queue_offset != first
                                            or m.tag != POP_RESET):
            return None
        state.apply(m.tag, m.body)
        if state.records % 1_000_000 == 0:
            log.info("takeover of %s: %d journal records replayed", mounted.broker,
                     state.records)
    return state if state.records or not first else None


def stream(mounted: MountedBroker, name: str, start: int = 0) -> Iterator[TieredEntry]:
    """Every readable entry of one of the departed broker's streams, from ``start``
    (its log read alone: ``TieredQueue.scan``)."""
    return mounted.scan(name, 0, start)


def latest_ms(mounted: MountedBroker) -> int:
    """The departed broker's own latest time in the tier: the store time of the last
    record of its state, timer and delayed streams, by its clock (0: none).  Its clock
    read at least this when it was lost (``pop.leaseclock``)."""
    with ThreadPoolExecutor(3, "latest-ms") as pool:  # the three streams' reads at once
        return max(pool.map(lambda s: last_store_ms(mounted, s),
                            (STATE_STREAM, TIMER_STREAM, DELAYED_STREAM)))


def last_store_ms(mounted: MountedBroker, stream: str) -> int:
    bounds = mounted.bounds(stream, 0)
    if bounds is None or bounds[1] <= bounds[0]:
        return 0
    entries = mounted.read(stream, 0, bounds[1] - 1, 1)
    return entries[-1].store_at_ms if entries else 0
