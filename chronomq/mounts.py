"""Mounts: the topics a broker serves besides its own, and who owns topics in the tier.

A broker may serve a departed broker's topics read-only from the shared tier
(``tier.mounts``, or the Mount call: ``tiered.mount``), and with ``tier.claim_topics``
it records itself in the tier as the owner of the topics it serves
(``cluster.ownership``), so other brokers' clients are sent to it.  The two are one
concept because each changes the other: a mount takes over the ownership of the
mounted topics, and turning ownership on claims the local topics and takes over those
of every broker mounted so far.  Kept out of ``chronomq.broker``, which only wires
this to the store (its mounted topic names) and POP (its tier reader).

Thread-safe: a mount's or an unmount's change of the mounted set and its hand-off to the
store and POP are one step (``_lock``), so two at once never leave a stale set behind.
"""

from __future__ import annotations

import logging
import os
import threading

from cluster.catalogue import departed_topics
from cluster.ownership import Owner, TopicOwners
from pop.service import PopService
from store.clock import Clock
from store.errors import ChronomqError, InvalidArgument
from store.names import is_name
from store.store import MessageStore
from tiered.mount import MountedBroker, MountReader
from tiered.provider import Provider

log = logging.getLogger(__name__)


class Mounts:
    """Mounting other brokers' topics (``mount``, ``unmount``) and claiming topic
    ownership in the shared tier (``claim_topics``; ``owners`` is None until then).
    ``prefix`` is this broker's tier prefix and owner-record name; each mount keeps its
    working folder under ``mounts_dir``."""

    owners: TopicOwners | None

    def __init__(self, reader: MountReader, tier: Provider, prefix: str, mounts_dir: str,
                 store: MessageStore, pop: PopService, clock: Clock) -> None:
        self.reader = reader
        self.owners = None
        self._tier = tier
        self._prefix = prefix
        self._dir = mounts_dir
        self._store = store
        self._pop = pop
        self._clock = clock
        self._lock = threading.Lock()  # the mounted set and what the store, POP know of it

    def mount_all(self, names: str) -> None:
        """Mount the comma-separated brokers of ``tier.mounts``; one that cannot be
        mounted is logged and left out."""
        for name in filter(None, (n.strip() for n in names.split(","))):
            try:
                self.mount(name)
            except ChronomqError:
                log.exception("could not mount broker %s (tier.mounts); serving without it",
                              name)

    def mount(self, broker: str) -> list[str]:
        """Serve ``broker``'s topics read-only from the shared tier (``tiered.mount``);
        returns them.  Pop, Subscribe and group figures work on them with this broker's
        own checkpoints; sends are refused (``FailedPrecondition``)."""
        if broker == self._prefix:
            raise InvalidArgument(f"{broker} is this broker: its topics are served already")
        mounted = MountedBroker(self._tier, broker, os.path.join(self._dir, broker))
        departed_topics(self._tier, mounted)  # not the queues of topics it deleted
        with self._lock:
            topics = self.reader.mount(mounted, {t.name for t in self._store.topics.list()})
            self._set_mounted()
        if self.owners is not None:  # its topics are served here now: say so in the tier
            now = self._clock.now_ms()
            kept = [t for t in topics if not self.owners.take_over(t, broker, now)]
            if kept:
                log.warning("mounted %s, but topic(s) %s are owned by another broker",
                            broker, ", ".join(kept))
        log.info("mounted broker %s read-only: %d topic(s), %d message(s)", broker,
                 len(topics), mounted.messages())
        return topics

    def unmount(self, broker: str) -> list[str]:
        """Stop serving ``broker``'s topics; returns them (none: it was not mounted)."""
        with self._lock:
            topics = self.reader.unmount(broker)
            self._set_mounted()
        return topics

    def _set_mounted(self) -> None:
        """Tell the store the mounted topics' names and POP whether any are mounted."""
        mounts = self.reader.mounts()
        self._store.topics.set_mounted({t: n for m in mounts.values()
                                        for t, n in m.topics().items()})
        self._pop.tier = self.reader
        self._pop.mounts = self.reader if mounts else None

    def claim_topics(self, address: str, rocketmq_address: str = "") -> list[str]:
        """Turn on topic ownership in the shared tier (``tier.claim_topics``) for this
        broker at ``address``: claim every local topic, and take over the topics of the
        brokers mounted here; returns the ones another broker owns (served here only by
        this broker's clients; logged)."""
        self.owners = TopicOwners(self._tier, Owner(self._prefix, address,
                                                    rocketmq_address))
        now = self._clock.now_ms()
        elsewhere = [t.name for t in self._store.topics.list()
                     if is_name(t.name) and not self.owners.claim(t.name, now)]
        elsewhere += [t for name, m in self.reader.mounts().items() for t in m.topics()
                      if not self.owners.take_over(t, name, now)]
        for name in elsewhere:
            owner = self.owners.owner(name)
            log.warning("topic %s is owned by broker %s in the shared tier, not by this one "
                        "(%s): its clients may be sent elsewhere", name,
                        owner.broker if owner else "?", self._prefix)
        return elsewhere
