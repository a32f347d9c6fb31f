"""Claims: who takes a departed broker over, decided in the bucket alone.

A takeover begins with its claim, ``taken_by: <me>`` written into the departed broker's
lease by a conditional put (``cluster.lease.claim``): one winner, and nothing of the
departed broker's is read before it.  A claim held by a broker that this one took over
before that broker finished its takeover (its record in the tier not ``done``:
``Lineage.finished``) is moved here (``cluster.lease.inherit``), so a takeover whose
taker died is finished by the taker's successor (docs/DESIGN.md:
"Takeover: a broker's promises in the tier").  A departed broker that wrote to the
tier within ``RECENT_MS`` may still be alive: refused unless forced.  Thread-safe
(each call is; ``Takeover`` runs one takeover at a time).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING

from cluster.layout import LEASES, lease_path, takeover_record
from cluster.lease import claim, inherit, read_lease
from cluster.lineage import Lineage
from cluster.replay import last_store_ms
from store.errors import FailedPrecondition
from store.names import DELAYED_STREAM, STATE_STREAM, TIMER_STREAM
from tiered.errors import TierError
from tiered.mount import MountedBroker

if TYPE_CHECKING:
    from cluster.host import Host

log = logging.getLogger(__name__)

RECENT_MS = 60_000  # a departed broker that wrote this recently may be alive: --force


class Claims:
    """The claims of one broker (see the module docstring)."""

    def __init__(self, broker: Host, lineage: Lineage) -> None:
        self._b = broker
        self._lineage = lineage
        self._records: dict[str, threading.Thread] = {}  # departed -> its record's write
        self._lock = threading.Lock()

    def claim(self, departed: str, mounted: MountedBroker, force: bool,
              holder: str = "") -> None:
        """Become the one broker taking ``departed`` over, or raise
        ``FailedPrecondition`` naming the broker that is.  ``holder``: the broker its
        lease named a moment ago (this one: claimed already, by the lease watch)."""
        b, me = self._b, self._b.prefix
        if holder == me:
            self._record(departed)
            return
        if not force:  # (its streams' last records: read only then, the claim waits)
            last = max(last_store_ms(mounted, s)
                       for s in (STATE_STREAM, TIMER_STREAM, DELAYED_STREAM))
            age = b.clock.now_ms() - last
            if age < RECENT_MS:
                raise FailedPrecondition(
                    f"broker {departed} wrote to the tier {age / 1000:.0f} s ago: it may "
                    "still be running; take it over only once it is gone (--force to "
                    "insist)")
        holder = claim(b.tier, departed, me, b.clock.now_ms())
        if holder != me and not self.inherits(departed, holder):
            raise FailedPrecondition(
                f"broker {departed} is taken over by {holder} already (its lease "
                f"{lease_path(departed)} says so); if {holder} is gone before it finished, "
                f"take {holder} over: that finishes the takeover of {departed} too")
        self._record(departed)

    def _record(self, departed: str) -> None:
        b, me = self._b, self._b.prefix
        record = json.dumps({"by": me, "at_ms": b.clock.now_ms()}).encode()

        def write() -> None:  # a record for people; the decision is the lease's
            try:
                b.tier.write(takeover_record(departed), record)
            except TierError as exc:
                log.warning("could not record the takeover of %s: %s", departed, exc)
        # beside the takeover's first reads (``recorded`` waits for it: its done record
        # must come after it)
        writer = threading.Thread(target=write, name=f"record-{departed}", daemon=True)
        with self._lock:
            self._records[departed] = writer
        writer.start()

    def recorded(self, departed: str) -> None:
        """Wait for the record of the claim of ``departed`` to be written (or to fail)."""
        with self._lock:
            writer = self._records.pop(departed, None)
        if writer is not None:
            writer.join()

    def holder(self, departed: str) -> str:
        """The broker ``departed``'s lease names as taking it over ("": none)."""
        try:
            view, _ = read_lease(self._b.tier, departed)
        except TierError:
            return ""  # the claim reads it again, and decides
        return view.taken_by if view is not None else ""

    def inheritable(self, departed: str, holder: str) -> bool:
        """Whether ``holder``, which claimed ``departed``, was taken over by this broker
        before it finished that takeover."""
        if self.holder(holder) != self._b.prefix:
            return False
        return not self._lineage.finished(holder, departed)  # else its topics came with it

    def inherits(self, departed: str, holder: str) -> bool:
        """Claim ``departed``'s lease from ``holder`` when ``inheritable``."""
        b = self._b
        return self.inheritable(departed, holder) and inherit(
            b.tier, departed, holder, b.prefix, b.clock.now_ms())

    def claimed_by(self, holder: str) -> list[str]:
        """The brokers whose leases name ``holder`` as taking them over."""
        out = []
        for path in self._b.tier.list(LEASES):
            name = path[len(LEASES):].removesuffix(".json")
            try:
                view, _ = read_lease(self._b.tier, name)
            except TierError as exc:
                log.error("cannot read the lease %s: %s", path, exc)
                continue
            if view is not None and view.taken_by == holder:
                out.append(name)
        return out
