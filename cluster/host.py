"""What the coordination protocols use of the broker they run in: small Protocols.

The takeover (``cluster.takeover``), its lineage, adoption and hand-over, the timer
snapshots' wiring (``cluster.compaction``), the failover wiring (``cluster.failover``)
and the topic changes' (``cluster.topics``) run inside a broker, on its store, lease
book, timer and tier.  They depend on these Protocols, never on
``chronomq.broker.Broker``, which satisfies them structurally: the composition root
(``chronomq``) imports this room, this room imports the components below it (``pop``,
``timer``, ``recurring``, ``tiered``, ``store``), never the other way.

``HostConfig`` is the part of the broker's configuration they read; ``Host`` the parts
of the broker, each read-only here (a protocol changes the state of a part through its
own methods: ``PopService.adopt``, ``MessageStore.create_topic_at``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cluster.fence import Fence
from cluster.lease import BrokerLease
from cluster.ownership import TopicOwners
from pop.service import PopService
from recurring.engine import ScheduleEngine
from store.clock import Clock
from store.journal import StateJournal
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from tiered.config import TierConfig
from tiered.dispatcher import TieredDispatcher
from tiered.mount import MountReader
from tiered.provider import Provider
from tiered.timerflatfile import TimerFlatFiles
from timer.service import TimerService
from timer.store import TimerStore

if TYPE_CHECKING:
    from cluster.takeover import Takeover, TakeoverResult


class HostConfig(Protocol):
    """The settings the protocols read (``chronomq.config.BrokerConfig`` has them)."""

    @property
    def store(self) -> StoreConfig: ...

    @property
    def tier(self) -> TierConfig: ...

    def tier_local_dir(self) -> str: ...


class HostMounts(Protocol):
    """The broker's mounts and topic ownership (``chronomq.mounts.Mounts`` has them)."""

    @property
    def owners(self) -> TopicOwners | None: ...

    def unmount(self, broker: str) -> list[str]:
        """Stop serving ``broker``'s topics read-only."""


class Host(Protocol):
    """A broker, as the coordination protocols see it."""

    @property
    def config(self) -> HostConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def prefix(self) -> str:
        """This broker's tier prefix, lease and owner-record name."""

    @property
    def tier(self) -> Provider: ...

    @property
    def store(self) -> MessageStore: ...

    @property
    def pop(self) -> PopService: ...

    @property
    def timer(self) -> TimerService: ...

    @property
    def timer_store(self) -> TimerStore: ...

    @property
    def flat_files(self) -> TimerFlatFiles: ...

    @property
    def journal(self) -> StateJournal: ...

    @property
    def schedules(self) -> ScheduleEngine: ...

    @property
    def tiered(self) -> TieredDispatcher | None: ...

    @property
    def mount_reader(self) -> MountReader: ...

    @property
    def mounts(self) -> HostMounts: ...

    @property
    def fence(self) -> Fence: ...

    @property
    def lease(self) -> BrokerLease | None: ...

    @property
    def takeovers(self) -> Takeover: ...

    def takeover(self, broker: str, force: bool = False) -> TakeoverResult:
        """Take ``broker`` over (one at a time)."""

    def topics(self) -> list[Topic]:
        """This broker's own topics (not its system streams)."""

    def publish_topics(self) -> None:
        """Put the topic catalogue's copy in the tier."""

    def advertise(self, address: str, rocketmq_address: str) -> None:
        """Record the addresses clients reach this broker at in its lease."""
