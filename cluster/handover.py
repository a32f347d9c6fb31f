"""Handover: what a broker's successor takes from the tier besides its data, so that
what the departed broker promised its clients holds at the successor too.

- **Receipt handles.**  A broker with ``tier.upload`` puts its receipt-handle secret in
  the tier at start, before it gives any handle (``publish_secret``)::

      <broker>/pop-secret    JSON {"version": 1, "secret": "<hex>"}

  A broker taking it over reads it (``read_secret``) and accepts the handles it signed
  (``PopService.adopt_secret``): they name the leases it adopted under the same keys,
  so Ack, Nack, ChangeInvisibleTime and DeadLetter with them settle those leases.  The
  bucket is the trust boundary, as for the journal: whoever can read it can sign.
- **The resend horizon.**  A client whose answer was lost in a failover sends again
  within seconds (the library's clients follow for ``follow_s``, 30 s by default).  So a
  client-chosen id the departed broker accepted for a topic in the last
  ``LAST_STORED_MS`` (a minute) of its life in the tier (the sends in flight as it went;
  by its own clock: its latest record's store time), and within the dedupe window,
  is a duplicate at the successor if it comes again within ``RESEND_HORIZON_MS`` (10
  minutes) after the takeover (``InheritedIds.stored_earlier``, which
  ``SendDedupe.seen_recently`` asks about ids it has not seen itself): looked up in the
  departed broker's key index in the tier (and in the older brokers' of a chain, each for
  the horizon after its own takeover), of what this broker serves only (the queue offsets
  below the ends its takeover took, the delayed records below the end its adoption read,
  ``adopted_delayed_ends``: a commit the departed broker had on its way when it was
  fenced may land in the tier after, served by no broker; ``MountedBroker.serve_below``),
  for the taken topics only, in the index files
  of those last minutes only (``tiered.mount.MountedBroker.stored_since``: one ranged
  read per such file that lists the topic, one sealed every ``tier.index_ms``, 5
  minutes by default), and the departed broker's unsealed tail indexed in memory once,
  at the first lookup.  The horizon bounds what a send to a taken topic costs: a few
  reads, for ten minutes; an older id, or one sent again later, is stored again.
- **Leases on this broker's clock.**  The adopted leases keep their remaining time,
  counted from the adoption here, never judged by the departed broker's wall clock
  (``adopt_leases``, ``pop.leaseclock``): their deadlines, and those of the handles
  the departed broker signed (``handle_shift``), move by the shift from its own latest
  time in the tier (``cluster.replay.latest_ms``) to this broker's clock at adoption.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cluster.layout import secret_path
from cluster.replay import latest_ms, stream
from pop.checkpoint import ck_start_of_key
from pop.leaseclock import encode_shift, lease_clock, move_checkpoint, shift_key, shifts_in
from pop.renewals import moved_marks
from pop.service import PopService
from pop.settle import LeaseEntry, lease_replaced_by
from store.journal import JournalState
from store.names import DELAYED_STREAM, RETRY_PREFIX, split_broker_made
from tiered.errors import TierError, TierNotFound, TierUnavailable
from tiered.mount import MountedBroker
from tiered.provider import Provider

log = logging.getLogger(__name__)

CLOCK_SLACK_MS = 60_000  # a departed broker's clock may run ahead of this one's
RESEND_HORIZON_MS = 600_000  # ids resent this long after a takeover count
LAST_STORED_MS = 60_000  # ... if stored in the departed broker's last minute in the tier
#                          (the sends in flight as it went: a durable-ack send waits
#                          at most tier.upload_timeout_s, 30 s, for the tier)


def publish_secret(tier: Provider, broker: str, secret: bytes) -> None:
    """Put ``broker``'s receipt-handle secret in the tier, unless it is there already.
    Raises ``TierError``."""
    path = secret_path(broker)
    body = json.dumps({"version": 1, "secret": secret.hex()}).encode()
    try:
        if tier.read(path) == body:
            return
    except TierNotFound:
        pass
    tier.write(path, body)


def read_secret(tier: Provider, broker: str) -> bytes | None:
    """``broker``'s receipt-handle secret from the tier; None when it has none (it ran
    a release that did not publish it) or it is unreadable (logged): its handles are
    refused, and their messages come back after their invisible time."""
    try:
        raw = json.loads(tier.read(secret_path(broker)))
        if raw.get("version") != 1:
            raise ValueError(f"unknown version {raw.get('version')!r}")
        return bytes.fromhex(str(raw["secret"]))
    except TierNotFound:
        log.info("broker %s left no receipt-handle secret in the tier: the handles its "
                 "consumers hold are refused here (their messages come back)", broker)
    except (TierError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("cannot read the receipt-handle secret of %s (%s): the handles its "
                  "consumers hold are refused here (their messages come back)", broker, exc)
    return None


def adopt_leases(pop: PopService, now_ms: int, mounted: MountedBroker,
                 journal: JournalState, items: dict[bytes, bytes]) -> set[str]:
    """``PopService.adopt`` of the departed broker's positions and leases (``items``,
    from its ``journal``), their deadlines moved onto this broker's clock (``now_ms``):
    each keeps its remaining time from the departed broker's own latest time in the tier
    (``pop.leaseclock``).  The shift is written with the leases (one durable, journaled
    write), and a resumed takeover keeps it.  Returns the groups taken."""
    departed = mounted.broker
    shift_ms = _kept_shift(pop, departed)
    clock = lease_clock(departed, latest_ms(mounted), journal.pop.items())
    kept: list[tuple[bytes, bytes]] = []  # written with the leases (a resumed run has it)
    if shift_ms is None:
        shift_ms = now_ms - clock.departed_ms
        kept = [(shift_key(b), encode_shift(s)) for b, s in clock.shifts(shift_ms).items()]
    adopted_at_ms = clock.departed_ms + shift_ms
    log.info("takeover of %s: its leases keep their remaining time from its latest "
             "record (%d ms by its clock), %+d ms off this broker's clock at the "
             "adoption", departed, clock.departed_ms, -shift_ms)
    marks = moved_marks(journal.pop.items(), shift_ms)  # push consumers' renewals
    return pop.adopt({k: move_checkpoint(ck_start_of_key(k), v, shift_ms, adopted_at_ms)
                      if k[:1] == b"c" else v for k, v in items.items()}, kept + marks)


def handle_shift(pop: PopService, broker: str) -> int:
    """How far the deadlines of the handles ``broker`` signed move onto this broker's
    clock (``adopt_leases`` kept it); 0 when none is kept (a takeover by an older
    release: read as they are)."""
    return _kept_shift(pop, broker) or 0


def _kept_shift(pop: PopService, broker: str) -> int | None:
    key = shift_key(broker)
    return shifts_in((k, v) for k, v in pop.state_items() if k == key).get(broker)


@dataclass
class _Origin:
    """A tier whose client-chosen ids count here for the topics taken from it."""

    mounted: MountedBroker
    topics: frozenset[str]
    until_ms: int | None  # it stored nothing at or after this (None: unknown)
    first_ms: int | None = None  # ids stored from then on count (``_first``: read once)


def adopted_delayed_ends(takeovers_dir: str) -> dict[str, int]:
    """Per broker, the end of its delayed stream this broker's takeovers adopted from:
    the adoption manifests (``cluster.adoption``, the tree of a chain's) in the local
    takeover records, ``<data>/takeovers/<departed>.json`` field ``timers``."""
    out: dict[str, int] = {}

    def walk(m: object) -> None:
        if isinstance(m, dict) and m.get("version") == 1:
            broker, end = m.get("broker"), m.get("delayed_end")
            if isinstance(broker, str) and isinstance(end, int):
                out[broker] = max(out.get(broker, 0), end)
            for sub in m.get("adopted") or []:
                walk(sub)
    names = os.listdir(takeovers_dir) if os.path.isdir(takeovers_dir) else []
    for name in sorted(n for n in names if n.endswith(".json")):
        try:
            with open(os.path.join(takeovers_dir, name), encoding="utf-8") as f:
                walk(json.load(f).get("timers"))
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("cannot read the takeover record %s: %s", name, exc)
    return out


class InheritedIds:
    """The dedupe windows of the brokers this one took over (see the module docstring).
    Thread-safe: ``add`` from a takeover, ``stored_earlier`` from the sends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._origins: dict[str, _Origin] = {}  # broker -> its tier
        # per broker, the delayed-stream end its adoption read (``adopted_delayed_ends``,
        # set by the broker's wiring; a takeover not that far yet: the mount's own end)
        self.delayed_ends: Callable[[], dict[str, int]] = dict

    def add(self, mounted: MountedBroker, topics: frozenset[str], until_ms: int | None
            ) -> None:
        """Count the ids ``mounted`` stored for ``topics`` (before ``until_ms``), of
        what this broker serves of it (``MountReader.adopt`` told the mount the ends)."""
        end = self.delayed_ends().get(mounted.broker)
        if end is not None:
            mounted.serve_below({DELAYED_STREAM: {0: end}})
        with self._lock:
            self._origins[mounted.broker] = _Origin(mounted, topics, until_ms)

    def forget(self, topic: str) -> None:
        """``topic`` is created anew here: the ids stored for the one taken over under
        its name count no more (``Takeover.forget_topic``)."""
        with self._lock:
            for origin in self._origins.values():
                origin.topics = origin.topics - {topic}

    def warm(self, now_ms: int) -> None:
        """Index now, for every broker whose ids still count, what the first resend's
        lookup would (``MountedBroker.warm``): a takeover does it before it accepts
        sends, so the first ones do not wait for it.  A tier that cannot answer is left
        to that first lookup."""
        with self._lock:
            origins = [o for o in self._origins.values()
                       if o.until_ms is not None and now_ms <= o.until_ms + RESEND_HORIZON_MS]

        def warm(origin: _Origin) -> None:
            try:
                origin.mounted.warm(self._first(origin))
            except TierError as exc:
                log.warning("cannot index the recent ids of %s now: %s",
                            origin.mounted.broker, exc)

        if len(origins) > 1:  # a chain: its brokers' tiers read at once
            with ThreadPoolExecutor(min(len(origins), 8), "warm-ids") as pool:
                list(pool.map(warm, origins))
        elif origins:
            warm(origins[0])

    def warm_behind(self, departed: str, now_ms: int) -> None:
        """``warm`` on a thread of its own (a takeover's background step), timed in the
        log: only a send with a client-chosen id looks ids up, and one that comes sooner
        waits for the index (``tiered.mountindex``'s lock); every other send is accepted
        once the rest of the takeover is done (a chain's indexing grew to seconds)."""
        def run() -> None:
            started = time.monotonic()
            try:
                self.warm(now_ms)
            except Exception:  # the lookups index what they need themselves
                log.exception("takeover of %s: indexing the recent ids failed", departed)
                return
            log.info("takeover of %s: the recent ids of the brokers it holds indexed in "
                     "%.1f s", departed, time.monotonic() - started)
        threading.Thread(target=run, name=f"takeover-ids-{departed}", daemon=True).start()

    @staticmethod
    def _first(origin: _Origin) -> int:
        """When the origin's last minute in the tier began, by its own clock (its
        latest record of the taken topics and its delayed stream)."""
        if origin.first_ms is None:
            origin.first_ms = last_minute_from(origin.mounted, origin.topics)
        return origin.first_ms

    def stored_earlier(self, messages: list[tuple[str, str]], since_ms: int, now_ms: int
                       ) -> dict[tuple[str, str], int]:
        """Of ``messages`` ((topic, client-chosen id) pairs), those a broker this one
        took the topic over from stored at or after ``since_ms`` and within the resend
        horizon, with the store time (``now_ms``: this broker's time).  Raises
        ``TierUnavailable`` when a tier cannot answer (the send may be retried: nothing
        was taken)."""
        if not messages:
            return {}
        with self._lock:
            origins = [o for o in self._origins.values()
                       if o.until_ms is None or (o.until_ms >= since_ms  # else all older
                                                 and now_ms <= o.until_ms + RESEND_HORIZON_MS)]
        out: dict[tuple[str, str], int] = {}
        for origin in origins:
            first_ms = max(since_ms, self._first(origin))
            for m in messages:
                if m[0] not in origin.topics or m in out:
                    continue
                try:
                    at = origin.mounted.stored_since(m[0], m[1], first_ms)
                except TierError as exc:
                    raise TierUnavailable(
                        f"cannot tell whether message id {m[1][:128]!r} was sent to topic "
                        f"{m[0]} before it was taken over from {origin.mounted.broker} "
                        f"(its tier: {exc}); send it again") from exc
                if at is not None:
                    out[m] = at
        return out


def last_minute_from(mounted: MountedBroker, topics: Iterable[str]) -> int:
    """When ``mounted``'s last minute in the tier began, by its own clock: its latest
    record of ``topics`` and its delayed stream, less ``LAST_STORED_MS`` (what a resend's
    lookup indexes: ``InheritedIds``, and a warm-up's, ``cluster.warmup``)."""
    return mounted.last_stored_ms([*topics, DELAYED_STREAM]) - LAST_STORED_MS


def settle_replaced(pop: PopService, mounted: MountedBroker, taken: dict[str, int]) -> None:
    """Mark done the adopted leases the departed broker had already replaced with a
    retry copy when it was lost: it appends the copy, then marks the lease, and only
    the copy may have reached the tier.  Revived here too, the message would come
    twice, the second time after an ack of the first.  Such a copy is one its group
    has not leased yet (a lease of it would follow the mark in the journal), so only
    each retry queue's part past the group's position is read (``pop.settle``:
    every copy names the lease it replaces).  A dead-letter copy (a revive past the
    last attempt, or the DeadLetter RPC) is read from the first one stored since the
    group's oldest open lease here (``MountedBroker.first_stored``): it was made after
    that lease was taken (what it reads costs the dead letters made since, not the
    topic's history), a time moved back onto the departed broker's clock
    (``pop.leaseclock``: compared with its store times, never this broker's)."""
    shift_ms = handle_shift(pop, mounted.broker)

    def replaced(topic: str) -> list[tuple[str, LeaseEntry]]:
        made = split_broker_made(topic)
        bounds = mounted.bounds(topic, 0) if made is not None else None
        if made is None or bounds is None:
            return []
        if made[0] == RETRY_PREFIX:
            at = pop.leased_to(made[1], topic, 0)
        else:  # a dead-letter topic
            since_ms = pop.oldest_open_ms(made[1], made[2])
            if since_ms is None:
                return []
            # (a minute more: the departed broker's clock may have stepped back)
            at = mounted.first_stored(topic, 0, *bounds,
                                      since_ms - shift_ms - CLOCK_SLACK_MS)
        return [(topic, entry) for e in stream(mounted, topic, at)
                if (entry := lease_replaced_by(e.record)) is not None]

    made = sorted(t for t in taken if split_broker_made(t) is not None)
    with ThreadPoolExecutor(max(1, min(len(made), 8)), "takeover-settle") as pool:
        found = [f for got in pool.map(replaced, made) for f in got]  # topics at once
    if found:
        pop.settle_copies(found)


def accept_handles(tier: Provider, pop: PopService, mounts: list[MountedBroker]) -> None:
    """Accept the receipt handles these brokers signed (their secrets in the tier):
    only once the leases they name are in this broker's book, or an Ack in between
    would settle nothing here and the lease, adopted after it, would come back.  The
    secrets are read at once (a chain of a hundred brokers, one request each)."""
    if len(mounts) > 1:
        with ThreadPoolExecutor(min(len(mounts), 8), "takeover-secrets") as pool:
            secrets = list(pool.map(lambda m: read_secret(tier, m.broker), mounts))
    else:
        secrets = [read_secret(tier, m.broker) for m in mounts]
    for mounted, secret in zip(mounts, secrets, strict=True):
        if secret is None:
            continue
        try:
            pop.adopt_secret(secret, handle_shift(pop, mounted.broker))
        except ValueError as exc:  # too short: not one a broker made
            log.error("the receipt-handle secret of %s in the tier is unusable: %s",
                      mounted.broker, exc)
