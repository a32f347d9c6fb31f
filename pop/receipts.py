"""Receipts: the receipt handles of a LeaseBook's leases, as clients hold them.

A Pop gives each message a handle (``encode``, in ``pop.handle``'s signed layout) that
names its lease entry and deadline.  Ack, Nack, ChangeInvisibleTime and DeadLetter bring
it back (``decode``, ``decode_all``).  The MAC is checked against this broker's secret or
one adopted from a broker taken over (``adopt_secret``), and the expiry against the
clock.  Whether a handle still matches an open lease is for the book to say
(``LeaseBook.lease_of``).  Once the entry is done, the book asks here why: acked by this
process (an ack again gets the first ack's answer) or put back for redelivery (a late
settle gets a clear error instead of a silent "done").  Each of these two memories keeps
at most ``REQUEUED_MEMORY`` entries, and a restart forgets them.

Why apart from the book: none of this is lease state, and none of it is persisted.  The
book only records into it and asks it, and decoding a batch of handles needs no group
lock.

Thread-safe: the adopted secrets are replaced whole (``pop.handle``), and a lock guards
the memories.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Container

from pop.handle import HandleCodec, ReceiptHandle
from pop.model import REQUEUED_MEMORY, ReceiptHandleExpired, check_group
from store.clock import Clock
from store.errors import ChronomqError

Entry = tuple[str, str, int, int]  # (group, leased topic, queue id, queue offset)


class Receipts:
    """Receipt handles issued and read, and recently done entries (see the module
    docstring).  Thread-safe."""

    def __init__(self, secret: bytes, clock: Clock) -> None:
        self._codec = HandleCodec(secret)
        self._clock = clock
        self._lock = threading.Lock()  # guards the memories below
        # entries recently put back for redelivery
        self._requeued: OrderedDict[Entry, None] = OrderedDict()
        # entries this process acked (an ack again is fine: ``LeaseBook.lease_of``)
        self._acked: OrderedDict[Entry, None] = OrderedDict()

    # ---------------------------------------------------------------- handles

    def encode(self, group: str, h: ReceiptHandle) -> str:
        return self._codec.encode(group, h)

    def adopt_secret(self, secret: bytes, shift_ms: int = 0) -> None:
        """Accept receipt handles a departed broker signed with ``secret``: those of the
        leases ``LeaseBook.adopt`` took from it name them by the same keys
        (``pop.handle``), their deadlines ``shift_ms`` on (``pop.leaseclock``)."""
        self._codec.adopt(secret, shift_ms)

    def decode(self, group: str, text: str, now: int, verify: bool = True) -> ReceiptHandle:
        """A receipt handle of ``group``, checked (MAC unless ``verify`` is False, and
        expiry at ``now``)."""
        h = self._codec.decode(group, text, verify)
        if now >= h.expire_at_ms and not h.renewable:  # (renewed since, maybe: the book
            #                                               checks its current deadline)
            raise ReceiptHandleExpired(
                f"receipt handle expired at {h.expire_at_ms} (now {now}): the lease ran out "
                "and the message may have been redelivered")
        return h

    def topic_of(self, group: str, text: str) -> str | None:
        """The leased topic a handle of ``group`` names when its MAC verifies, expired or
        not (what a front checks the caller's rights on); None for any other text."""
        try:
            return self._codec.decode(group, text).topic
        except (ChronomqError, ValueError):
            return None

    def decode_all(self, group: str, texts: list[str], issued: Container[str] = ()
                   ) -> tuple[list[ReceiptHandle | None], list[ChronomqError | None]]:
        """Decode several handles: each, or the error that rejected it.  Handles in
        ``issued`` are known to be this broker's: their MAC is not recomputed."""
        try:
            check_group(group)
        except ChronomqError as exc:
            return [None] * len(texts), [exc] * len(texts)
        now = self._clock.now_ms()
        handles: list[ReceiptHandle | None] = []
        results: list[ChronomqError | None] = []
        for text in texts:
            try:
                handles.append(self.decode(group, text, now, text not in issued))
                results.append(None)
            except ChronomqError as exc:
                handles.append(None)
                results.append(exc)
        return handles, results

    # ---------------------------------------------------------------- done entries

    def remember_acked(self, entry: Entry) -> None:
        """This process acked ``entry``."""
        with self._lock:
            _remember(self._acked, entry)

    def remember_requeued(self, entry: Entry) -> None:
        """``entry`` was put back for redelivery (released, revived or dead-lettered)."""
        with self._lock:
            _remember(self._requeued, entry)

    def was_acked(self, entry: Entry) -> bool:
        with self._lock:
            return entry in self._acked

    def was_requeued(self, entry: Entry) -> bool:
        with self._lock:
            return entry in self._requeued


def _remember(entries: OrderedDict[Entry, None], entry: Entry) -> None:
    """Add ``entry``, forgetting the oldest beyond ``REQUEUED_MEMORY`` (caller holds the
    lock)."""
    entries[entry] = None
    if len(entries) > REQUEUED_MEMORY:
        entries.popitem(last=False)


def load_or_create_secret(path: str) -> bytes:
    """The receipt-handle secret: 32 random bytes, created once (mode 0600) and kept."""
    try:
        with open(path, "rb") as f:
            secret = f.read()
        if len(secret) >= 16:
            return secret
    except FileNotFoundError:
        pass
    secret = secrets.token_bytes(32)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return secret
