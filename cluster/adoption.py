"""Adoption: a takeover schedules the departed broker's pending delayed messages here in
bulk, straight into this broker's timer, without appending them to its CommitLog.

What is pending at the departed broker is read from its tier as ``cluster.replay`` gives
it (its timer snapshot's parts, then its delayed stream past them, less what its timer
stream says was delivered, cancelled or moved).  Each message keeps an *adopted
offset* (``tiered.timerflatfile.adopted_offset``: its first broker's name and delayed-
stream queue offset) as its identity in this broker's timer store and journal, so
Cancel and Reschedule by id find it here, and its delivery, cancel or move is journaled
under that offset (``timer.service``).  In batches of ``BATCH`` (``ParkingLot.adopt``):

- due beyond ``timer.rocks_horizon_ms`` (in a bucket not yet preloaded): an ``f`` key
  only, when the departed broker's own TimerFlatFile object of that bucket holds the
  record (*in place*: its TimerFlatFiles are read as this broker's,
  ``ParkingLot.adopt_flat_files``, and its objects are read and deleted by this broker's
  preload), else the record is written once into a new TimerFlatFile object of this
  broker first;
- sooner: ``t`` and ``i`` keys in RocksDB with the record, handed to the wheel.

So the far future stays in the tier once, where it was, and the near future is one
RocksDB write per batch.

**The manifest** says where the adopted set comes from: the departed broker's name, the
timer snapshot pointer and the ends of its delayed and timer streams that were read, and
the manifests of what it had adopted itself (a tree, JSON, version 1)::

    {"version": 1, "broker": "a", "pointer": {...} | null, "delayed_end": 120,
     "timer_end": 8, "adopted": [<manifest>, ...]}

It is put in the tier (``<me>/takeovers/<departed>.json``, field ``timers``) and kept in
``<data>/takeovers/<departed>.json`` before the first batch is written.  A takeover of
this broker reads it: what this broker adopted is what the manifest names, less what
this broker's own journal says it delivered, cancelled or moved since (by adopted
offset), and it adopts those again under the same offsets.  Nothing of the adopted set
goes into this broker's delayed stream; once the takeover is done, this broker's next
timer snapshot folds the set into its parts under the adopted offsets and names the
manifest (its digest, ``manifest_digest``) as folded (``cluster.compaction``): from
then on a takeover of this broker reads the set there and no longer the tiers of the
brokers the manifest names (``brokers_of(flat=True)`` still names those whose
TimerFlatFiles hold objects: the pointer's ``flat_brokers``).
Messages found delivered (``_Delivered``) are journaled done here, so the fold leaves
them out.

Found by id: the adopted messages are in no CommitLog or key index here; QueryMessages
and the console find them by the timer's own id keys (``timer.lookup``), so adopting
writes nothing more for them.  By key, only once delivered.

No other machine's wall clock decides anything: a message a broker of the manifest may
have delivered is looked for by that broker's own latest store time
(``cluster.delivered``), and the leases adopted beside keep their remaining time
(``pop.leaseclock``).

**Crashes.**  Each batch is one atomic RocksDB write holding its keys and the count of
messages adopted so far (``!adopted/<broker>``); a TimerFlatFile object is written
before the batch that names it.  A run that resumes reads the manifest kept locally
(the same set, in the same order) and starts after that count: nothing is scheduled
twice, and a message delivered or cancelled since is not brought back.  The last batch
is synced.  A takeover an older release began (it appended messages to the CommitLog:
``timers_through``) is finished without appending again what it appended.

Thread-safety: runs on the takeover's thread; ``Takeover.run`` runs one at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from cluster.delivered import SLACK_MS, DeliveredCopies, Prefetch
from cluster.layout import chain_prefix
from cluster.replay import stream
from cluster.timersnapshot import Pointer, decode_pointer, read_part, read_residual
from pop.settle import LeaseEntry, lease_replaced_by
from store.errors import FailedPrecondition
from store.journal import JournalState
from store.message import FLAG_DELAYED, decode_record
from store.names import DELAYED_STREAM, TIMER_STREAM, is_name, split_broker_made
from store.topics import Topic
from tiered.errors import TierError
from tiered.mount import MountedBroker
from tiered.provider import Provider
from tiered.timerflatfile import (
    ADOPTED,
    MAX_ADOPTED_QUEUE_OFFSET,
    adopted_offset,
    origin_code,
    placed,
)
from timer.parking import Adopted, AdoptedBatch

if TYPE_CHECKING:
    from cluster.host import Host

log = logging.getLogger(__name__)

BATCH = 20_000  # pending messages scheduled per atomic write
LEGACY_WINDOW = 20_000  # an older release's appends not yet counted (4 batches of 5,000)
_FLAGS = struct.Struct(">H")  # record bytes 12-14
_DUE = struct.Struct(">Q")  # record bytes 40-48
_LENGTHS = struct.Struct(">BH")  # record bytes 52-55: id length, topic length
_ID_LEN, _ID_AT = 52, 67
_CHUNK = 5_000  # records of the delayed stream handed on at a time

Manifest = dict[str, Any]
Mount = Callable[[str], MountedBroker]


def manifest_of(tier: Provider, mounted: MountedBroker, journal: JournalState,
                adopted: list[Manifest] | None = None) -> Manifest:
    """The manifest of what a takeover of ``mounted`` adopts (module docstring), from the
    mount and the journal it replayed, and the manifests in its own takeover records
    (``adopted``, if the caller read them already)."""
    pointer = journal.timer_snapshot
    return {"version": 1, "broker": mounted.broker,
            "pointer": None if pointer is None else json.loads(pointer.encode()),
            "delayed_end": _end(mounted, DELAYED_STREAM),
            "timer_end": _end(mounted, TIMER_STREAM),
            "adopted": _adopted_by(tier, mounted.broker) if adopted is None else adopted}


def is_manifest(value: object) -> bool:
    return isinstance(value, dict) and value.get("version") == 1


def _end(mounted: MountedBroker, name: str) -> int:
    bounds = mounted.bounds(name, 0)
    return 0 if bounds is None else bounds[1]


def _adopted_by(tier: Provider, broker: str) -> list[Manifest]:
    """The manifests of what ``broker`` adopted in its own takeovers."""
    out = []
    for path in sorted(tier.list(chain_prefix(broker))):
        try:
            timers = json.loads(tier.read(path)).get("timers")
        except (TierError, ValueError, AttributeError) as exc:
            raise FailedPrecondition(f"the takeover record {path} is unreadable ({exc}): "
                                     "what it adopted cannot be read") from exc
        if is_manifest(timers):
            out.append(timers)
    return out


def manifest_digest(m: Manifest) -> str:
    """A manifest's identity: a timer snapshot names those it folded in by it."""
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()[:32]


