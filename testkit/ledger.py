"""A Jepsen-style client ledger for the trust tests and the failover chaos (its checker:
``testkit.checker``).

Every client writes what it did *before* the operation counts: a send before its
request goes out, its OK after the answer arrives and before anything relies on it.
One ``Ledger`` class, two modes: a file of JSON lines ``os.fsync``-ed per append (a
client process that may be killed; ``load`` reads a directory of them), or memory (the
chaos harness's clients, in a process that is never killed; ``dump`` writes them out in
the same format at the end).  After the faults, ``checker.check`` compares what came out
of the broker with the ledger and names each violation.

All times are wall-clock epoch milliseconds, the clock the broker uses too (one machine).

| kind      | written                      | fields                                         |
|-----------|------------------------------|------------------------------------------------|
| `send`    | before the Send request      | token, topic, lb_ms                            |
| `sent`    | after an OK answer           | token, message_id                              |
| `deliver` | when a Pop answer arrives    | lease, message_id, group, topic, token,        |
|           |                              | body_ok, start_ms, at_ms, invisible_time_s,    |
|           |                              | attempt                                        |
| `ack`     | after an OK ack              | lease, message_id, group, at_ms                |
| `release` | before a Nack                | lease, message_id, group, start_ms, delay_ms   |
| `change`  | before a ChangeInvisibleTime | lease, message_id, group, start_ms,            |
|           |                              | invisible_time_s                               |
| `sched`   | after an OK CreateSchedule   | name, topic, every_ms, first_tick_ms,          |
|           |                              | misfire_bound, at_ms                           |
| `unsched` | before a DeleteSchedule      | name, start_ms                                 |
| `replace` | after an OK Send with        | token, message_id, replaced, start_ms, at_ms   |
|           | ``replace`` (its `send` too) |                                                |
| `deleted` | after an OK DeleteTopic      | topic, start_ms, at_ms                         |
| `seen`    | a deleted topic listed or    | topic, where, at_ms                            |
|           | owned again                  |                                                |
| `ahead`   | before a broker runs with    | broker, ahead_ms, from_ms, to_ms               |
|           | its wall clock ahead         |                                                |
| `probe`   | a prober's OK, by which      | broker, message_id, start_ms, at_ms            |
|           | broker life (prefix)         |                                                |
| `skip`    | a delivery left unsettled    | lease                                          |
|           | on purpose (must come back)  |                                                |

``lb_ms`` is the deliver-at lower bound: the request's start + ``delay_ms``, or the
absolute ``deliver_at_ms``.  ``lease`` names one delivery (unique per ledger writer);
``start_ms`` is when a request began, ``at_ms`` when its answer arrived.

A body is ``<token>|<crc32 of token and padding, 8 hex>|<padding>``; the token is
``<producer>:<seq>``, unique per message.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronomq.client import ChronomqClient, SendOutcome, message
from chronomq.v1 import broker_pb2 as pb


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------- entries


@dataclass(frozen=True, slots=True)
class SendAttempt:
    token: str
    topic: str
    lb_ms: int


@dataclass(frozen=True, slots=True)
class SendOk:
    token: str
    message_id: str


@dataclass(frozen=True, slots=True)
class Delivery:
    lease: str
    message_id: str
    group: str
    topic: str
    token: str  # "" when the body does not parse
    body_ok: bool
    start_ms: int
    at_ms: int
    invisible_time_s: int
    attempt: int
    body_head: str = ""  # the first bytes of a body that failed its check (evidence)


@dataclass(frozen=True, slots=True)
class AckOk:
    lease: str
    message_id: str
    group: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    lease: str
    message_id: str
    group: str
    start_ms: int
    delay_ms: int


@dataclass(frozen=True, slots=True)
class Change:
    lease: str
    message_id: str
    group: str
    start_ms: int
    invisible_time_s: int


@dataclass(frozen=True, slots=True)
class ScheduleMade:
    """A recurring schedule created OK: its ticks are ids ``<name>@<tick ms>``."""

    name: str
    topic: str
    every_ms: int
    first_tick_ms: int  # the schedule's next fire as CreateSchedule answered it
    misfire_bound: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class ScheduleEnd:
    """A DeleteSchedule about to be sent: ticks due well before ``start_ms`` are owed."""

    name: str
    start_ms: int


@dataclass(frozen=True, slots=True)
class ReplaceOk:
    """A Send with ``replace`` answered OK (its ``SendAttempt`` was written before)."""

    token: str
    message_id: str
    replaced: int
    start_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    topic: str
    start_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class TopicSeen:
    """A deleted topic listed by a broker or named by an owner record (evidence)."""

    topic: str
    where: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ClockAhead:
    """A broker run with its wall clock ``ahead_ms`` ahead from ``from_ms`` to ``to_ms``
    (this machine's clock): absolute due times are its clock's meanwhile."""

    broker: str
    ahead_ms: int
    from_ms: int
    to_ms: int


@dataclass(frozen=True, slots=True)
class Probe:
    """One prober message answered OK by ``broker`` (a life's prefix): its request's
    start, its answer."""

    broker: str
    message_id: str
    start_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Skip:
    """A delivery never settled on purpose: its message must be delivered again."""

    lease: str


Entry = (SendAttempt | SendOk | Delivery | AckOk | Release | Change | ScheduleMade
         | ScheduleEnd | ReplaceOk | TopicDeleted | TopicSeen | ClockAhead | Probe | Skip)
_KINDS: dict[str, type[Any]] = {"send": SendAttempt, "sent": SendOk, "deliver": Delivery,
                                "ack": AckOk, "release": Release, "change": Change,
                                "sched": ScheduleMade, "unsched": ScheduleEnd,
                                "replace": ReplaceOk, "deleted": TopicDeleted,
                                "seen": TopicSeen, "ahead": ClockAhead, "probe": Probe,
                                "skip": Skip}
_NAMES = {cls: kind for kind, cls in _KINDS.items()}


class Ledger:
    """An append-only ledger.  ``path``: every ``append`` is written to that file and
    fsync-ed before it returns; None: kept in memory only.  Either way ``snapshot`` gives
    what was appended here.  Thread-safe (a file ledger: give each thread its own)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        self._fd = -1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, *entries: Entry) -> None:
        """Write one operation's entries (and fsync them, to a file) before returning."""
        if not entries:
            return
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, _lines(entries).encode())
                os.fsync(self._fd)
            self._entries.extend(entries)

    def snapshot(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    def dump(self, path: Path) -> None:
        """Everything appended here, as JSON lines (``load`` reads them)."""
        path.write_text(_lines(self.snapshot()))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lines(entries: Iterable[Entry]) -> str:
    return "".join(json.dumps({"k": _NAMES[type(e)], **dataclasses.asdict(e)}) + "\n"
                   for e in entries)


def delivery(lease: str, m: pb.ReceivedMessage, group: str, start_ms: int,
             invisible_time_s: int) -> Delivery:
    """The entry of ``m`` delivered under ``lease`` to a request begun at ``start_ms``."""
    token, ok = parse_body(m.body)
    return Delivery(lease, m.message_id, group, m.topic, token, ok, start_ms, now_ms(),
                    invisible_time_s, m.delivery_attempt, "" if ok else repr(m.body[:60]))


def load(directory: Path) -> list[Entry]:
    """Every entry of every ``*.jsonl`` ledger under ``directory`` (a torn last line, from
    a client killed mid-write, is skipped: it was never counted)."""
    out: list[Entry] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append(_KINDS[raw.pop("k")](**raw))
    return out


# ---------------------------------------------------------------------- bodies


def make_body(token: str, pad_bytes: int = 64) -> bytes:
    pad = (token.encode() * (pad_bytes // max(len(token), 1) + 1))[:pad_bytes]
    crc = zlib.crc32(token.encode() + pad)
    return f"{token}|{crc:08x}|".encode() + pad


def parse_body(body: bytes) -> tuple[str, bool]:
    """``(token, intact)``; the token is "" when the body does not parse."""
    parts = body.split(b"|", 2)
    if len(parts) != 3:
        return "", False
    try:
        token, crc = parts[0].decode(), int(parts[1], 16)
    except ValueError:
        return "", False
    return token, zlib.crc32(parts[0] + parts[2]) == crc


# ---------------------------------------------------------------------- the ledgered client


@dataclass(frozen=True, slots=True)
class Draft:
    message: pb.OutgoingMessage
    token: str
    delay_ms: int
    deliver_at_ms: int | None


class LedgeredClient:
    """A ``ChronomqClient`` whose every operation is ledgered first.  One per thread.

    ``horizon_ms`` follows what this client started: by then every message it sent is due
    and every lease it holds (not acked OK) or gave back has run out, including those of
    calls whose answer never came.  Read it while the client is idle."""

    def __init__(self, client: ChronomqClient, ledger: Ledger, name: str,
                 pad_bytes: int = 64) -> None:
        self.client, self.ledger, self.name, self.pad_bytes = client, ledger, name, pad_bytes
        self._horizon_ms = 0
        self._horizon_lock = threading.Lock()  # a SendStream ledgers on gRPC's thread
        self._open: dict[str, int] = {}  # lease -> when it runs out (or its copy is due)
        self._seq = itertools.count()
        self._leases = itertools.count()

    @property
    def horizon_ms(self) -> int:
        return max(self._horizon_ms, *self._open.values(), 0)

    def _extend(self, at_ms: int) -> None:
        with self._horizon_lock:
            self._horizon_ms = max(self._horizon_ms, at_ms)

    def draft(self, topic: str, delay_ms: int | None = None, deliver_at_ms: int | None = None,
              key: str = "") -> Draft:
        """A message with a fresh token (not sent yet)."""
        token = f"{self.name}:{next(self._seq)}"
        m = message(topic, make_body(token, self.pad_bytes), key=key, delay_ms=delay_ms,
                    deliver_at_ms=deliver_at_ms)
        return Draft(m, token, delay_ms or 0, deliver_at_ms)

    def _ledger_attempts(self, batch: list[Draft]) -> tuple[int, int]:
        """Ledger the attempts; ``(request start, latest lower bound)``."""
        start = now_ms()  # taken before the request: a lower bound of the broker's "now"
        attempts = [SendAttempt(d.token, d.message.topic, d.deliver_at_ms
                                if d.deliver_at_ms is not None else start + d.delay_ms)
                    for d in batch]
        self.ledger.append(*attempts)
        return start, max((a.lb_ms for a in attempts), default=0)

    def _answered(self, start_ms: int, lb_ms: int) -> None:
        """Stored, if at all, by now: due at most this much after its lower bound."""
        self._extend(lb_ms + now_ms() - start_ms)

    def _oks(self, tokens: list[str], outcomes: list[SendOutcome]) -> None:
        self.ledger.append(*[SendOk(t, o.message_id)
                             for t, o in zip(tokens, outcomes, strict=True) if o.ok])

    def send(self, batch: list[Draft]) -> list[SendOutcome]:
        """One unary Send."""
        start, lb = self._ledger_attempts(batch)
        try:
            outcomes = self.client.send([d.message for d in batch])
        finally:
            self._answered(start, lb)
        self._oks([d.token for d in batch], outcomes)
        return outcomes

    def send_stream(self, batches: Iterable[list[Draft]]) -> Iterator[list[SendOutcome]]:
        """SendStream: each batch is ledgered as it goes out, its OKs as its answer comes."""
        in_flight: deque[tuple[list[str], int, int]] = deque()

        def requests() -> Iterator[list[pb.OutgoingMessage]]:
            for batch in batches:
                start, lb = self._ledger_attempts(batch)
                in_flight.append(([d.token for d in batch], start, lb))
                yield [d.message for d in batch]

        try:
            for outcomes in self.client.send_stream(requests()):
                tokens, start, lb = in_flight.popleft()
                self._answered(start, lb)
                self._oks(tokens, outcomes)
                yield outcomes
        finally:
            for _, start, lb in list(in_flight):
                self._answered(start, lb)

    def pop(self, topic: str, group: str, max_messages: int, invisible_time_s: int,
            wait_ms: int = 0) -> list[tuple[pb.ReceivedMessage, Delivery]]:
        start = now_ms()
        try:
            got = self.client.pop(topic, group, max_messages=max_messages,
                                  invisible_time_s=invisible_time_s, wait_ms=wait_ms)
        except BaseException:
            self._extend(start + invisible_time_s * 1000)  # leases we may never see
            raise
        at = now_ms()
        out = []
        for m in got:
            token, ok = parse_body(m.body)
            out.append((m, Delivery(f"{self.name}:{next(self._leases)}", m.message_id, group,
                                    m.topic, token, ok, start, at, invisible_time_s,
                                    m.delivery_attempt, "" if ok else repr(m.body[:60]))))
        self.ledger.append(*[d for _, d in out])
        self._open.update((d.lease, start + invisible_time_s * 1000) for _, d in out)
        return out

    def ack(self, group: str, leased: list[tuple[pb.ReceivedMessage, Delivery]]) -> list[str]:
        """Ack; one error per message ("" = OK, ledgered)."""
        if not leased:
            return []
        errors = self.client.ack(group, [m.receipt_handle for m, _ in leased])
        at = now_ms()
        done = [d for (_, d), e in zip(leased, errors, strict=True) if not e]
        self.ledger.append(*[AckOk(d.lease, d.message_id, group, at) for d in done])
        for d in done:
            self._open.pop(d.lease, None)
        return errors

    def nack(self, group: str, leased: list[tuple[pb.ReceivedMessage, Delivery]],
             delay_ms: int) -> list[str]:
        if not leased:
            return []
        start = now_ms()
        self.ledger.append(*[Release(d.lease, d.message_id, group, start, delay_ms)
                             for _, d in leased])
        errors: list[str] = []
        try:
            errors = self.client.nack(group, [m.receipt_handle for m, _ in leased], delay_ms)
            return errors
        finally:  # back after the delay; if not surely released, maybe at its deadline
            back = now_ms() + delay_ms
            for i, (_, d) in enumerate(leased):
                released = i < len(errors) and not errors[i]
                self._open[d.lease] = back if released else max(self._open.get(d.lease, 0), back)

    def change_invisible_time(self, group: str, leased: tuple[pb.ReceivedMessage, Delivery],
                              invisible_time_s: int) -> tuple[pb.ReceivedMessage, Delivery]:
        """Returns the message with its new receipt handle (same lease in the ledger)."""
        m, d = leased
        self.ledger.append(Change(d.lease, d.message_id, group, now_ms(), invisible_time_s))
        handle = ""
        try:
            handle = self.client.change_invisible_time(group, m.receipt_handle,
                                                       invisible_time_s)
        finally:  # the new deadline; if not surely moved, maybe still the old one
            deadline = now_ms() + invisible_time_s * 1000
            self._open[d.lease] = deadline if handle else max(self._open.get(d.lease, 0), deadline)
        renewed = pb.ReceivedMessage()
        renewed.CopyFrom(m)
        renewed.receipt_handle = handle
        return renewed, d


DRAIN = "drain"  # the ledger name of the final drain's client


def drain(target: str, ledgers: Path, topic: str, group: str, until_ms: int,
          grace_s: float) -> None:
    """The final drain: pop and ack ``group`` (ledgered as client ``DRAIN``) until
    ``until_ms`` passed, two pops in a row found nothing and every send answered OK was
    delivered at least once; at most until ``grace_s`` after ``until_ms``."""
    entries = load(ledgers)
    missing = ({e.token for e in entries if isinstance(e, SendOk)}
               - {e.token for e in entries if isinstance(e, Delivery) and e.group == group})
    ledger = Ledger(ledgers / f"{DRAIN}.jsonl")
    try:
        with ChronomqClient(target, timeout_s=10) as client:
            lc = LedgeredClient(client, ledger, DRAIN)
            empties = 0
            while now_ms() < until_ms + grace_s * 1000:
                got = lc.pop(topic, group, 32, invisible_time_s=60, wait_ms=200)
                lc.ack(group, got)
                missing -= {d.token for _, d in got}
                empties = 0 if got else empties + 1
                if now_ms() >= until_ms and empties >= 2 and not missing:
                    return
    finally:
        ledger.close()
