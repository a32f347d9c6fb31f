"""Lease clocks: a departed broker's lease deadlines brought onto this broker's clock.

A lease's deadline (a PopCheckpoint's ``expire_at_ms`` and overrides, the
``expire_at_ms`` of the receipt handles it gave) is a time on the wall clock of the
broker that leased it.  Two machines' wall clocks differ: a successor Δ ahead that kept
the departed broker's deadlines would end the leases it adopts Δ early (a revive, a
refused Ack).  So no deadline crosses machines as it is.  When a takeover adopts the
leases (``LeaseBook.adopt``), each keeps its *remaining time*::

    remaining      = max(0, deadline - departed_ms)
    deadline here  = adopted_at_ms + remaining  =  max(deadline + shift_ms, adopted_at_ms)
    shift_ms       = adopted_at_ms - departed_ms

``departed_ms`` is the departed broker's own latest time in its journal (the store time
of the last record of its streams in the tier, ``cluster.replay.latest_ms``): its clock
read at least that when it was lost, so ``remaining`` is at least what the lease had left
then.  ``adopted_at_ms`` is this broker's clock at the adoption.  When the lease was taken
(``pop_at_ms``) moves by the shift alone.  Counted from there the
lease never ends early (it may last longer: the outage and the journal's lag are added,
a safe over-estimate, never more than its invisible time since ``remaining`` is at most
that).  Once here, the deadline is one of this broker's own, revived
and checked on its clock like any lease it gave (a lease outlives a restart, so it is
kept as a wall-clock time here, not on the monotonic clock).

**Handles.**  A handle the departed broker signed names its old deadline, and its MAC
covers it.  It is read on this broker's clock by the same shift: the codec keeps the
shift of each adopted secret (``HandleCodec.adopt``), and a handle verified with that
secret has its deadline moved as the lease's was, so it matches the lease here and
expires when the lease does.  A handle this broker signs (ChangeInvisibleTime) names
its own clock's deadline.

**Kept** in the POP RocksDB with the adopted leases, in the same write, so a restart
accepts the handles again with their shift and a successor of this broker reads it in
its journal (``pop.leasejournal``) and composes it: the handles of a chain's older
broker were moved by each takeover's shift in turn::

    key                                   value
    b"Rc" | broker (UTF-8)                version u8 (1) | shift_ms i64 (big-endian)

A takeover resumed after a crash keeps the shift its first run wrote (the handles and
the leases it adopted then were moved by it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from pop.checkpoint import HELD, STATE_PREFIX, decode_checkpoint, encode_checkpoint

KEY_PREFIX = STATE_PREFIX + b"c"
_VALUE = struct.Struct(">Bq")
_VERSION = 1


def shift_key(broker: str) -> bytes:
    return KEY_PREFIX + broker.encode()


def encode_shift(shift_ms: int) -> bytes:
    return _VALUE.pack(_VERSION, shift_ms)


def decode_shift(raw: bytes) -> int:
    """Raises ``ValueError`` for a value this release did not write."""
    if len(raw) != _VALUE.size or raw[0] != _VERSION:
        raise ValueError(f"unknown lease clock value {raw[:16]!r}")
    return int(_VALUE.unpack(raw)[1])


def shifts_in(items: Iterable[tuple[bytes, bytes]]) -> dict[str, int]:
    """The shifts among POP RocksDB keys (a departed broker's journal replayed): broker ->
    shift; unreadable values are left out (their handles are read as they are)."""
    out: dict[str, int] = {}
    for key, raw in items:
        if key.startswith(KEY_PREFIX):
            try:
                out[key[len(KEY_PREFIX):].decode()] = decode_shift(raw)
            except (ValueError, UnicodeDecodeError):
                continue
    return out


@dataclass(frozen=True)
class LeaseClock:
    """How a takeover's leases move onto this broker's clock (module docstring):
    ``departed`` broker's own latest time, and the shifts its journal holds for the
    brokers it had taken over (``shifts_in``)."""

    departed: str
    departed_ms: int
    inherited: dict[str, int] = field(default_factory=dict)

    def shifts(self, shift_ms: int) -> dict[str, int]:
        """Every broker whose handles the adopted leases may meet, with its shift here,
        once this takeover's own is ``shift_ms``."""
        return {**{b: s + shift_ms for b, s in self.inherited.items()},
                self.departed: shift_ms}


def lease_clock(departed: str, departed_ms: int,
                journal: Iterable[tuple[bytes, bytes]]) -> LeaseClock:
    """The ``LeaseClock`` of a takeover of ``departed``, from its latest time and its
    journal's POP keys."""
    return LeaseClock(departed, departed_ms, shifts_in(journal))


def moved(deadline_ms: int, shift_ms: int, adopted_at_ms: int) -> int:
    """A departed broker's deadline on this broker's clock (never before the adoption).
    ``HELD`` (no deadline: held for its key) stays."""
    if deadline_ms == HELD:
        return HELD
    return max(deadline_ms + shift_ms, adopted_at_ms)


def move_checkpoint(ck_start: int, raw: bytes, shift_ms: int, adopted_at_ms: int) -> bytes:
    """A departed broker's PopCheckpoint value with every deadline moved (``moved``), and
    ``pop_at_ms`` by the shift alone: a takeover compares it with the departed broker's
    store times after moving it back (``cluster.takeover``: its dead-letter copies),
    and along a chain each broker's with its own."""
    ck = decode_checkpoint(ck_start, raw)
    ck.pop_at_ms = max(0, ck.pop_at_ms + shift_ms)
    ck.expire_at_ms = moved(ck.expire_at_ms, shift_ms, adopted_at_ms)
    ck.overrides = {i: moved(e, shift_ms, adopted_at_ms) for i, e in ck.overrides.items()}
    return encode_checkpoint(ck)
