"""CreateTopic and DeleteTopic through the fence (docs/DESIGN.md, "Durability contract").

Each answers OK only once its change is durable here (the topic log's fsync), then, with
``tier.upload``, in the tier (the catalogue's copy names it: ``cluster.catalogue``), and
only then passes the fence: with ``tier.durable_ack`` a conditional write of the lease
(``DurablePosition.confirm``, the bucket's fence of every commit: a successor's claim
came after it, so the successor reads the copy), then the lease's check.  A broker
taken over answers no OK for a topic change.

The steps, each a crash point (``store.crashpoint``), and what a successor finds when
the broker dies after it:

=========================  ==========================================================
label                      after what, and what a successor finds
=========================  ==========================================================
``topic.after_claim``      create: the owner record claimed; no topic, the record
                           released (``TopicOwners.release_departed``)
``topic.after_create``     create: the topic log fsynced; no topic (unless a send to
                           it went up: its queue is live), the record released
``topic.after_catalogue``  create: the copy names it; the topic, owned by the successor.
                           delete: the copy names the deletion; no topic, its queues in
                           the tier not served
``topic.after_delete``     delete: the topic log fsynced; the topic with its positions
                           (the delete never answered)
``topic.after_forget``     delete: positions and retry topics dropped; no topic
=========================  ==========================================================

Positions are dropped only after the copy says the topic is deleted: dropped first (they
are journaled), a successor would take the topic from the older copy with no positions,
and its acked messages would come again.  A broker that restarts instead finishes a
delete cut short (``CatalogueCopy.open``: the positions of every name deleted and absent
here are dropped).  Its owner record goes last, by a conditional delete
(``TopicOwners.release``); a successor releases the records of topics it does not take
(``TopicOwners.release_departed``).

Thread-safe (each step is; two changes of one name are ordered by the store).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.catalogue import CatalogueCopy
from cluster.ownership import TopicOwners
from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import FailedPrecondition
from store.names import check_name
from store.store import MessageStore
from store.topics import Topic

if TYPE_CHECKING:
    from cluster.host import Host


class TopicChanges:
    """CreateTopic and DeleteTopic of one broker (see the module docstring).

    ``forget(names)`` drops what the broker keeps of deleted topics (group positions,
    leases, retry topics); ``check()`` is the lease's check (raises while no OK may be
    given); ``confirm`` the bucket's fence (``Fence.confirm``; None: none, no
    ``tier.durable_ack``); ``owners()`` the topic owners (None: no ``tier.claim_topics``);
    ``catalogue`` the copy in the tier (None: no ``tier.upload``); ``renew(name)``
    makes sure nothing older is served under a name about to be created (a topic of
    that name taken over, then deleted: ``Takeover.forget_topic``)."""

    def __init__(self, store: MessageStore, clock: Clock, forget: Callable[[set[str]], None],
                 check: Callable[[], None], owners: Callable[[], TopicOwners | None],
                 catalogue: CatalogueCopy | None = None,
                 confirm: Callable[[], None] | None = None,
                 renew: Callable[[str], None] = lambda _: None) -> None:
        self._store, self._clock, self._forget = store, clock, forget
        self._check, self._owners, self._renew = check, owners, renew
        self.catalogue, self._confirm = catalogue, confirm

    def open(self) -> None:
        """At start, once the store is open: the copy's deletions, a delete cut short
        finished (``CatalogueCopy.open``), and the copy written."""
        if self.catalogue is None:
            return
        gone = self.catalogue.open()
        self.catalogue.publish()  # first: a successor must not take them without positions
        if gone:
            self._forget(set(gone))

    def create(self, topic: Topic) -> tuple[Topic, bool]:
        """Create ``topic`` (with owners: once this broker owns it in the shared tier,
        else ``FailedPrecondition`` naming the owner); True when it was created."""
        self._check()  # a broker taken over claims nothing
        store = self._store
        if store.topics.mounted(topic.name) is not None:
            raise FailedPrecondition(f"topic {topic.name!r} is mounted read-only from "
                                     "another broker's tier: unmount it first")
        owners = self._owners()
        if owners is not None:
            check_name(topic.name)
            if store.topics.get(topic.name) is None and \
                    not owners.claim(topic.name, self._clock.now_ms()):
                owner = owners.owner(topic.name)
                where = f"broker {owner.broker} at {owner.address}" if owner else \
                    "another broker"
                raise FailedPrecondition(f"topic {topic.name!r} is owned by {where} "
                                         "(recorded in the shared tier): send and consume "
                                         "there")
            crashpoint("topic.after_claim")
        if store.topics.get(topic.name) is None:
            self._renew(topic.name)
        created = store.create_topic(topic)
        crashpoint("topic.after_create")
        self._publish()
        self._fence()
        return created

    def delete(self, name: str) -> None:
        """Delete topic ``name`` and what the broker keeps of it; release its owner."""
        self._check()
        self._store.delete_topic(name)  # sends to it are refused from here on
        crashpoint("topic.after_delete")
        if self.catalogue is not None:
            self.catalogue.deleted([name])
        self._publish()
        self._forget({name})
        crashpoint("topic.after_forget")
        self._fence()
        owners = self._owners()
        if owners is not None:
            owners.release(name)

    def publish(self) -> None:
        """The copy in the tier, naming every topic made here so far (a takeover's)."""
        if self.catalogue is not None:
            self.catalogue.publish()

    def _publish(self) -> None:
        if self.catalogue is not None:
            self.catalogue.publish()
            crashpoint("topic.after_catalogue")

    def _fence(self) -> None:
        if self._confirm is not None:
            self._confirm()
        self._check()


def broker_topic_changes(broker: Host, forget: Callable[[set[str]], None]) -> TopicChanges:
    """The broker's CreateTopic and DeleteTopic, through its lease check, its topic owners
    and its fence; with ``tier.upload`` each waits for the catalogue's copy in the tier.
    ``forget(names)`` drops what the broker keeps of deleted topics."""
    catalogue = confirm = None
    if broker.tiered is not None:
        durable = broker.tiered.durable
        catalogue = CatalogueCopy(
            broker.tier, broker.prefix, broker.topics,
            lambda: broker.store.commitlog.confirmed_offset, lambda: durable.fenced)
        if broker.journal.durable_ack:
            confirm = broker.fence.confirm  # (cluster.fence: group-committed)
    return TopicChanges(broker.store, broker.clock, forget, broker.journal.check,
                        lambda: broker.mounts.owners, catalogue, confirm,
                        broker.takeovers.forget_topic)
