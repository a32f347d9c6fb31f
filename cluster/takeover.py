"""Takeover: this broker keeps a departed broker's promises, from the shared tier alone.

A broker that uploads (``tier.upload``) keeps in the tier its topic queues, every pending
delayed record (the delayed stream) and every change of its positions, leases and timers
(the journal).  When it is lost, another broker runs ``takeover(name)`` (the lease
watch, the ``chronomq takeover`` command, the Takeover RPC, ``tier.takeover``) and
becomes the owner of its topics.  The steps, each a named crash point and idempotent
(the protocol and its argument in docs/DESIGN.md:
"Takeover: a broker's promises in the tier",
"Failover by construction: the bucket fences, clocks only time"):

1. **Intent, then claim.**  ``<me>/takeovers/<departed>.json`` with ``done: false`` is
   in the tier (``cluster.lineage``), then ``taken_by: <me>`` goes into the departed
   broker's lease by a conditional put (``cluster.lease.claim``): one winner; what was
   read before it is used only where the tier shows it unchanged (``cluster.warmup``).
   A claim held by a broker this one took over before it finished is moved here.
2. **Ends, positions, topics**: each taken queue continues at the departed broker's end
   in the tier (published with the intent); the journal is replayed and its groups'
   positions and leases adopted (``PopService.adopt``); the topics are created here and
   *held* (``store.holds``): no client is answered on them yet.
3. **Timers** (``cluster.adoption``) and **schedules** adopted.
4. **Done**: once what it wrote is in this broker's tier, ``done: true`` in the tier;
   then owner records name this broker, the departed broker's receipt handles are
   accepted, the topics released and the schedules woken.  Then the takeovers the
   departed broker had begun and not finished are finished here (``_inherit``).

Sends with a client-chosen id the departed broker accepted within
``store.dedupe_window_ms`` are duplicates here too (``cluster.handover``).  Topics come
from the departed broker's catalogue copy (``cluster.catalogue.departed_topics``): not
the ones it deleted; owner records naming it for topics not taken are released.  A
chain is followed: the brokers it had taken over serve the older offsets of the topics
it had taken (``cluster.lineage``).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster.adoption import Adoption, manifest_of
from cluster.catalogue import departed_topics
from cluster.claims import Claims
from cluster.delivered import Prefetch
from cluster.handover import (
    CLOCK_SLACK_MS,
    InheritedIds,
    accept_handles,
    adopt_leases,
    settle_replaced,
)
from cluster.layout import catalogue_path, lease_path, takeover_record
from cluster.lease import claim
from cluster.lineage import Lineage, drop_topic, ends_of
from cluster.replay import replay
from cluster.warmup import WarmReads, Warmups
from pop.checkpoint import parse_key
from pop.model import origin_of
from store.crashpoint import crashpoint
from store.errors import FailedPrecondition, InvalidArgument
from store.journal import JournalState
from store.names import TIMER_STREAM, is_name, split_broker_made
from store.topics import Topic
from tiered.carried import has_queues
from tiered.errors import TierError, TierNotFound
from tiered.mount import MountedBroker

if TYPE_CHECKING:
    from cluster.host import Host

log = logging.getLogger(__name__)

PARALLEL_TOPICS = 16  # taken topics created, and their owner records written, at once
DURABLE_WAIT_S = 120.0  # a takeover is done once what it wrote here is in the tier


@dataclass
class TakeoverResult:
    broker: str
    topics: list[str] = field(default_factory=list)
    pending: int = 0  # delayed messages scheduled here
    groups: int = 0
    seconds: float = 0.0
    accepting_after_s: float = 0.0
    done: bool = False
    journal_records: int = 0  # the departed broker's state records replayed
    journal_seconds: float = 0.0  # reading and replaying them (sends wait for it)
    phases: dict[str, float] = field(default_factory=dict)  # step -> seconds


class _Phases:
    """Seconds per step of a takeover (its record, its log line): where a slow one went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._at = time.monotonic()

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(self.seconds.get(step, 0.0) + now - self._at, 3)
        self._at = now