def _pointer_of(m: Manifest) -> Pointer | None:
    raw = m["pointer"]
    pointer = None if raw is None else decode_pointer(json.dumps(raw).encode())
    if raw is not None and pointer is None:
        raise FailedPrecondition(f"the manifest of {m['broker']} names a damaged pointer")
    return pointer


def _children(m: Manifest, pointer: Pointer | None) -> list[Manifest]:
    """What the broker of ``m`` adopted and its timer snapshot does not hold yet."""
    folded = set(pointer.folded) if pointer is not None else set()
    return [c for c in m["adopted"] if not folded or manifest_digest(c) not in folded]


def brokers_of(m: Manifest, folded: bool = True, flat: bool = False) -> list[str]:
    """Every broker a manifest tree names, its root first; ``folded``: also those of
    the adoptions its timer snapshot holds (whose adopted offsets its parts may hold);
    ``flat``: of those, only the ones whose TimerFlatFiles its broker still read."""
    pointer = _pointer_of(m)
    held = [] if not folded or pointer is None else \
        pointer.flat() if flat else pointer.folded_brokers
    return [str(m["broker"]), *held,
            *(b for child in _children(m, pointer) for b in brokers_of(child, folded, flat))]


def pending(tier: Provider, m: Manifest, mount: Mount, journal: JournalState | None = None
            ) -> Iterator[list[Adopted]]:
    """``(message id, due ms, adopted offset, record)`` of every message pending in what
    ``m`` names, in chunks, in a fixed order: the broker's own (ascending queue offsets),
    then its adopted ones, depth first.  ``journal``: its timer journal replayed as ``m``
    says, if at hand.  (``JournalState.pending_due`` is inlined, and the id sliced out of
    the record here: a million messages pass.)"""
    mounted = mount(str(m["broker"]))
    if journal is None:
        journal = _timer_journal(tier, mounted, m)
    done, moved = journal.done, journal.moved
    pointer = _pointer_of(m)
    end = int(m["delayed_end"])
    adopted_offset(mounted.broker, max(end - 1, 0))  # raises if its offsets outgrow one
    base, at, id_len = adopted_offset(mounted.broker, 0), _ID_AT, _ID_LEN
    start = 0
    if pointer is not None:  # the snapshot's records: pending, due as of it (those of
        for path in pointer.parts:  # adoptions it folded in keep their adopted offsets)
            yield [(r[at:at + r[id_len]], moved.get(qo, due), qo if qo >= ADOPTED else base | qo,
                    r) for qo, due, r in read_part(tier, path) if qo not in done]
        start = pointer.delayed_from
    chunk: list[Adopted] = []
    for e in stream(mounted, DELAYED_STREAM, start):  # then the stream's, due as sent
        qo, r = e.queue_offset, e.record
        if qo >= end:
            break
        if _FLAGS.unpack_from(r, 12)[0] & FLAG_DELAYED and qo not in done:
            chunk.append((r[at:at + r[id_len]], moved.get(qo, _DUE.unpack_from(r, 40)[0]),
                          base | qo, r))
            if len(chunk) >= _CHUNK:
                yield chunk
                chunk = []
    yield chunk
    for child in _children(m, pointer):
        for got in pending(tier, child, mount):
            yield [(mid, moved.get(o, due), o, r) for mid, due, o, r in got if o not in done]


