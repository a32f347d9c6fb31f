"""TimerStore: pending delayed messages in RocksDB (``<data>/timer``, raw bytes).

Keys and values (``id`` is the message id, printable ASCII, so it never holds a 0x00 byte)::

    key                                        value
    b"t" | deliver_at_ms u64 | offset u64      the message's whole CommitLog record
    b"i" | id | 0x00 | offset u64              deliver_at_ms u64 | offset u64
    b"f" | id | 0x00 | offset u64              deliver_at_ms u64 | offset u64
    b"w" | bucket_start_ms u64 | offset u64    the whole record (parked, see below)
    b"x" | id                                  (older releases: a tombstone; never read)
    b"!position"                               dispatch position u64
    b"!version"                                FORMAT_VERSION u64
    b"!adopt/" | prefix                        (empty) another broker's TimerFlatFile
                                               prefix read as this one's
    b"!adopted/" | broker                      pending messages of that broker adopted so
                                               far u64 (``cluster.adoption``)

``offset`` is the delayed record's CommitLog offset.  ``t`` keys sort by due time, so
"everything due before T" is one range scan; the value is the whole record, so a pending
timer never depends on CommitLog retention.  ``i`` finds the messages with an id for
Cancel/Reschedule: one key per message (a client-chosen id sent to two topics, the retry
copies of one message nacked by two groups), all under the prefix ``b"i" | id | 0x00``
(no other id's keys start with it: ids hold no 0x00).  ``f`` says a message is parked
for a TimerFlatFile and not yet preloaded: the preload loads an object's entry only while
its key is there, and deletes it in the same synced write.  ``w`` holds the record of a
far-future message waiting for its TimerFlatFile object; it is written with its ``f`` key
in the same atomic write as the dispatch position, so the position never waits for a
TimerFlatFile write and a restart never dispatches a record twice; it goes once its
object is written.  Entries and the dispatch position they bring the store to are written
in one atomic batch.  ``offset`` may be an adopted offset instead (bit 63 set:
``tiered.timerflatfile``), a message taken over from another broker, not in this
broker's CommitLog; a takeover writes its keys (``t`` and ``i``, or ``f`` alone when its
record is in a TimerFlatFile object) with its progress in one atomic batch (``adopt``).

Upgrade: older releases keyed ``i`` and ``f`` by the id alone (``b"i" | id``), so a second
message with that id replaced the first one's key.  A store without ``!version`` is
migrated at open: each such key is rewritten in the form above (its value names the
offset), in atomic batches, then ``!version`` is written (synced); a crash in between
migrates the rest at the next open.  Thread-safe (RocksDB is; no state here).

Memory: RocksDB's memtables hold at most two write buffers of ``WRITE_BUFFER_BYTES``
(the active one and one being flushed).  Every delayed message passes through here
whole, and most are deleted seconds after their put: a buffer that holds that span keeps
them out of SST files while bounding the memory (the figures that chose it:
bench/RESULTS.md, "Notes moved from docstrings").
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from store.kv import KV

_KEY = struct.Struct(">cQQ")
_PARKED = struct.Struct(">cQQ")
_LOC = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_POSITION = b"!position"
_VERSION = b"!version"
_ADOPT = b"!adopt/"
_ADOPTED = b"!adopted/"
FORMAT_VERSION = 2  # 2: id keys carry the offset (1, no !version key: the id alone)
MIGRATE_BATCH = 10_000  # legacy keys rewritten per atomic write at open
WRITE_BUFFER_BYTES = 8 << 20  # per memtable (RocksDB keeps at most two)

Loc = tuple[int, int]  # (deliver_at_ms, commit_offset)


def timer_key(deliver_at_ms: int, commit_offset: int) -> bytes:
    return _KEY.pack(b"t", deliver_at_ms, commit_offset)


def parse_timer_key(key: bytes) -> Loc:
    _, due, offset = _KEY.unpack(key)
    return due, offset


def _pair(raw: bytes) -> Loc:
    due, offset = _LOC.unpack(raw)
    return int(due), int(offset)


def parked_key(bucket_start_ms: int, commit_offset: int) -> bytes:
    return _PARKED.pack(b"w", bucket_start_ms, commit_offset)


def id_prefix(message_id: str, kind: bytes = b"i") -> bytes:
    """The prefix of every ``i`` (or ``f``) key of the messages with this id."""
    return kind + message_id.encode() + b"\0"


def id_key(message_id: str, commit_offset: int, kind: bytes = b"i") -> bytes:
    """The ``i`` (pending) or ``f`` (parked) key of one message."""
    return id_prefix(message_id, kind) + _U64.pack(commit_offset)


def id_key_of(message_id: str, key: bytes) -> bytes:
    """``id_key`` of the entry at timer ``key`` (its offset bytes reused: a hot loop)."""
    return b"i" + message_id.encode() + b"\0" + key[9:]


def parked_id_key(message_id: str, commit_offset: int) -> bytes:
    return id_key(message_id, commit_offset, b"f")


def parse_id_key(key: bytes) -> tuple[str, int]:
    """``(message_id, commit_offset)`` of an ``i`` or ``f`` key."""
    return key[1:-9].decode(), int(_U64.unpack_from(key, len(key) - 8)[0])


class TimerStore:
    def __init__(self, path: str) -> None:
        self.kv = KV(path, write_buffer_bytes=WRITE_BUFFER_BYTES)
        if self.kv.get(_VERSION) is None:
            self._migrate()

    def _migrate(self) -> None:
        """Rewrite the id-only ``i`` and ``f`` keys of older releases with their offset
        (module docstring); idempotent, so a crash midway is finished at the next open."""
        for kind in (b"i", b"f"):
            batch: list[tuple[bytes, bytes]] = []
            for key, value in self.kv.scan(kind):
                if b"\0" not in key:  # the old form: the id alone
                    batch.append((key, value))
                if len(batch) >= MIGRATE_BATCH:
                    self._rewrite(kind, batch)
                    batch = []
            self._rewrite(kind, batch)
        self.kv.write([(_VERSION, _U64.pack(FORMAT_VERSION))], sync=True)

    def _rewrite(self, kind: bytes, legacy: list[tuple[bytes, bytes]]) -> None:
        puts = [(id_key(key[1:].decode(), _pair(value)[1], kind), value)
                for key, value in legacy]
        self.kv.write(puts, [key for key, _ in legacy])

    def close(self) -> None:
        self.kv.close()

    def position(self) -> int:
        raw = self.kv.get(_POSITION)
        return int(_U64.unpack(raw)[0]) if raw else 0

    def add(self, entries: list[tuple[str, int, int, bytes]], position: int | None,
            parked: Sequence[tuple[int, tuple[str, int, int, bytes]]] = (),
            deletes: Sequence[bytes] = (), sync: bool = False) -> None:
        """``(message_id, deliver_at_ms, commit_offset, record)`` entries, ``(bucket,
        entry)`` of messages ``parked`` for a TimerFlatFile, key ``deletes`` and,
        optionally, the dispatch position, in one atomic write."""
        puts: list[tuple[bytes, bytes]] = []
        for message_id, due, offset, record in entries:
            puts.append((timer_key(due, offset), record))
            puts.append((id_key(message_id, offset), _LOC.pack(due, offset)))
        for bucket, (message_id, due, offset, record) in parked:
            puts.append((parked_id_key(message_id, offset), _LOC.pack(due, offset)))
            puts.append((parked_key(bucket, offset), record))
        if position is not None:
            puts.append((_POSITION, _U64.pack(position)))
        self.kv.write(puts, deletes, sync=sync)

    def locate(self, message_id: str) -> list[Loc]:
        """``(deliver_at_ms, commit_offset)`` of every pending message with this id in
        RocksDB (not parked), by offset."""
        return [_pair(value) for _, value in self.kv.scan(id_prefix(message_id))]

    def parked_marks(self, entries: list[tuple[str, int]]) -> list[tuple[bytes, int] | None]:
        """For each ``(message_id, commit_offset)``, the ``f`` key that says it is parked
        and not yet preloaded, and the due time it holds; or None."""
        keys = [parked_id_key(m, off) for m, off in entries]
        return [None if raw is None else (key, _pair(raw)[0])
                for key, raw in zip(keys, self.kv.get_many(keys), strict=True)]

    def locate_parked(self, message_id: str) -> list[tuple[Loc, bytes]]:
        """``((deliver_at_ms, commit_offset), f key)`` of every parked message with this
        id, by offset."""
        return [(_pair(value), key) for key, value in self.kv.scan(id_prefix(message_id, b"f"))]

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return self.kv.get_many(keys)

    def records_run(self, keys: list[bytes]) -> list[bytes | None]:
        """``records`` of ascending timer keys that lie close together (a delivery batch):
        one bounded iterator over their span, a third of a multi-get's cost; keys past
        where ``2 * len(keys)`` steps reached are read by a multi-get."""
        if len(keys) < 8:
            return self.kv.get_many(keys)
        span, reached = self.kv.span(keys[0], keys[-1] + b"\0", 2 * len(keys))
        found: dict[bytes, bytes | None] = dict(span)
        rest = [k for k in keys if k > reached]
        if rest:
            found.update(zip(rest, self.kv.get_many(rest), strict=True))
        return [found.get(k) for k in keys]

    def keys_between(self, start_key: bytes, end_key: bytes) -> Iterator[bytes]:
        """Timer keys in ``[start_key, end_key)``, in due order."""
        for key, _ in self.kv.scan(b"t", start=start_key):
            if key >= end_key:
                return
            yield key

    def remove(self, keys_and_ids: list[tuple[bytes, str]], sync: bool = False) -> None:
        """Delete ``(timer key, message_id)`` entries and their id keys (``sync``: the WAL
        fsynced before returning, for a Cancel's OK)."""
        deletes: list[bytes] = []
        for key, message_id in keys_and_ids:
            deletes += (key, id_key_of(message_id, key))
        self.kv.write(deletes=deletes, sync=sync)

    def move(self, message_id: str, moves: list[tuple[bytes, bytes]],
             new_due_ms: int) -> list[bytes]:
        """Reschedule ``(timer key, record)`` entries of messages with this id to
        ``new_due_ms``, atomically and fsynced (a Reschedule's OK); returns their new
        timer keys."""
        new_keys = [timer_key(new_due_ms, parse_timer_key(k)[1]) for k, _ in moves]
        puts: list[tuple[bytes, bytes]] = []
        for new_key, (_, record) in zip(new_keys, moves, strict=True):
            offset = parse_timer_key(new_key)[1]
            puts += ((new_key, record),
                     (id_key(message_id, offset), _LOC.pack(new_due_ms, offset)))
        deletes = [k for (k, _), new in zip(moves, new_keys, strict=True) if k != new]
        self.kv.write(puts, deletes, sync=True)
        return new_keys

    def parked(self) -> Iterator[tuple[int, int, bytes]]:
        """``(bucket, commit_offset, record)`` of every parked message, by bucket (a scan:
        read once, on start)."""
        for key, record in self.kv.scan(b"w"):
            _, bucket, offset = _PARKED.unpack(key)
            yield int(bucket), int(offset), record

    def pending_due_times(self, limit: int) -> Iterator[int]:
        """The due time of every pending message, from the 16-byte ``i`` and ``f`` values
        (never a record); at most ``limit``."""
        n = 0
        for prefix in (b"i", b"f"):
            for _, value in self.kv.scan(prefix):
                if n >= limit:
                    return
                n += 1
                yield _U64.unpack_from(value)[0]

    # ------------------------------------------------------------------ adoption

    def adopt(self, entries: list[tuple[bytes, int, int, bytes]],
              marks: list[tuple[bytes, int, int]], broker: str, adopted: int,
              sync: bool = False) -> None:
        """A takeover's batch, in one atomic write: ``(message_id, deliver_at_ms, offset,
        record)`` entries (``t`` and ``i`` keys), ``(message_id, deliver_at_ms, offset)``
        of messages whose record is in a TimerFlatFile object (``f`` keys), and how many
        of ``broker``'s pending messages are adopted with it.  Ids as ASCII bytes."""
        puts: list[tuple[bytes, bytes]] = []
        put, loc_of, key_of = puts.append, _LOC.pack, _KEY.pack
        for mid, due, offset, record in entries:
            loc = loc_of(due, offset)
            put((key_of(b"t", due, offset), record))
            put((b"i" + mid + b"\0" + loc[8:], loc))  # id_key, inlined
        for mid, due, offset in marks:
            loc = loc_of(due, offset)
            put((b"f" + mid + b"\0" + loc[8:], loc))
        put((_ADOPTED + broker.encode(), _U64.pack(adopted)))
        self.kv.write(puts, sync=sync)

    def adopted(self, broker: str) -> int:
        """How many of ``broker``'s pending messages ``adopt`` wrote so far."""
        raw = self.kv.get(_ADOPTED + broker.encode())
        return int(_U64.unpack(raw)[0]) if raw else 0

    def add_adopted_prefix(self, prefix: str) -> None:
        """Remember (synced) another broker's TimerFlatFile prefix read as this one's."""
        self.kv.write([(_ADOPT + prefix.encode(), b"")], sync=True)

    def remove_adopted_prefixes(self, prefixes: list[str]) -> None:
        """Forget prefixes whose TimerFlatFiles are all read and deleted (synced)."""
        if prefixes:
            self.kv.write([], deletes=[_ADOPT + p.encode() for p in prefixes], sync=True)

    def adopted_prefixes(self) -> list[str]:
        return [key[len(_ADOPT):].decode() for key, _ in self.kv.scan(_ADOPT)]

    def pending_estimate(self) -> int:
        return max(self.kv.estimate_keys() - 1, 0) // 2
