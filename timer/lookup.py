"""PendingLookup: the pending delayed messages of one id, read wherever they wait, for
QueryMessages and the console (``Queries.by_message_id``); nothing is moved.

The store finds a pending message by id through its CommitLog record (the id's offset,
or the key index) and the timer's witness (``store.lookup``).  A message a takeover
adopted has no such record here: it is in the timer only, under an adopted offset
(``cluster.adoption``), in RocksDB or left in a TimerFlatFile object, the departed
broker's or this one's.  The timer's own id keys find it (``i`` in RocksDB, ``f`` when
parked: ``timer.store``); its record is read

- from RocksDB (a ``t`` key), or from the parking lot's mirror (parked, not yet
  written);
- else from the TimerFlatFile objects of the bucket its ``f`` key names (the copy that
  counts), read one object after the other until the entry is found, as a Cancel reads
  them (``ParkingLot.unpark``), but without moving it.

So a takeover pays nothing per message for this: the keys it writes for the timer are
the index.  A look at a far-future message costs reads of its hour's objects (a Cancel
pays the same).  Offsets the caller already holds (``known``: records the store found)
are not read again.  A preload that moves the message meanwhile is met by reading
RocksDB last; an object it deleted meanwhile is skipped.  A tier that cannot be reached
raises (``TierUnavailable``): the caller is told, not answered "none".

Thread-safe: the mirror is read under the timer's lock; the tier and RocksDB without it
(a look never waits for a TimerFlatFile write).
"""

from __future__ import annotations

import threading
from collections.abc import Container

from store.message import Message, decode_record
from tiered.errors import TierNotFound
from tiered.timerflatfile import TimerFlatFiles
from timer.parking import ParkingLot
from timer.store import TimerStore, timer_key

Held = tuple[int, int, bytes]  # (due ms, offset, record)


class PendingLookup:
    def __init__(self, timers: TimerStore, lot: ParkingLot, flat: TimerFlatFiles,
                 lock: threading.Lock) -> None:
        self._timers = timers
        self._lot = lot
        self._flat = flat
        self._lock = lock  # the TimerService's: guards the lot's mirror

    def messages(self, message_id: str, known: Container[int] = ()) -> list[Message]:
        """The messages pending with this id (their due time the one they wait for now),
        in due order; none whose offset is in ``known``."""
        with self._lock:
            held = [h for h in self._lot.held(message_id) if h[1] not in known]
        found = {offset: (due, offset, record) for due, offset, record in held}
        wanted = [loc for loc, _ in self._timers.locate_parked(message_id)
                  if loc[1] not in known and loc[1] not in found]
        for h in self._in_objects(wanted):
            found[h[1]] = h
        locs = [loc for loc in self._timers.locate(message_id) if loc[1] not in known]
        records = self._timers.records([timer_key(*loc) for loc in locs])
        for (due, offset), raw in zip(locs, records, strict=True):
            if raw is not None:  # (last: a preload meanwhile moved it here)
                found[offset] = (due, offset, raw)
        out = []
        for due, offset, raw in sorted(found.values()):
            m = decode_record(raw, 0, offset)
            m.deliver_at_ms = due
            out.append(m)
        return out

    def _in_objects(self, wanted: list[tuple[int, int]]) -> list[Held]:
        """The records of these parked messages (``(due, offset)``) from their buckets'
        TimerFlatFile objects."""
        by_bucket: dict[int, dict[int, int]] = {}
        for due, offset in wanted:
            by_bucket.setdefault(self._flat.bucket_of(due), {})[offset] = due
        out: list[Held] = []
        for bucket, dues in by_bucket.items():
            for path in self._flat.objects(bucket):
                try:
                    entries = list(self._flat.read_bucket(bucket, [path]))
                except TierNotFound:  # a preload moved its entries meanwhile (read last)
                    continue
                for offset, record in entries:
                    if offset in dues:
                        out.append((dues.pop(offset), offset, record))
                if not dues:
                    break
        return out