def _timer_journal(tier: Provider, mounted: MountedBroker, m: Manifest) -> JournalState:
    """The broker's timer journal as far as ``m`` read it: its snapshot's residual, then
    its timer stream up to ``timer_end``."""
    state = JournalState()
    raw = m["pointer"]
    start = 0
    if raw is not None:
        if raw.get("residual"):
            state.done, state.moved = read_residual(tier, str(raw["residual"]))
        start = int(raw["timer_from"])
    for e in stream(mounted, TIMER_STREAM, start):
        if e.queue_offset >= int(m["timer_end"]):
            break
        r = decode_record(e.record)
        state.apply(r.tag, r.body)
    return state


class Adoption:
    """Schedules one departed broker's pending messages here (module docstring)."""

    def __init__(self, broker: Host, departed: str, mount: Mount,
                 on_progress: Callable[[int], None], on_topic: Callable[[str], None],
                 ahead: Prefetch | None = None) -> None:
        self._b = broker
        self._ahead = ahead  # the departed broker's copies, read ahead
        self._departed = departed
        self._mount = mount
        self._on_progress = on_progress
        self._on_topic = on_topic
        self._topics: set[bytes] = set()  # topics known to exist here
        self.seconds_scanning = 0.0
        self.delivered = _Delivered(mount, [])
        self.placed = AdoptedBatch(0, 0, 0)  # where this run scheduled them
        self._skipped: Future[Any] | None = None  # the last journal record of those found
        self.journaled_through = 0  # delivered: this broker's timer stream holds it below

    def run(self, m: Manifest, journal: JournalState | None,
            legacy_through: int | None = None) -> int:
        """Schedule everything ``m`` names that is not yet (``ParkingLot.adopted``);
        returns how many messages are adopted in all (less those found delivered).
        ``legacy_through``: an older release began and appended the departed broker's
        own messages below this queue offset."""
        b, departed = self._b, self._departed
        self._check_codes(m)
        done = b.timer.parking.adopted(departed)  # the first ``done``: before a crash
        in_place = self._in_place(m)
        legacy = None if legacy_through is None else \
            _Legacy(b, adopted_offset(departed, 0), legacy_through)
        self.delivered = _Delivered(self._mount, brokers_of(m, folded=False), self._ahead)
        batch: list[Adopted] = []
        count = 0  # messages of the set passed so far
        for chunk in pending(b.tier, m, self._mount, journal):
            first, count = count, count + len(chunk)
            if count <= done:  # scheduled before a crash
                continue
            rows = chunk[max(done - first, 0):]  # one per message of the set
            self._topics_of(rows)
            while len(batch) + len(rows) >= BATCH:  # a full batch: up to its last message
                cut = BATCH - len(batch)
                batch += rows[:cut]
                rows = rows[cut:]
                self._adopt(legacy.fresh(batch) if legacy else batch, in_place,
                            count - len(rows))
                batch = []
            batch += rows
        self._adopt(legacy.fresh(batch) if legacy else batch, in_place, count, sync=True)
        if self._skipped is not None:  # journaled before the takeover is done
            infos = self._skipped.result()
            self._b.journal.wait_tier(infos)
            self.journaled_through = max(i.queue_offset for i in infos) + 1
        return count - self.delivered.skipped

    def _adopt(self, batch: list[Adopted], in_place: set[int], through: int,
               sync: bool = False) -> None:
        """Schedule ``batch``, which ends with the set's ``through``-th message."""
        fresh = self.delivered.fresh(batch)
        if len(fresh) < len(batch):  # delivered already: journaled done here, so that a
            kept = {r[2] for r in fresh}  # timer snapshot folding the set in leaves them
            self._skipped = self._b.journal.timer_done(
                [r[2] for r in batch if r[2] not in kept]) or self._skipped
        batch = fresh
        if replaced := self._leases_replaced(batch):  # before the copies are placed: a
            self._b.pop.settle_copies(replaced)  # resumed run places them, never revives
        placed_now = self._b.timer.parking.adopt(batch, in_place, self._departed, through,
                                                 sync)
        self.placed = AdoptedBatch(*(a + b for a, b in zip(self.placed, placed_now,
                                                           strict=True)))
        self._on_progress(through)

    @staticmethod
    def _leases_replaced(rows: list[Adopted]) -> list[tuple[str, LeaseEntry]]:
        """The lease entries that delayed retry copies among ``rows`` replace: the
        departed broker revived or released them, and its mark of the entry may not have
        reached the tier before it was lost; adopted open, they must not come twice."""
        found: list[tuple[str, LeaseEntry]] = []
        for _, _, _, r in rows:
            topic = _topic_of(r).decode()
            if split_broker_made(topic) is None:
                continue  # (a user topic's message: no lease to settle)
            entry = lease_replaced_by(r)
            if entry is not None:
                found.append((topic, entry))
        return found

    def _topics_of(self, rows: list[Adopted]) -> None:
        """Create the topics of these messages that do not exist here."""
        at = _ID_AT  # the topic follows the id; its length is bytes 53-55 (_topic_of)
        for topic in {r[at + len(mid):at + len(mid) + (r[53] << 8 | r[54])]
                      for mid, _, _, r in rows} - self._topics:
            self._topic(topic.decode())
            self._topics.add(topic)

    def _check_codes(self, m: Manifest) -> None:
        """Refuse when two brokers' names share an origin code (their adopted offsets
        could meet): never seen, but checked."""
        names = {*brokers_of(m), *(p.rsplit("/", 1)[0] for p in self._adopted_prefixes())}
        codes: dict[int, str] = {}
        for name in sorted(names):
            other = codes.setdefault(origin_code(name), name)
            if other != name:
                raise FailedPrecondition(
                    f"cannot adopt the delayed messages of {m['broker']}: brokers {other} and "
                    f"{name} share an origin code; take it over on another broker")

    def _adopted_prefixes(self) -> list[str]:
        return self._b.timer_store.adopted_prefixes()

    def _in_place(self, m: Manifest) -> set[int]:
        """Adopt the TimerFlatFiles of every broker ``m`` names; returns which messages
        (adopted offsets) their objects hold, in which buckets (``placed``)."""
        started = time.monotonic()
        flat, lot = self._b.flat_files, self._b.timer.parking
        found: set[int] = set()
        for name in dict.fromkeys(brokers_of(m, flat=True)):
            for path, bucket in lot.adopt_flat_files(f"{name}/timer").items():
                found.update(placed(offset, bucket) for offset in flat.offsets(path))
        self.seconds_scanning = time.monotonic() - started
        return found

    def _topic(self, topic: str) -> None:
        """Create a topic the departed broker had only delayed messages for."""
        b = self._b
        if b.store.topics.get(topic) is not None:
            return
        made = split_broker_made(topic) is not None  # a retry topic: 1 queue
        b.store.create_topic(Topic(topic, 1 if made else b.config.store.default_queue_count),
                             system=made)
        owners = b.mounts.owners
        if owners is not None and is_name(topic):
            owners.take_over(topic, self._departed, b.clock.now_ms())
        self._on_topic(topic)


