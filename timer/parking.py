"""ParkingLot: far-future delayed messages between the CommitLog and their TimerFlatFiles.

A delayed message due beyond ``timer.rocks_horizon_ms`` is *parked*: the timer's dispatch
handler writes its whole record to RocksDB (``w`` key, with its ``f`` key) in the same
atomic write as the dispatch position, so the position never waits for the tier and a
crash never replays a record (a replay could undo a Cancel or Reschedule made since).
The lot mirrors the parked records in memory (bucket -> [(commit offset, record)]; read
from RocksDB once, on start) so that writing and preloading them never scan RocksDB,
whose deleted keys would make every scan slower.

- ``write`` (a scheduler job) moves parked records into their hour's TimerFlatFile
  object, then deletes their ``w`` keys;
- ``preload`` (a scheduler job) moves every bucket that starts within
  ``preload_ahead_ms`` (its parked records and its objects) into the timer store with
  one synced write, then deletes exactly the objects it read.  An object's entry is
  loaded only while its ``f`` key still names it, and that key goes in the same write,
  so a crash before the objects are deleted never loads (and delivers) a message twice;
- ``unpark`` moves the messages with one id into the timer store for Cancel /
  Reschedule;
- ``adopt`` schedules a takeover's batch (``cluster.adoption``): far ones get an ``f``
  key only (their record stays in a TimerFlatFile object the tier holds already, another
  broker's read as this one's, or goes first into a new one), near ones go into RocksDB.

An entry is loaded at the due time its ``f`` key holds, and only by the preload of that
time's bucket: an adopted object may hold a stale copy of a message its first broker
rescheduled into another hour (the copy that counts is in that hour's objects).

Thread-safety: ``lock`` is the TimerService's lock (routing and the mirror change under
it); ``flat_lock`` orders the TimerFlatFile steps and is always taken before ``lock``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, NamedTuple

from store.clock import Clock
from store.crashpoint import crashpoint
from store.errors import ChronomqError
from store.message import decode_dispatch_infos
from tiered.timerflatfile import TimerFlatFiles, placed
from timer.store import TimerStore, parked_key, timer_key

if TYPE_CHECKING:
    from timer.model import TimerConfig

log = logging.getLogger(__name__)

Parked = tuple[int, tuple[str, int, int, bytes]]  # (bucket, (id, due, offset, record))
Adopted = tuple[bytes, int, int, bytes]  # (id as ASCII, due, adopted offset, record)


class AdoptedBatch(NamedTuple):
    """Where ``ParkingLot.adopt`` scheduled a batch."""

    rocksdb: int  # near: ``t`` and ``i`` keys with their records
    in_place: int  # far, their records in an object the tier held already
    written: int  # far, their records written into new TimerFlatFile objects


class ParkingLot:
    def __init__(self, timers: TimerStore, flat: TimerFlatFiles, config: TimerConfig,
                 clock: Clock, lock: threading.Lock,
                 admit: Callable[[list[tuple[bytes, int]]], None]) -> None:
        self._timers = timers
        self._flat = flat
        self.config = config
        self._clock = clock
        self._lock = lock
        self._admit = admit  # hands newly stored timer entries to the wheel
        self.flat_lock = threading.Lock()
        self.preloaded_until_ms = -1  # buckets starting at or before this are preloaded
        self._parking: dict[int, list[tuple[int, bytes]]] = {}
        self._parked = self._parked_bytes = 0
        self._parked_since_ms = clock.monotonic_ms()

    def open(self) -> None:
        """Take back what a previous run parked and had not written to its TimerFlatFile
        (the ``w`` keys): it is written soon."""
        for bucket, offset, record in self._timers.parked():
            self._parking.setdefault(bucket, []).append((offset, record))
        self._parked = sum(len(v) for v in self._parking.values())
        self._parked_bytes = self.config.flat_batch_bytes if self._parked else 0

    @property
    def unwritten(self) -> int:
        """Parked messages not yet in a TimerFlatFile object."""
        return self._parked

    def parks(self, deliver_at_ms: int, horizon_ms: int) -> int | None:
        """The bucket a message due at ``deliver_at_ms`` is parked in, or None when it goes
        straight to the timer store.  The caller holds ``lock``."""
        bucket = self._flat.bucket_of(deliver_at_ms)
        if deliver_at_ms >= horizon_ms and bucket > self.preloaded_until_ms:
            return bucket
        return None

    def held(self, message_id: str) -> list[tuple[int, int, bytes]]:
        """``(due, offset, record)`` of the parked messages with this id not yet written
        to a TimerFlatFile (read from the mirror; those in objects are not read here).
        The caller holds ``lock``."""
        out = []
        for (due, offset), _ in self._timers.locate_parked(message_id):
            held = self._parking.get(self._flat.bucket_of(due), [])
            out += [(due, offset, record) for off, record in held if off == offset]
        return out

    def mirror(self, parked: list[Parked]) -> None:
        """Records the caller just parked in RocksDB.  The caller holds ``lock``."""
        if not self._parked:
            self._parked_since_ms = self._clock.monotonic_ms()
        for bucket, e in parked:
            self._parking.setdefault(bucket, []).append((e[2], e[3]))
        self._parked += len(parked)
        self._parked_bytes += sum(len(e[3]) for _, e in parked)

    def write(self, force: bool = False) -> int:
        """Write parked records to their TimerFlatFiles once they are ``flat_batch_bytes``
        or ``flat_batch_ms`` old (all of them when ``force``), then drop their ``w`` keys;
        a bucket already preloaded goes straight into the timer store.  Skipped while a
        preload holds the TimerFlatFiles (unless ``force``).  Returns the records written;
        a failed write leaves them parked for the next round."""
        with self._lock:
            old = self._clock.monotonic_ms() - self._parked_since_ms >= self.config.flat_batch_ms
            if not self._parked or not (
                    force or old or self._parked_bytes >= self.config.flat_batch_bytes):
                return 0
        if not self.flat_lock.acquire(blocking=force):
            return 0
        try:
            with self._lock:
                by_bucket, self._parking = self._parking, {}
                self._parked = self._parked_bytes = 0
            written = 0
            for bucket, records in sorted(by_bucket.items()):
                if bucket <= self.preloaded_until_ms:
                    written += self._preload_bucket(bucket, records)
                    continue
                try:
                    self._flat.append(bucket, records)
                except ChronomqError as exc:
                    log.warning("writing a TimerFlatFile failed, will retry: %s", exc)
                    with self._lock:
                        self._parking.setdefault(bucket, []).extend(records)
                        self._parked += len(records)
                        self._parked_bytes += sum(len(r) for _, r in records)
                    continue
                crashpoint("timer.after_flat_write")
                self._timers.kv.write(deletes=[parked_key(bucket, o) for o, _ in records])
                written += len(records)
            return written
        finally:
            self.flat_lock.release()

    def preload(self, now_ms: int) -> int:
        """Move every TimerFlatFile bucket that starts within ``preload_ahead_ms`` into
        RocksDB, then delete it.  Restartable at any point: RocksDB writes are keyed by due
        time and offset, and a bucket is deleted only after a synced write of its entries.
        Returns the number of entries moved."""
        limit = now_ms + self.config.preload_ahead_ms
        limit -= limit % self.config.bucket_ms
        moved = 0
        with self.flat_lock:
            with self._lock:
                # from here on, messages for these buckets go straight to RocksDB
                self.preloaded_until_ms = max(self.preloaded_until_ms, limit)
                held = {b: self._parking.pop(b) for b in list(self._parking) if b <= limit}
                for records in held.values():
                    self._parked -= len(records)
                    self._parked_bytes -= sum(len(r) for _, r in records)
            for bucket in sorted(set(self._flat.buckets_until(limit)) | set(held)):
                moved += self._preload_bucket(bucket, held.get(bucket, []))
        return moved

    def _preload_bucket(self, bucket: int, parked: list[tuple[int, bytes]]) -> int:
        """Move one bucket (its ``parked`` records and its objects) into the timer store,
        then delete those.  The caller holds ``flat_lock``."""
        entries: dict[int, tuple[str, int, int, bytes]] = {}
        unparked: list[bytes] = []
        for offset, record in parked:
            info = decode_dispatch_infos(record, 0)[0][0]
            entries[offset] = (info.message_id, info.deliver_at_ms, offset, record)
            unparked.append(parked_key(bucket, offset))
        # exactly these objects are read and then deleted: one written meanwhile stays
        # for the next preload (deleting it unread lost its messages)
        paths = self._flat.objects(bucket)
        for offset, record in self._flat.read_bucket(bucket, paths):
            info = decode_dispatch_infos(record, 0)[0][0]
            entries[offset] = (info.message_id, info.deliver_at_ms, offset, record)
        chosen = list(entries.values())
        # only an entry whose ``f`` key still names it is loaded: that key goes in the same
        # synced write as the entry, so one preloaded before a crash (and maybe delivered
        # since) or cancelled meanwhile is not loaded twice.  It is loaded at the due time
        # its ``f`` key holds, and only in that time's bucket: an adopted object may hold
        # a copy its broker rescheduled elsewhere (``adopt``)
        marked = [(e, mark) for e, mark in zip(
            chosen, self._timers.parked_marks([(e[0], e[2]) for e in chosen]), strict=True)
            if mark is not None and self._flat.bucket_of(mark[1]) == bucket]
        keep = [(e[0], due, e[2], e[3]) for e, (_, due) in marked]
        deletes = [key for _, (key, _) in marked] + unparked
        self._timers.add(keep, None, deletes=deletes, sync=True)
        crashpoint("timer.after_preload")
        self._flat.drop_bucket(bucket, paths)
        crashpoint("timer.after_bucket_delete")
        if paths:  # an adopted prefix emptied: forgotten (read before the objects held:
            remembered = self._timers.adopted_prefixes()  # one adopted meanwhile holds
            live = self._flat.foreign_prefixes()  # its objects before it is remembered)
            self._timers.remove_adopted_prefixes([p for p in remembered if p not in live])
        self._admit([(timer_key(due, off), due) for _, due, off, _ in keep])
        return len(keep)

    def adopt(self, batch: list[Adopted], in_place: Container[int], broker: str,
              adopted: int, sync: bool = False) -> AdoptedBatch:
        """Schedule a takeover's batch of messages taken over (adopted offsets), in one
        atomic write of the timer store with ``adopted``, how many of ``broker``'s are
        scheduled with it.  One due beyond the horizon, in a bucket not yet preloaded, gets
        an ``f`` key: its record stays in the TimerFlatFile object of its bucket that holds
        it (``in_place``: ``placed`` of each entry), or is written first into a new object
        of its bucket.  Any other goes into RocksDB (``t`` and ``i`` keys).  Under
        ``flat_lock``: a preload either ran before (the bucket counts as near) or finds
        the ``f`` keys."""
        near: list[Adopted] = []
        marks: list[tuple[bytes, int, int]] = []
        fresh: dict[int, list[tuple[int, bytes]]] = {}
        with self.flat_lock:
            horizon = self._clock.now_ms() + self.config.rocks_horizon_ms
            until, bucket_ms = self.preloaded_until_ms, self._flat.bucket_ms
            for e in batch:
                mid, due, offset, record = e
                bucket = due - due % bucket_ms
                if due < horizon or bucket <= until:
                    near.append(e)
                    continue
                marks.append((mid, due, offset))
                if placed(offset, bucket) not in in_place:
                    fresh.setdefault(bucket, []).append((offset, record))
            for bucket, records in sorted(fresh.items()):
                self._flat.append(bucket, records)
                crashpoint("timer.after_flat_write")
            self._timers.adopt(near, marks, broker, adopted, sync)
            crashpoint("timer.after_add")
        self._admit([(timer_key(due, off), due) for _, due, off, _ in near])
        written = sum(len(v) for v in fresh.values())
        return AdoptedBatch(len(near), len(marks) - written, written)

    def adopt_flat_files(self, prefix: str) -> dict[str, int]:
        """Read another broker's TimerFlatFiles (``<broker>/timer``) as this one's, at
        every start too (``TimerService.open``); returns its objects and their buckets.
        A prefix that holds objects is remembered until the preload has read and deleted
        them all (``_preload_bucket``), one without objects is not: a takeover (or a
        start) lists only the prefixes still holding pending messages, not every broker
        of a chain of takeovers."""
        found = self._flat.adopt(prefix)
        if found:
            self._timers.add_adopted_prefix(prefix)
        return found

    def adopted(self, broker: str) -> int:
        """How many of ``broker``'s pending messages ``adopt`` scheduled so far."""
        return self._timers.adopted(broker)

    def unpark(self, message_id: str) -> int:
        """Move every parked message with this id into RocksDB (still parked, or from its
        bucket's objects, whose copy is then skipped by the preload: no ``f`` key); returns
        how many.  The caller holds ``flat_lock`` and ``lock``."""
        moved = 0
        in_objects: dict[int, list[tuple[int, int, bytes]]] = {}  # bucket -> (due, off, f)
        for (due, offset), mark in self._timers.locate_parked(message_id):
            bucket = self._flat.bucket_of(due)
            held = self._parking.get(bucket, [])
            mine = next((e for e in held if e[0] == offset), None)
            if mine is None:
                in_objects.setdefault(bucket, []).append((due, offset, mark))
                continue
            # not yet in an object: one atomic move
            held.remove(mine)
            self._parked -= 1
            self._parked_bytes -= len(mine[1])
            self._timers.add([(message_id, due, offset, mine[1])], None,
                             deletes=[parked_key(bucket, offset), mark], sync=True)
            moved += 1
        for bucket, wanted in in_objects.items():
            offsets = {off for _, off, _ in wanted}
            records = {o: r for o, r in self._flat.read_bucket(bucket) if o in offsets}
            found = [(due, off, mark) for due, off, mark in wanted if off in records]
            if not found:
                continue
            # its objects stay until the bucket is preloaded: without the ``f`` keys, the
            # preload skips these records
            self._timers.add([(message_id, due, off, records[off]) for due, off, _ in found],
                             None, deletes=[mark for _, _, mark in found], sync=True)
            moved += len(found)
        return moved