class Takeover:
    """Runs takeovers for one broker (see the module docstring).  One at a time."""

    def __init__(self, broker: Host) -> None:
        self._b = broker
        self._lineage = Lineage(broker)  # what each takeover keeps, here and in the tier
        self._claims = Claims(broker, self._lineage)  # who takes whom over
        self.results: dict[str, TakeoverResult] = {}
        self.ids = InheritedIds()  # the dedupe windows of the brokers taken over
        # reads begun before a claim (``cluster.warmup``): the lease watch begins them
        self.warmups = Warmups(lambda: broker.tier,
                               os.path.join(broker.config.store.data_dir, "mounts"))

    # ------------------------------------------------------------------ restart

    def restore(self) -> None:
        """At start: serve again the older offsets of topics taken over earlier."""
        for departed in self._lineage.departed():
            state = self._lineage.load(departed)
            try:
                mounted = self._mount(departed)
            except TierError as exc:
                log.error("cannot read the tier of %s, taken over earlier: %s", departed, exc)
                continue
            origins = self._adopt(departed, mounted, state)
            if state.get("done"):
                accept_handles(self._b.tier, self._b.pop, origins)
            else:  # cut short: nothing of it answers before it is done (run again)
                self._b.store.holds.hold(ends_of(state), departed)
            self.results[departed] = TakeoverResult(
                departed, sorted(state.get("ends", {})), int(state.get("pending", 0)),
                int(state.get("groups", 0)), float(state.get("seconds", 0.0)),
                float(state.get("accepting_after_s", 0.0)), bool(state.get("done")))

    def forget_topic(self, topic: str) -> None:
        """``topic`` is created anew here (it was deleted): the older offsets of a topic
        of that name taken over before are served no more, here or by a broker taking
        this one over (``lineage.drop_topic``, each record in the tier first)."""
        for departed in self._lineage.departed():
            state = self._lineage.load(departed)
            if drop_topic(state, topic):
                if "ends" in state:
                    self._lineage.publish(departed, state)
                self._lineage.save(departed, state)
        self._b.mount_reader.forget(topic)
        self.ids.forget(topic)

    # ------------------------------------------------------------------ takeover

    def run(self, departed: str, force: bool = False) -> TakeoverResult:
        try:
            return self._run(departed, force)
        finally:
            self.warmups.release(departed)  # what its warm-up kept, if any: dropped

    def _run(self, departed: str, force: bool) -> TakeoverResult:
        b = self._b
        me = b.prefix
        if not is_name(departed):
            raise InvalidArgument(f"broker name {departed[:140]!r} is invalid")
        if departed == me:
            raise InvalidArgument("a broker cannot take itself over")
        if b.tiered is None:
            raise FailedPrecondition("takeover needs tier.upload on this broker")
        b.journal.check()  # a broker taken over itself takes nothing over
        started = time.monotonic()
        phases = _Phases()
        state = self._lineage.load(departed)
        if state.get("done"):  # run again (by hand, or a watch that saw it late)
            self._inherit(departed)
            return self.results.get(departed) or TakeoverResult(departed, done=True)
        mounted: MountedBroker | None = None  # (read after the claim: see below)
        catalogue: dict[str, Topic] | None = None
        if not state:  # the looks before the claim at once: the claim waits for them
            with ThreadPoolExecutor(1, "takeover-look") as pool:
                anything = pool.submit(lambda: has_queues(b.tier, departed) or b.tier.exists(
                    catalogue_path(departed)))  # (topics, never a message)
                holder = self._claims.holder(departed)
                # claimed already (by the lease watch): this mount is the one after it
                look = self._mount(departed, reads=self.warmups.take(departed)
                                   if holder == me else None)
                if not anything.result():
                    return self._nothing(departed)
            if holder not in ("", me) and not self._claims.inheritable(departed, holder):
                raise FailedPrecondition(
                    f"broker {departed} is taken over by {holder} already (its lease "
                    f"{lease_path(departed)} says so); if {holder} is gone before it "
                    f"finished, take {holder} over: that finishes the takeover of {departed} "
                    "too")
            looked = departed_topics(b.tier, look)  # its deleted topics' queues dropped
            taken_here = self._taken_here(departed, looked)
            if taken_here:
                raise FailedPrecondition(
                    f"cannot take over {departed}: topic(s) {', '.join(taken_here[:10])} "
                    "exist on this broker already (their offsets would mix); take it over "
                    "elsewhere")
            if holder == me:
                mounted, catalogue = look, looked
            state = {"by": me, "ends": {}, "timers_through": 0, "at_ms": b.clock.now_ms()}
            # the intent, in the tier before the claim: a broker that takes this one over
            # while this takeover runs finds it unfinished and finishes it
            # (``Lineage.unfinished``, ``_inherit``)
            self._lineage.publish(departed, state)
            crashpoint("takeover.after_intent")
            try:
                self._claims.claim(departed, look, force, holder)
            except FailedPrecondition:
                self._lineage.withdraw(departed)
                raise
            self._lineage.save(departed, state)
        phases.mark("claim")
        crashpoint("takeover.after_claim")
        # read only now, after the claim: everything the departed broker confirmed
        # (``cluster.lease``: its commits' lease writes) is in the tier before the claim
        # (what a warm-up read before it is used where the tier shows it unchanged)
        if mounted is None or catalogue is None:
            mounted = self._mount(departed, reads=self.warmups.take(departed))
            catalogue = departed_topics(b.tier, mounted)  # its deleted topics' queues dropped
        if departed in b.mount_reader.mounts():  # served read-only so far: now read-write
            b.mounts.unmount(departed)
        phases.mark("mount")
        ahead = Prefetch(mounted)  # the timer step's look for delivered copies, begun
        taken = {t: c.queue_count for t, c in catalogue.items()}
        # the topics of a takeover the departed broker had begun and not finished are
        # not its own yet: they are taken from their first broker (``_inherit``)
        begun = {t for rec in self._lineage.unfinished(departed).values()
                 for t in rec.get("ends", {})}
        for t in [t for t in taken if t in begun or _origin(t) in begun]:
            del taken[t]
        # a run that resumes takes what the first run took (the departed broker's copy
        # may have changed since: a write of its that landed after the claim)
        taken = {t: int(n) for t, n in state.setdefault("taken", taken).items()}
        if "chain" not in state:  # what the departed broker had itself taken over
            state["chain"], state["adopted"] = self._lineage.chain_of(departed)
            phases.mark("chain")
        # each queue continues after the departed broker's end in the tier, or after
        # its predecessor's when it never uploaded that queue (nothing sent to it there)
        before = [ends_of(link) for link in state["chain"]]
        for e in before:  # a queue only the predecessor had counts too
            for t, qs in e.items():
                if t in taken:
                    taken[t] = max([taken[t], *(q + 1 for q in qs)])
        ends: dict[str, dict[int, int]] = ends_of(state) or {
            t: {q: max([(mounted.bounds(t, q) or (0, 0))[1],
                        *(e.get(t, {}).get(q, 0) for e in before)]) for q in range(n)}
            for t, n in taken.items()}
        state["ends"] = ends
        self._lineage.save(departed, state)  # the ends first: a restart serves them
        self._lineage.publish(departed, state)  # and this broker's successor finds them
        # made here from now on, answering no client before the takeover is done
        b.store.holds.hold(taken, departed)
        if b.pop.tier is None:
            b.pop.tier = b.mount_reader
        origins = self._adopt(departed, mounted, state)  # the taken queues readable, then:
        phases.mark("backlog")
        self.ids.warm_behind(departed, b.clock.now_ms())  # the resends' lookups: not waited
        groups, journal = self._positions(departed, mounted, taken, catalogue, ends, phases)
        result = TakeoverResult(departed, sorted(taken), 0, len(groups), 0.0, 0.0,
                                journal_records=journal.records,
                                journal_seconds=journal.seconds, phases=phases.seconds)
        self.results[departed] = result
        result.pending = self._timers(departed, mounted, journal, state, ahead)
        phases.mark("timers")
        crashpoint("takeover.after_timers")
        schedules = self._schedules(departed, journal, taken)  # their topics exist now
        self._durable()  # what was adopted here is in this broker's tier, then: done
        phases.mark("durable")
        result.seconds = time.monotonic() - started
        result.done = True
        state.update(pending=result.pending, groups=result.groups, seconds=result.seconds,
                     phases=phases.seconds, done=True)
        self._lineage.save(departed, state)
        self._lineage.publish(departed, state)  # a successor reads it as a link now
        crashpoint("takeover.after_done")
        self._own(departed, taken, state)
        phases.mark("owners")
        crashpoint("takeover.after_owners")
        accept_handles(b.tier, b.pop, origins)  # only now: every lease they name is here
        b.store.holds.release(taken)
        result.accepting_after_s = accepting = time.monotonic() - started
        if schedules:
            b.schedules.wake()  # they tick here from now on (owed ticks by their misfire)
        state.update(accepting_after_s=accepting)
        self._lineage.save(departed, state)
        self._claims.recorded(departed)  # (the claim's record, if this run wrote it: first)
        try:
            b.tier.write(takeover_record(departed), json.dumps(
                {"by": me, "done": True, "topics": len(taken), "pending": result.pending,
                 "groups": result.groups, "at_ms": b.clock.now_ms()}).encode())
        except TierError as exc:  # the takeover holds; only the record of it is late
            log.warning("could not record the finished takeover of %s: %s", departed, exc)
        log.info("took over %s: %d topics, %d groups, %d pending delayed messages in %.1f s "
                 "(sends accepted after %.1f s; steps: %s)", departed, len(taken),
                 result.groups, result.pending, result.seconds, accepting,
                 ", ".join(f"{k} {v:.2f} s" for k, v in phases.seconds.items()))
        self._inherit(departed)
        return result

    def _taken_here(self, departed: str, topics: dict[str, Topic]) -> list[str]:
        """Of the departed broker's ``topics`` (not its deleted ones: ``departed_topics``),
        those this broker has already (a takeover would mix their offsets), except those
        it holds for a takeover of the same broker."""
        held = self._b.store.holds.held()
        return sorted(t for t in topics
                      if self._b.store.topics.get(t) is not None and held.get(t) != departed)

    def _inherit(self, departed: str) -> None:
        """Finish the takeovers the departed broker had begun and not finished: each
        lease it claimed without a record of that takeover done
        (``Lineage.finished``) is taken over from its first broker here, as if the
        departed broker had never begun it."""
        for first in sorted(self._claims.claimed_by(departed)):
            if self._lineage.finished(departed, first):
                continue  # its topics came with the departed broker's
            log.warning("%s had begun to take %s over and did not finish: taking %s over "
                        "here", departed, first, first)
            self.run(first, force=True)

    def _schedules(self, departed: str, journal: JournalState, taken: dict[str, int]
                   ) -> list[str]:
        """The departed broker's recurring schedules of the taken topics, adopted once the
        topics exist (woken when the takeover is done)."""
        names = self._b.schedules.book.adopt(dict(journal.pop.items()), set(taken), departed)
        if names:
            log.info("took over %d recurring schedule(s) of %s", len(names), departed)
        return names

    def _durable(self) -> None:
        """Wait until what this takeover wrote here (positions and leases in the journal,
        topics, settled copies) is in this broker's tier: a broker that takes this one
        over once the takeover is marked done reads it there."""
        tiered = self._b.tiered
        if tiered is not None:
            tiered.wait_durable(self._b.store.commitlog.confirmed_offset, DURABLE_WAIT_S)

    def _own(self, departed: str, taken: dict[str, int], state: dict[str, Any]) -> None:
        """Owner records of the taken topics: those naming the departed broker, or a
        broker of its chain (one that had taken them over before), name this one now."""
        owners = self._b.mounts.owners
        if owners is None:
            return
        names = [departed, *(str(link["broker"]) for link in reversed(state.get("chain", []))
                             if isinstance(link, dict) and "broker" in link)]
        now = self._b.clock.now_ms()

        def own(topic: str) -> None:
            for name in names:
                if owners.take_over(topic, name, now):
                    return
        with ThreadPoolExecutor(PARALLEL_TOPICS, "takeover-owners") as pool:
            list(pool.map(own, [t for t in sorted(taken) if is_name(t)]))
        # the names it claimed and never made, or deleted but kept: usable again
        if released := owners.release_departed(departed, set(taken)):
            log.info("takeover of %s: released its claims of topic(s) it did not have: %s",
                     departed, ", ".join(released[:10]))

    def _nothing(self, departed: str) -> TakeoverResult:
        """A departed broker that never uploaded a queue (it died at its first start):
        its lease claimed, nothing to carry."""
        me = self._b.prefix
        holder = claim(self._b.tier, departed, me, self._b.clock.now_ms())
        if holder != me and not self._claims.inherits(departed, holder):
            raise FailedPrecondition(f"broker {departed} is taken over by {holder} already "
                                     f"(its lease {lease_path(departed)} says so)")
        log.info("took over %s: it had nothing in the tier", departed)
        result = self.results[departed] = TakeoverResult(departed, done=True)
        self._inherit(departed)  # what it had begun to take over
        return result

    def _positions(self, departed: str, mounted: MountedBroker, taken: dict[str, int],
                   catalogue: dict[str, Topic],
                   ends: dict[str, dict[int, int]], phases: _Phases
                   ) -> tuple[set[str], JournalState]:
        """Replay the departed broker's journal, adopt its groups' positions and leases,
        create the taken topics and own them: what sends and Pops need here."""
        b = self._b
        journal = replay(b.tier, mounted)
        phases.mark("journal")
        # positions before topics: no Pop here may start a taken queue from its low mark
        groups = adopt_leases(b.pop, b.clock.now_ms(), mounted, journal,  # on my clock
                              {k: v for k, v in journal.pop.items()  # retry topics too
                               if origin_of(_topic_of(k)) in taken})
        settle_replaced(b.pop, mounted, taken)  # before a revive here can meet them
        phases.mark("positions")
        crashpoint("takeover.after_positions")
        def create(topic: str) -> None:
            count = taken[topic]
            settings = catalogue.get(topic, Topic(topic, count))
            count = max([count, *(q + 1 for q in ends.get(topic, {}))])
            b.store.create_topic_at(
                Topic(topic, count, settings.retention_ms, settings.retention_bytes,
                      tier_retention_ms=settings.tier_retention_ms),
                ends.get(topic, {}), system=split_broker_made(topic) is not None)
        # topics apart from each other at once: their creations share the topic log's
        # fsyncs, and the owner records' reads and writes overlap (one round trip each)
        with ThreadPoolExecutor(PARALLEL_TOPICS, "takeover-topics") as pool:
            list(pool.map(create, sorted(taken)))
        b.publish_topics()
        phases.mark("topics")
        crashpoint("takeover.after_topics")
        return groups, journal

    def _adopt(self, departed: str, mounted: MountedBroker, state: dict[str, Any]
               ) -> list[MountedBroker]:
        """Serve the older offsets of the taken topics: from the departed broker's tier,
        and the oldest from the tiers of the brokers it had taken them from; count the
        ids they stored in the dedupe window.  Returns those brokers' mounts (their
        receipt handles are accepted once their leases are here: ``accept_handles``)."""
        mounts = []
        at = state.get("at_ms")
        until = int(at) + CLOCK_SLACK_MS if isinstance(at, int) else None
        for link in state.get("chain", []):
            try:  # the tier read at the first use (most of a long chain: never)
                link_mount = self._mount(str(link["broker"]), lazy=True)
                self._b.mount_reader.adopt(link_mount, ends_of(link))
                # its ids were resent to the broker that took it over, within the horizon
                # after that takeover (an older record lacks the time: this one's)
                taken = link.get("at_ms")
                self.ids.add(link_mount, frozenset(ends_of(link)),
                             int(taken) + CLOCK_SLACK_MS if isinstance(taken, int) else until)
                mounts.append(link_mount)
            except (FailedPrecondition, TierError, KeyError, TypeError, ValueError) as exc:
                log.error("takeover of %s: cannot serve the backlog it had taken over from "
                          "%s: %s", departed, link.get("broker"), exc)
        self._b.mount_reader.adopt(mounted, ends_of(state))
        self.ids.add(mounted, frozenset(ends_of(state)), until)
        return [*mounts, mounted]

    def _mount(self, departed: str, lazy: bool = False, reads: WarmReads | None = None
               ) -> MountedBroker:
        try:
            return MountedBroker(reads or self._b.tier, departed, os.path.join(
                self._b.config.store.data_dir, "mounts", departed), empty=True, lazy=lazy)
        except TierNotFound as exc:
            raise FailedPrecondition(f"cannot take over {departed}: {exc}") from None

    def _timers(self, departed: str, mounted: MountedBroker, journal: JournalState,
                state: dict[str, Any], ahead: Prefetch | None = None) -> int:
        """Schedule the departed broker's pending delayed messages here
        (``cluster.adoption``); returns how many."""
        started = time.monotonic()
        manifest = state.get("timers")
        replayed: JournalState | None = journal
        now = manifest_of(self._b.tier, mounted, journal, state.get("adopted"))
        if manifest is None:  # first run: what is adopted, in the tier before any of it
            manifest = state["timers"] = now
            self._lineage.publish(departed, state)
            self._lineage.save(departed, state)
        elif manifest != now:
            replayed = None  # resumed after the departed broker's tier moved: as read then
        manifest_s = time.monotonic() - started
        mounts = {departed: mounted}

        def mount(name: str) -> MountedBroker:
            if name not in mounts:
                mounts[name] = self._mount(name)
            return mounts[name]

        result = self.results[departed]

        def on_progress(count: int) -> None:
            result.pending = count

        def on_topic(topic: str) -> None:
            result.topics = sorted({*result.topics, topic})

        legacy = int(state.get("timers_through", 0)) if state.get("timers_started") else None
        adoption = Adoption(self._b, departed, mount, on_progress, on_topic, ahead)
        count = adoption.run(manifest, replayed, legacy)
        # what this broker's timer stream says of the set is below this (a timer
        # snapshot folds the set in once it covers it: ``cluster.compaction``)
        state["timers_journaled"] = max(adoption.journaled_through,
                                        self._b.store.queue_bounds(TIMER_STREAM, 0)[1])
        placed = adoption.placed
        log.info("takeover of %s: %d pending delayed messages scheduled; this run: %d into "
                 "RocksDB, %d left in TimerFlatFiles the tier held (scanned in %.1f s), %d "
                 "written into new ones; %d found delivered already (%.1f s looking); its "
                 "manifest in %.1f s", departed, count, placed.rocksdb, placed.in_place,
                 adoption.seconds_scanning, placed.written, adoption.delivered.skipped,
                 adoption.delivered.seconds, manifest_s)
        return count


def _origin(topic: str) -> str:
    """The user's topic a retry or dead-letter topic belongs to; a topic itself."""
    made = split_broker_made(topic)
    return made[2] if made is not None else topic


def _topic_of(key: bytes) -> str:
    try:
        return parse_key(key)[1]
    except (ValueError, UnicodeDecodeError, struct.error):
        return ""