class _Delivered:
    """Of the messages a broker of the manifest may have delivered (due by the latest
    time it stored anything in the tier, by its own clock: ``delivered_until_ms``; never
    this broker's clock), those it did deliver before it was gone, the copy in its topic
    queue in the tier but not the timer stream's record of it (``cluster.delivered``):
    the copy decides, they are not scheduled again."""

    def __init__(self, mount: Mount, brokers: list[str], ahead: Prefetch | None = None
                 ) -> None:
        self._mount = mount
        self._brokers = list(dict.fromkeys(brokers))
        self._copies: dict[str, DeliveredCopies | None] = {}
        if ahead is not None and ahead.broker in self._brokers:
            started = time.monotonic()
            copies = ahead.get()
            if copies is not None:
                self._copies[ahead.broker] = copies
            log.info("the delivered copies of %s read ahead, %.2f s waited for",
                     ahead.broker, time.monotonic() - started)
        self.skipped = 0
        started = time.monotonic()
        self._risk_ms = -1
        for name in self._brokers:
            copies = self._copies_of(name)
            if copies is not None:
                self._risk_ms = max(self._risk_ms, copies.delivered_until_ms)
        self.seconds = time.monotonic() - started  # spent looking for copies

    def fresh(self, rows: list[Adopted]) -> list[Adopted]:
        started = time.monotonic()
        wants: dict[str, int] = {}  # topic -> the earliest due time to look for
        for r in rows:
            if r[1] <= self._risk_ms:
                topic = _topic_of(r[3]).decode()
                wants[topic] = min(wants.get(topic, r[1]), r[1] - SLACK_MS)
        for name in self._brokers:  # every topic's queues at once, before the lookups
            copies = self._copies_of(name)
            if copies is not None and wants:
                copies.read_since(wants)
        out = [r for r in rows if r[1] > self._risk_ms or not self._delivered(r)]
        self.skipped += len(rows) - len(out)
        self.seconds += time.monotonic() - started
        return out

    def _copies_of(self, name: str) -> DeliveredCopies | None:
        if name not in self._copies:
            try:
                self._copies[name] = DeliveredCopies(self._mount(name))
            except FailedPrecondition:  # no queue of it in the tier: no copy either
                self._copies[name] = None
        return self._copies[name]

    def _delivered(self, row: Adopted) -> bool:
        topic = _topic_of(row[3]).decode()
        for name in self._brokers:
            copies = self._copies_of(name)
            if copies is not None and copies.has(topic, row[0], row[1]):
                return True
        return False


