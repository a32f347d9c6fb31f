"""Rejoin: which incarnation of its name a starting broker runs as, so that a broker taken
over (paused, partitioned, restarted late) or a machine replaced with an empty disk
serves again under its ``tier.broker_name`` without a person renaming it.

An *incarnation* is one life of a name in the bucket, numbered from 0; its tier prefix,
lease and owner records are ``cluster.layout.broker_prefix(name, n)``.  A taken-over
incarnation's objects stay as they are (its successor, and the successor's successors,
read them: ``cluster.lineage``), so a new life writes under a new prefix.  At start,
before the lease is held (``cluster.failover.hold_lease``), ``Rejoin.resolve`` reads
the leases of the name's incarnations (``brokers/<name>.json``, ``brokers/<name>--1.json``,
... up to the first missing one) and the data directory's ``incarnation`` file:

- the data directory's incarnation is not taken over (or has no lease yet): it runs as
  that incarnation, as before (a data directory from before incarnations is 0);
- it was taken over: the rejoining broker waits for the takeover's done record
  (``takeovers/<prefix>.json``, ``"done": true``) up to ``tier.rejoin_timeout_s``,
  logging progress (past it, it goes on: the claim already decided, and finishing the
  takeover is the successor's), sets its old data aside (below), and runs as the next
  incarnation after the newest one;
- an empty data directory whose newest incarnation holds state in the tier (its topic
  catalogue) and is not taken over: a lost machine under its old name.  Holding that
  lease would strand what it holds, so the broker leaves it alone and waits up to
  ``tier.rejoin_timeout_s`` for a survivor to take it over (``tier.failover``: once the
  lease expires), then goes on as above.  Unchanged for ``SELF_CLAIM_LEASES`` leases and
  claimed by nobody (no survivor: a lone broker), the new life claims its old self
  (``cluster.lease.claim``) and takes it over once it runs (its lease watch finds the
  claim its own).  Without failover nobody claims it, and it says what to run.

**Set aside, never deleted**: everything in the data directory (but ``disk-reserve``
and earlier incarnations) moves into ``<data>/incarnations/<n>/`` (through
``<n>.partial``, so a crash midway resumes the move).  The data directory's
``incarnation`` file (JSON: version 1, name, incarnation) is written, fsynced, before
the lease.

Every tier request here is retried with back-off for ``tier.start_timeout_s``: a broker
started while its S3 is slow (SeaweedFS making its first volume) starts once it answers.

Not thread-safe: one start at a time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from cluster.layout import broker_prefix, catalogue_path, takeover_record
from cluster.lease import LeaseView, claim, read_lease
from store.clock import Clock
from store.errors import FailedPrecondition, Unavailable
from store.files import write_atomic
from tiered.carried import has_queues
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider

log = logging.getLogger(__name__)

T = TypeVar("T")

INCARNATION_FILE = "incarnation"
ASIDE_DIR = "incarnations"
KEPT = frozenset({ASIDE_DIR, "disk-reserve"})  # stay in place when the rest moves aside
BACKOFF_S, BACKOFF_MAX_S = 0.2, 5.0  # a failed tier request at start: again after ...
POLL_S = 0.5  # waiting for a takeover: how often the tier is read
PROGRESS_S = 10.0  # ... and how often the wait is logged
SELF_CLAIM_LEASES = 2  # an old life's lease unchanged this many leases, claimed by no
#                        survivor (the last of three tries 1 2/3 leases in): its new life
#                        claims it (a lone broker replaced with an empty disk)


def read_incarnation(data_dir: str) -> int | None:
    """The incarnation the data directory holds: its ``incarnation`` file's, else 0 when
    it holds a broker's tier state from before incarnations (``tiered/queues``), else
    None (nothing of a broker: a new machine, or one set aside)."""
    try:
        with open(os.path.join(data_dir, INCARNATION_FILE), encoding="utf-8") as f:
            record = json.load(f)
        if record.get("version") != 1:
            raise ValueError(f"unknown version {record.get('version')!r}")
        return int(record["incarnation"])
    except FileNotFoundError:
        return 0 if os.path.isdir(os.path.join(data_dir, "tiered", "queues")) else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FailedPrecondition(f"{data_dir}/{INCARNATION_FILE} is damaged ({exc}): it "
                                 "names the incarnation this data belongs to") from exc


def write_incarnation(data_dir: str, name: str, incarnation: int) -> None:
    os.makedirs(data_dir, exist_ok=True)
    write_atomic(os.path.join(data_dir, INCARNATION_FILE), json.dumps(
        {"version": 1, "name": name, "incarnation": incarnation}).encode())


def set_aside(data_dir: str, incarnation: int, keep: frozenset[str] = KEPT) -> str | None:
    """Move the data directory's contents (but ``keep``) into
    ``<data>/incarnations/<incarnation>/``; returns that folder, None when nothing was
    there.  A move a crash cut short goes on into the same folder."""
    aside = os.path.join(data_dir, ASIDE_DIR)
    partial = next((os.path.join(aside, d) for d in sorted(os.listdir(aside))
                    if d.endswith(".partial")), None) if os.path.isdir(aside) else None
    os.makedirs(data_dir, exist_ok=True)
    entries = sorted(e for e in os.listdir(data_dir) if e not in keep)
    if not entries and partial is None:
        return None
    if partial is None:
        partial = os.path.join(aside, f"{incarnation}.partial")
        os.makedirs(partial)
        _fsync_dir(aside)
        _fsync_dir(data_dir)
    for entry in entries:
        os.rename(os.path.join(data_dir, entry), os.path.join(partial, entry))
    _fsync_dir(partial)
    _fsync_dir(data_dir)
    final = partial.removesuffix(".partial")
    while os.path.exists(final):  # (an incarnation set aside twice: a copy restored)
        final += "+"
    os.rename(partial, final)
    _fsync_dir(aside)
    return final


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Rejoin:
    """Resolves the incarnation a starting broker runs as (see the module docstring)."""

    def __init__(self, tier: Provider, name: str, data_dir: str, clock: Clock,
                 start_timeout_s: float, rejoin_timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep,
                 keep: frozenset[str] = KEPT) -> None:
        self._tier, self._name, self._data_dir = tier, name, data_dir
        self._clock, self._sleep, self._keep = clock, sleep, keep
        self._start_timeout_s, self._rejoin_timeout_s = start_timeout_s, rejoin_timeout_s
        self._start_deadline = self._now() + start_timeout_s

    def _now(self) -> float:
        return self._clock.monotonic_ms() / 1000

    def prefix(self, incarnation: int) -> str:
        return broker_prefix(self._name, incarnation)

    def resolve(self) -> int:
        """The incarnation to hold the lease of; its number is in the data directory
        when this returns.  ``FailedPrecondition`` when it cannot start (said why),
        ``Unavailable`` when the tier did not answer within ``tier.start_timeout_s``."""
        local = read_incarnation(self._data_dir)
        leases = self.retry("reading the leases of its incarnations", self._leases)
        newest = len(leases) - 1
        if local is not None:
            mine = leases[local] if local <= newest else None
            if mine is None or not mine.taken_by:
                return self._begin(local)
            if mine.taken_by != self.prefix(newest + 1):  # (else: ours to run, below)
                self._wait_done(local, mine)
            return self._begin(newest + 1, aside=local)
        if newest < 0:
            return self._begin(0)
        view = leases[newest]
        if not view.taken_by:
            held = self.retry("reading its topic catalogue", lambda: self._tier.exists(
                catalogue_path(self.prefix(newest))))
            if not held:  # nothing of it in the tier: the lease is ours to take
                return self._begin(newest)
            view = self._wait_claimed(newest, view)
        # claimed by the life this broker becomes now (its own claim below, or one a
        # crash cut short before that life's lease): its lease watch runs the takeover
        if view.taken_by != self.prefix(newest + 1):
            self._wait_done(newest, view)
        return self._begin(newest + 1, aside=newest)

    def _begin(self, incarnation: int, aside: int | None = None) -> int:
        if aside is not None:
            moved = set_aside(self._data_dir, aside, self._keep)
            if moved:
                log.warning("broker %s: the data of its incarnation %d (%s), taken over, "
                            "is set aside in %s", self._name, aside, self.prefix(aside),
                            moved)
        if aside is not None or read_incarnation(self._data_dir) != incarnation:
            write_incarnation(self._data_dir, self._name, incarnation)
        if aside is not None:
            log.warning("broker %s serves again as incarnation %d (tier prefix %s)",
                        self._name, incarnation, self.prefix(incarnation))
        return incarnation

    def _leases(self) -> list[LeaseView]:
        """The leases of the name's incarnations, 0 up to the first one missing."""
        found: list[LeaseView] = []
        while True:
            view, _ = read_lease(self._tier, self.prefix(len(found)))
            if view is None:
                return found
            found.append(view)

    def _wait_claimed(self, incarnation: int, view: LeaseView) -> LeaseView:
        """Wait for a survivor to claim the lease of ``incarnation``, which holds state
        in the tier this data directory does not hold."""
        prefix = self.prefix(incarnation)
        if view.lease_s <= 0:  # not watched: nobody takes it over by itself
            raise FailedPrecondition(
                f"broker {self._name} has data in the tier (incarnation {incarnation}, "
                f"{catalogue_path(prefix)}) but its data directory {self._data_dir} holds "
                "none of it (a lost machine started again under its old name?): starting "
                f"would strand what it holds. Run `chronomq takeover {prefix}` at another "
                f"broker (or start one with tier.takeover = \"{prefix}\"), then start this "
                "one again: it serves as a new incarnation; or start it with its data "
                "directory")
        log.warning("broker %s: its data directory is empty but its incarnation %d (%s) "
                    "holds state in the tier: waiting for a survivor to take it over "
                    "(once its lease expires, %.0f s)", self._name, incarnation, prefix,
                    view.lease_s)
        me = self.prefix(incarnation + 1)
        seen: list[tuple[str, float]] = []  # the version seen, and since when

        def claimed() -> LeaseView | None:
            now, version = read_lease(self._tier, prefix)
            at = self._now()  # (after the read: never earlier than the version's write)
            if now is None or now.taken_by:
                return now
            if not seen or seen[0][0] != version:
                seen[:] = [(version, at)]
                return None
            if at - seen[0][1] < SELF_CLAIM_LEASES * now.lease_s:
                return None
            # expired, and no survivor claimed it (there is none): take our old self
            # over ourselves; the lease watch of the new life runs the takeover it finds
            # claimed by it (``cluster.leasewatch.LeaseWatch``)
            holder = claim(self._tier, prefix, me, self._clock.now_ms())
            log.warning("broker %s: no survivor took over its incarnation %d (%s); %s "
                        "claimed it", self._name, incarnation, prefix, holder)
            return replace(now, taken_by=holder)
        found = self._wait(f"a survivor to take over {prefix}", claimed)
        if found is None:
            raise FailedPrecondition(
                f"broker {self._name}: no broker took over its incarnation {incarnation} "
                f"({prefix}) within tier.rejoin_timeout_s ({self._rejoin_timeout_s:g} s): "
                f"its lease holds state this empty data directory does not. Run `chronomq "
                f"takeover {prefix}` at another broker, then start this one again")
        return found

    def _wait_done(self, incarnation: int, view: LeaseView) -> None:
        """Wait for the takeover of ``incarnation`` (claimed by ``view.taken_by``) to
        finish: its done record, or nothing of it in the tier to carry."""
        prefix = self.prefix(incarnation)

        def done() -> bool | None:
            try:
                record = json.loads(self._tier.read(takeover_record(prefix)))
                if isinstance(record, dict) and record.get("done") is True:
                    return True
            except TierNotFound:
                pass
            except ValueError:  # being written, or damaged: the done one replaces it
                pass
            return True if not has_queues(self._tier, prefix) else None
        log.warning("broker %s: its incarnation %d (%s) was taken over by %s: waiting for "
                    "that takeover to finish", self._name, incarnation, prefix, view.taken_by)
        if self._wait(f"the takeover of {prefix} by {view.taken_by} to finish", done) is None:
            log.warning("broker %s: the takeover of %s by %s did not finish within "
                        "tier.rejoin_timeout_s (%.0f s); starting as a new incarnation "
                        "anyway (the claim decided: finishing it is the successor's)",
                        self._name, prefix, view.taken_by, self._rejoin_timeout_s)

    def _wait(self, what: str, found: Callable[[], T | None]) -> T | None:
        """Poll ``found`` until it returns something, up to ``tier.rejoin_timeout_s``;
        None past it.  Logs progress every ``PROGRESS_S``."""
        start = self._now()
        logged = start
        while True:
            try:
                result = found()
            except TierError as exc:
                log.warning("broker %s: waiting for %s: the tier failed (%s)", self._name,
                            what, exc)
                result = None
            now = self._now()
            if result is not None or now - start >= self._rejoin_timeout_s:
                # the tier answered a wait long: the start's other requests begin anew
                self._start_deadline = max(self._start_deadline,
                                           now + self._start_timeout_s)
                return result
            if now - logged >= PROGRESS_S:
                logged = now
                log.warning("broker %s: still waiting for %s (%.0f s of %.0f s)",
                            self._name, what, now - start, self._rejoin_timeout_s)
            self._sleep(POLL_S)

    def remaining_s(self) -> float:
        """What is left of ``tier.start_timeout_s`` (from this start)."""
        return max(0.0, self._start_deadline - self._now())

    def retry(self, what: str, request: Callable[[], T]) -> T:
        """``request()``, asked again with back-off while the tier fails, up to
        ``tier.start_timeout_s`` from this start; then ``Unavailable``."""
        delay_s = BACKOFF_S
        while True:
            try:
                return request()
            except TierError as exc:
                if self._now() + delay_s > self._start_deadline:
                    raise Unavailable(
                        f"broker {self._name}: {what}: the tier did not answer within "
                        f"tier.start_timeout_s ({self._start_timeout_s:g} s): {exc}") from exc
                log.warning("broker %s: %s: %s; again in %.1f s", self._name, what, exc,
                            delay_s)
            self._sleep(delay_s)
            delay_s = min(delay_s * 2, BACKOFF_MAX_S)
