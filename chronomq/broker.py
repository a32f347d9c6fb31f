"""Broker: the core object the gRPC fronts call.  Wiring only: it builds, opens and runs
the store, POP, the timer and the tier; the rules are in the parts it exposes (sends in
``chronomq.sending``, queries in ``chronomq.queries``, mounts and topic ownership in
``chronomq.mounts``, topic changes in ``cluster.topics``, the tier's parts in
``chronomq.tierparts``).  No gRPC here.  Thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from access.backends import FileBackend, TierBackend
from access.directory import UserDirectory
from access.principals import Authenticator
from chronomq.config import BrokerConfig
from chronomq.dedupe import SendDedupe
from chronomq.mounts import Mounts
from chronomq.providers import make_lease_provider, make_provider
from chronomq.queries import Queries
from chronomq.recurrence import open_schedules
from chronomq.sending import Sender
from chronomq.tierparts import open_tier_upload
from cluster.compaction import attach_compaction
from cluster.failover import hold_lease, start_failover
from cluster.fence import Fence
from cluster.handover import adopted_delayed_ends, publish_secret
from cluster.layout import broker_prefix
from cluster.lease import BrokerLease
from cluster.leasewatch import LeaseWatch
from cluster.rejoin import Rejoin
from cluster.takeover import Takeover, TakeoverResult
from cluster.timersnapshot import TimerCompactor
from cluster.topics import broker_topic_changes
from pop.checkpoint import WRITE_BUFFER_BYTES as POP_WRITE_BUFFER_BYTES
from pop.leasejournal import Snapshots
from pop.receipts import load_or_create_secret
from pop.service import PopService
from store.clock import Clock
from store.disk import DiskGuard, unless_full
from store.errors import TopicNotFound
from store.journal import StateJournal
from store.kv import KV
from store.message import DispatchInfo
from store.names import SYSTEM_STREAMS, is_system_stream
from store.store import MessageStore
from store.topics import Topic
from tiered.dispatcher import TieredDispatcher
from tiered.mount import MountReader
from tiered.provider import Provider
from tiered.reader import TieredReader
from tiered.timerflatfile import TimerFlatFiles
from timer.service import TimerService
from timer.store import TimerStore

log = logging.getLogger(__name__)

T = TypeVar("T")


class Broker:
    """The composition root of one broker: builds the store, the timer, POP and the tier
    from the configuration (no I/O), opens them in ``open`` (the one place a start touches
    the disk and the tier: a step that fails closes what was opened and raises), runs their
    threads in ``start``.  The fronts (gRPC API, RocketMQ front, console) call only this
    and its parts (``sender``, ``queries``, ``mounts``).
    """

    store: MessageStore
    tier: Provider
    flat_files: TimerFlatFiles
    pop: PopService
    timer: TimerService
    disk: DiskGuard
    journal: StateJournal
    dedupe: SendDedupe
    access: Authenticator  # who a call's credentials name (the fronts enforce it)
    _pop_kv: KV
    _timer_store: TimerStore

    def __init__(self, config: BrokerConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.tiered: TieredDispatcher | None = None
        self.tier_reader: TieredReader | None = None
        self.mount_reader = MountReader(None)
        self._takeover_lock = threading.Lock()
        self._opened: list[tuple[str, Callable[[], None]]] = []  # what to close, in order
        self.takeovers = Takeover(self)
        self.lease: BrokerLease | None = None  # tier.upload: held from ``open`` on
        self.incarnation = 0  # of tier.broker_name, found with the lease (cluster.rejoin)
        self._rejoin: Rejoin | None = None  # how it was found; retries the start's requests
        self.snapshots: Snapshots | None = None  # tier.upload: the journal's snapshots
        self.compactor: TimerCompactor | None = None  # tier.upload: the timer's snapshots

    def open(self) -> None:
        """Open every part, recover and catch up; mount ``tier.mounts``.  A failure closes
        what was opened (in reverse) and raises the first error."""
        try:
            self._open()
        except BaseException:
            for what, close in reversed(self._opened):
                try:
                    close()
                except Exception:  # the first error is the one to report
                    log.exception("closing %s after a failed start", what)
            self._opened.clear()
            raise
        self.mounts.mount_all(self.config.tier.mounts)
        self.takeovers.restore()

    def take_over_at_start(self) -> None:
        """``tier.takeover``: take that broker over now (after ``start``: the takeover
        appends to the CommitLog), unless done before; and finish every takeover a crash
        cut short.  The setting is the operator's decision: no recency check."""
        name = self.config.tier.takeover
        done = self.takeovers.results.get(name)
        if name and (done is None or not done.done):
            self.takeover(name, force=True)
        for other, result in list(self.takeovers.results.items()):
            if not result.done:  # cut short by a crash (an automatic one too): finish it
                self.takeover(other, force=True)

    def start_failover(self, address: str, rocketmq_address: str) -> LeaseWatch:
        """``tier.failover``: hold this broker's lease (``cluster.failover``)."""
        return start_failover(self, address, rocketmq_address)

    def takeover(self, broker: str, force: bool = False) -> TakeoverResult:
        """Become the owner of a departed broker's topics, positions and pending
        delayed messages (``cluster.takeover``)."""
        with self._takeover_lock:
            return self.takeovers.run(broker, force)

    def _open(self) -> None:
        config, clock, sc = self.config, self.clock, self.config.store
        os.makedirs(sc.data_dir, exist_ok=True)
        self.disk = DiskGuard(sc.data_dir, clock, sc.disk_max_used_ratio, sc.disk_clean_ratio,
                              sc.disk_reserve_bytes)
        self.disk.release_if_short()  # before RocksDB and the CommitLog open
        self.tier = make_provider(config)
        if config.tier.upload:  # before anything is opened, written or served
            self._hold_lease()
        self._open_access()
        self.flat_files = TimerFlatFiles(self.tier, config.timer.bucket_ms,
                                         prefix=f"{self.prefix}/timer")
        self.store = MessageStore(sc, clock)
        self.store.set_topic_creator(self.create_topic)  # auto-created topics are claimed
        self.dedupe = SendDedupe(self.store, sc.dedupe_window_ms, self.takeovers.ids)
        self.takeovers.ids.delayed_ends = partial(  # (kept by cluster.lineage)
            adopted_delayed_ends, os.path.join(sc.data_dir, "takeovers"))
        self._opened.append(("the store", self.store.close))  # not opened: writes nothing
        self._pop_kv = KV(os.path.join(sc.data_dir, "pop"),
                          write_buffer_bytes=POP_WRITE_BUFFER_BYTES)
        self._opened.append(("the POP database", self._pop_kv.close))
        secret_path = config.pop.secret_file or os.path.join(sc.data_dir, "pop-secret")
        secret = load_or_create_secret(secret_path)
        if config.tier.upload:  # before any handle is given: a successor accepts them
            self.start_retry("publishing its receipt-handle secret",
                              lambda: publish_secret(self.tier, self.prefix, secret))
        self.pop = PopService(self.store, self._pop_kv, secret,
                              clock, config.pop.max_messages_cap, config.retry_policy(),
                              config.groups, config.key_limits)
        self._timer_store = TimerStore(os.path.join(sc.data_dir, "timer"))
        self._opened.append(("the timer database", self._timer_store.close))
        self.schedules = open_schedules(self)  # recurring schedules (chronomq.recurrence)
        self.timer = TimerService(self.store, self._timer_store, self.flat_files,
                                  config.timer, clock)
        self.timer.open()
        # the store's readers, all registered here before it opens (it rewinds them)
        self.store.add_dispatch_handler(self.timer)
        self.store.add_delayed_witness(self.timer.holds)  # pending ones are found by id
        self.store.add_dispatch_handler(self.pop.copies)
        self.fence = Fence(self.lease)  # the gate of every OK (cluster.fence)
        if config.tier.upload:  # (with the tier's durable position)
            parts = open_tier_upload(self.store, self.tier, self.prefix, config, self.lease,
                                     clock)
            self.tiered, self.fence, self.tier_reader = parts.tiered, parts.fence, parts.reader
            if parts.mount_reader is not None:  # Pop reads this broker's tier (and mounts)
                self.mount_reader = self.pop.tier = parts.mount_reader
        self.store.open()
        if self.tiered is not None:  # reuses the records the store's dispatcher decoded
            self.add_dispatch_listener(self.tiered.offer)
            for stream in SYSTEM_STREAMS:  # the timer's pending set and the journal
                self.store.create_topic(Topic(stream, 1), system=True)
        self.journal = StateJournal(self.store, self.tiered, self.config.tier.durable_ack,
                                    self.fence)
        if self.lease is not None:
            self.lease.load = lambda: len(self.topics())
        self.timer.set_journal(self.journal)
        self.sender = Sender(self.store, self.disk, self.dedupe, self.journal, self.tiered,
                             self.timer, config.timer.enabled)
        self.queries = Queries(self.store, self.tier_reader, self.mount_reader, self.timer)
        self.mounts = Mounts(self.mount_reader, self.tier, self.prefix,
                             os.path.join(sc.data_dir, "mounts"), self.store, self.pop, clock)
        self.topic_changes = broker_topic_changes(self, self._forget_topics)
        self.start_retry("writing its topic catalogue's copy", self.topic_changes.open)

    def _forget_topics(self, names: set[str]) -> None:
        """What this broker keeps of deleted topics: group positions, leases and retry
        topics (``PopService.forget_topics``), the client-chosen ids they accepted."""
        self.pop.forget_topics(names)
        self.dedupe.forget_topics(names)

    def _open_access(self) -> None:
        """The users (``access.directory``): one object in the bucket when brokers share
        it (``tier.upload``, ``tier.claim_topics`` or ``tier.mounts``), else a file of the
        data directory; read before anything is served."""
        t = self.config.tier
        users = UserDirectory(TierBackend(self.tier) if t.upload or t.claim_topics or t.mounts
                              else FileBackend(self.config.store.data_dir), self.clock.now_ms)
        self.start_retry("reading its users", users.load)
        self.access = Authenticator(users, self.config.server.auth_token)

    def _hold_lease(self) -> None:
        """This broker's lease, before the store opens, and the incarnation it is of
        (``cluster.failover``)."""
        self.lease, rejoin = hold_lease(
            self.config, make_lease_provider(self.config, self.tier), self.clock)
        self.incarnation, self._rejoin = self.lease.incarnation, rejoin
        self._opened.append(("the lease", self.lease.stop))

    @property
    def prefix(self) -> str:
        """This broker's tier prefix, lease and owner-record name: its incarnation's
        (``cluster.layout.broker_prefix``)."""
        return broker_prefix(self.config.tier.broker_name, self.incarnation)

    def start_retry(self, what: str, request: Callable[[], T]) -> T:
        """A tier request of the start, retried within ``tier.start_timeout_s`` (without
        a lease: asked once)."""
        return request() if self._rejoin is None else self._rejoin.retry(what, request)

    def advertise(self, address: str, rocketmq_address: str) -> None:
        """Record the addresses clients reach this broker at in its lease (after the
        ports are bound; ``cluster.lease.successor`` sends clients of a broker taken over
        to them)."""
        if self.lease is not None:
            self.lease.address, self.lease.rocketmq_address = address, rocketmq_address
            self.lease.renew()

    def start(self, timer_thread: bool = True) -> None:
        """Start the store's threads and (unless driven by hand, as tests with a manual
        clock do) the timer's and the revive thread."""
        self.store.start()
        started = self.pop.set_journal(self.journal)  # its snapshot goes through the log
        if self.tiered is not None:
            self.snapshots = self.pop.journal_snapshots(
                self.journal, self.config.tier.journal_snapshot_records,
                self.tiered.durable_position, self.tiered.publish,
                self.prefix, self.config.tier.journal_snapshot_s,
                self.clock.monotonic_ms)
            self.snapshots.started(started)
            self.compactor = attach_compaction(self)
        if self.tiered is not None and timer_thread:
            self.tiered.start()
        if timer_thread:
            self.timer.start()
            self.pop.start()
            self.schedules.start()

    def stop(self) -> None:
        """Stop and flush everything.  On a full volume the reserve file makes room first,
        and a step that still cannot write is logged and skipped (``unless_full``)."""
        self.disk.refresh(force=True)
        unless_full(self.schedules.stop, "stopping the schedules")  # these three append to
        unless_full(self.pop.stop, "stopping POP")  # the CommitLog: first
        unless_full(self.timer.stop, "stopping the timer")
        if self.tiered is not None:
            unless_full(self.tiered.stop, "stopping the tier upload")
        self.store.stop()
        unless_full(self.timer.flush, "the timer's dispatch position")
        self._timer_store.close()
        self._pop_kv.close()
        if self.lease is not None:
            self.lease.stop()

    def add_dispatch_listener(self, listener: Callable[[list[DispatchInfo]], None]) -> None:
        """Call ``listener`` with every batch of records the store's dispatcher has made
        visible (after ``open``): long polls wake on it."""
        assert self.store.dispatcher is not None, "open() first"
        self.store.dispatcher.add_listener(listener)

    @property
    def timer_store(self) -> TimerStore:
        """The RocksDB timer store (read by diagnostics and tests)."""
        return self._timer_store

    def databases(self) -> dict[str, KV]:
        """The broker's RocksDB databases by name (memory diagnostics)."""
        return {"index": self.store.index.kv, "pop": self._pop_kv,
                "timer": self._timer_store.kv}

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: Topic) -> tuple[Topic, bool]:
        """Create ``topic`` here; with ``tier.claim_topics`` only once this broker owns it
        in the shared tier (``FailedPrecondition`` naming the owner when another does);
        returns once durable, in the tier's copy, and past the fence (``cluster.topics``)."""
        return self.topic_changes.create(topic)

    def publish_topics(self) -> None:
        """With ``tier.upload``: returns once the topic catalogue's copy in the tier,
        ``<broker>/topics.json`` (``cluster.catalogue``), names every topic made here (a
        broker taking this one over takes them)."""
        self.topic_changes.publish()

    def topics(self) -> list[Topic]:
        """This broker's own topics (mounted ones: ``mount_reader``; its system streams
        are not topics to its users)."""
        return [t for t in self.store.topics.list() if not is_system_stream(t.name)]

    def topic(self, name: str) -> Topic | None:
        """The topic called ``name``: this broker's own, else a mounted one, else None."""
        return self.store.topics.get(name) or self.store.topics.mounted(name)

    def topic_or_create(self, name: str) -> Topic:
        """``topic(name)``, else a new one with the default queue count when
        ``store.auto_create_topics`` is on (claimed like any other), else
        ``TopicNotFound``."""
        found = self.topic(name)
        if found is not None:
            return found
        if not self.config.store.auto_create_topics:
            raise TopicNotFound(name)
        return self.create_topic(Topic(name, self.config.store.default_queue_count))[0]

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` and what this broker keeps of it; returns once that is
        durable, in the tier's copy, and past the fence (``cluster.topics``)."""
        self.topic_changes.delete(name)

    def run_retention(self) -> None:
        """Local retention, then the tier's."""
        freed = self.store.run_retention()
        if freed:
            log.info("retention deleted %d bytes of commitlog", freed)
        if self.tiered is not None:
            self.tiered.run_retention()

    def watch_disk(self) -> None:
        """The disk job (every second): read the volume's use; above the clean watermark,
        run retention now."""
        if self.disk.should_clean():
            log.warning("the data volume of %s is %.1f%% used: running retention now",
                        self.config.store.data_dir, self.disk.refresh().used_ratio * 100)
            self.run_retention()