class _Legacy:
    """A takeover an older release began appended the departed broker's own pending
    messages to the CommitLog in queue-offset order up to ``through`` (its progress),
    and up to ``LEGACY_WINDOW`` more whose progress it had not saved: those are looked
    up by id."""

    def __init__(self, broker: Host, base: int, through: int) -> None:
        self._b = broker
        self._base, self._through = base, through
        self._window = LEGACY_WINDOW

    def fresh(self, rows: list[Adopted]) -> list[Adopted]:
        """``rows`` less the messages the older release appended already."""
        mine = [r for r in rows if r[2] & ~MAX_ADOPTED_QUEUE_OFFSET == self._base]
        done = {r[2] for r in mine if r[2] - self._base < self._through}
        check = [r for r in mine if r[2] not in done][:self._window]
        self._window -= len(check)
        if check:
            stored = self._b.store.stored_at([(_topic_of(r[3]).decode(), r[0].decode())
                                              for r in check])
            done |= {r[2] for r, at in zip(check, stored, strict=True) if at is not None}
        return [r for r in rows if r[2] not in done] if done else rows


def _topic_of(record: bytes) -> bytes:
    id_len, topic_len = _LENGTHS.unpack_from(record, 52)
    return record[_ID_AT + id_len:_ID_AT + id_len + topic_len]
