"""The watch of the other brokers' leases: which lease expired, and the claim of it.

A watcher (``LeaseWatch``, every ``lease_s`` / 10) lists the leases with their versions
and reads only those that changed since its last look.  It remembers, per watched lease, the
version it saw and when it first saw it (its own monotonic clock, read *after* the read:
never earlier than the version's write).  A lease whose version has not changed for
``lease_s`` of the watcher's time is expired; the least loaded survivor claims it first
(the n-th waits n x ``lease_s`` / 3 more), at that moment rather than at its next look
(``due_in_s``, ``expire``: the claim is a conditional write on the version seen, refused
if the lease was written since).  The first in line sees a lease unchanged for half a
lease before that and calls ``suspect`` once per version: its takeover's reads begin
then (``cluster.warmup``).  The lease itself, its fence and the argument:
``cluster.lease``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable

from cluster.layout import LEASES, lease_path
from cluster.lease import BrokerLease, LeaseView, parse_lease, read_lease
from tiered.errors import TierError
from tiered.provider import Provider

log = logging.getLogger(__name__)


class LeaseWatch:
    """Watches the other brokers' leases; claims one that expired (see the module
    docstring).  ``take_over(broker)`` is called at most once per lease won."""

    def __init__(self, provider: Provider, me: BrokerLease,
                 take_over: Callable[[str], None],
                 suspect: Callable[[str], None] = lambda _: None) -> None:
        self._provider = provider
        self._me = me
        self._take_over = take_over
        self._suspect = suspect  # (must return at once)
        self._suspected: dict[str, str] = {}  # broker -> the version suspected
        self._seen: dict[str, tuple[str, float]] = {}  # broker -> (version, first seen)
        self._resumed: set[str] = set()  # leases claimed by this broker, handed on
        self._views: dict[str, tuple[LeaseView, str, bytes, float]] = {}  # the last look
        self._lock = threading.RLock()  # ``step`` and ``expire`` from two threads

    def _read_all(self) -> dict[str, tuple[LeaseView, str, bytes, float]]:
        """Every lease with its version, its content and when it was read: one listing
        with versions, then a read of each lease whose version the last look did not
        hold (a live broker's, every ``lease_s`` / 3; the leases of brokers taken over
        long ago cost a line of the listing, not a read).  The clock is read after each
        read and after the listing: a slow read never makes "first seen" too early."""
        listed = self._provider.list_versions(LEASES)
        listed_at = self._me.monotonic()
        views: dict[str, tuple[LeaseView, str, bytes, float]] = {}
        for path, listed_version in listed.items():
            name = path[len(LEASES):].removesuffix(".json")
            last = self._views.get(name)
            if last is not None and last[1] == listed_version:
                views[name] = (last[0], last[1], last[2], listed_at)
                continue
            try:
                raw, version = self._provider.read_versioned(path)
                views[name] = (parse_lease(raw), version, raw, self._me.monotonic())
            except (TierError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping lease %s: %s", path, exc)
        return views

    def step(self) -> list[str]:
        """One look at every lease; returns the brokers this broker won now."""
        with self._lock:
            return self._step()

    def _step(self) -> list[str]:
        views = self._read_all()
        now = self._me.monotonic()
        for name, (view, _, _, _) in views.items():  # claimed by us before (a lost
            if view.taken_by == self._me.broker and name not in self._resumed:  # answer,
                self._resumed.add(name)  # a restart): the takeover finishes or is done
                self._take_over(name)
        for name, (view, _, _, _) in views.items():  # claimed by a broker we took over:
            holder = views.get(view.taken_by)  # its takeover may be unfinished, ours to
            if (holder is not None and holder[0].taken_by == self._me.broker  # finish
                    and name not in self._resumed and name != self._me.broker):
                self._resumed.add(name)
                self._take_over(name)
        for name, (_, version, _, read_at) in views.items():
            seen = self._seen.get(name)
            if seen is None or seen[0] != version:
                self._seen[name] = (version, read_at)
        self._views = views
        self._suspects(now)
        return self._expire(now)

    def _suspects(self, now: float) -> None:
        """``suspect`` each lease unchanged for half a lease, when this broker is first
        in line to claim it (a live broker writes its lease every third of one)."""
        late = self._watched(self._views, now, self._me.lease_s / 2)
        if not late or self._rank(late) != 0 or not self._me.valid_for_s():
            return
        for name in late:
            version = self._views[name][1]
            if self._suspected.get(name) != version:
                self._suspected[name] = version
                self._suspect(name)

    def due_in_s(self) -> float | None:
        """Seconds until a lease the last look saw (unchanged since) may be claimed
        here, by this broker's turn (None: none is watched).  A caller that looks
        again at that moment (``expire``) claims it then, not at its next look."""
        with self._lock:
            return self._due_in_s()

    def _due_in_s(self) -> float | None:
        lease_s, now = self._me.lease_s, self._me.monotonic()
        # (the turn counts as lost the brokers already late: a live one writes its lease
        # every lease_s / 3; ``expire`` decides by its own count)
        rank = self._rank(self._watched(self._views, now, lease_s / 2))
        dues = [self._seen[n][1] + lease_s + rank * lease_s / 3 - now
                for n in self._watched(self._views, now, -math.inf)]
        return max(0.0, min(dues)) if dues else None

    def expire(self, now: float | None = None) -> list[str]:
        """Claim each lease of the last look that has not changed for ``lease_s`` (by
        this broker's turn), without reading the leases again: a claim is a
        conditional write on the version seen, refused when the lease was renewed
        since.  Returns the brokers this broker won now."""
        with self._lock:
            return self._expire(now)

    def _expire(self, now: float | None) -> list[str]:
        views = self._views
        now = self._me.monotonic() if now is None else now
        lease_s = self._me.lease_s
        expired = self._watched(views, now, lease_s)
        if not expired or not self._me.valid_for_s():
            return []
        rank = self._rank(expired)
        won = []
        for name in expired:
            _, since = self._seen[name]
            if now - since < lease_s + rank * lease_s / 3:
                continue  # a less loaded survivor tries first
            if self._claim(name, views[name][1], views[name][2]):
                log.warning("broker %s's lease expired: %s takes it over", name,
                            self._me.broker)
                won.append(name)
                self._resumed.add(name)
                views.pop(name)  # claimed: no longer watched
                self._take_over(name)
        return won

    def _watched(self, views: dict[str, tuple[LeaseView, str, bytes, float]], now: float,
                 unchanged_s: float) -> list[str]:
        """The other brokers' watched, unclaimed leases whose version this broker has
        seen unchanged for ``unchanged_s`` by ``now``."""
        return [name for name, (view, version, _, _) in views.items()
                if name != self._me.broker and view.lease_s > 0 and not view.taken_by
                and (seen := self._seen.get(name)) is not None and seen[0] == version
                and now - seen[1] >= unchanged_s]

    def _rank(self, expired: list[str]) -> int:
        """This broker's turn among the live brokers, least loaded first."""
        views = self._views
        live = sorted((v.load, n) for n, (v, _, _, _) in views.items()
                      if not v.taken_by and v.lease_s > 0 and n not in expired)
        return next((i for i, (_, n) in enumerate(live) if n == self._me.broker), 0)

    def _claim(self, name: str, version: str, raw: bytes) -> bool:
        """``taken_by: me`` on the version seen expiring; an unknown outcome is read back."""
        content = json.dumps({**json.loads(raw), "taken_by": self._me.broker,
                              "claimed_ms": self._me.wall_ms()}, sort_keys=True).encode()
        try:
            return self._provider.swap(lease_path(name), content, version) is not None
        except TierError as exc:
            log.warning("claiming the lease of %s: %s; reading it back", name, exc)
        try:
            view, _ = read_lease(self._provider, name)
        except TierError:
            return False  # unknown: a later look sees who holds it
        return view is not None and view.taken_by == self._me.broker
