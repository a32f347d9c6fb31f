"""The one checker of docs/DESIGN.md's durability contract, over the client ledgers of
``testkit.ledger`` (Jepsen's set/queue checkers, here): ``check`` names every LOST,
REDELIVERED_AFTER_ACK, LEASE_BROKEN, EARLY, UNEXPECTED and CORRUPT message; NOT_BACK (a
delivery left unsettled on purpose, ``Skip``, whose message never came again) and
OK_AFTER_TAKEOVER (a prober's OK from a broker life after its successor claimed its
lease, given the claims); and the failover chaos's load, TICK_MISSING, TICK_TWICE,
DEBOUNCE_STALE and DELETED_BACK (``testkit.promises``, which says what each means;
ticks and debounced ids are judged there only, their ids being used again).

The checker's lease bound is conservative: a lease lasts at least from its Pop request's
start for its invisible time, cut short by any Nack or ChangeInvisibleTime *attempted*
on it before the later delivery arrived (to request start + delay, or + the new
invisible time), whatever their outcome.

A broker run with its wall clock ahead (a ``ClockAhead`` entry: from when to when, by
how much) keeps absolute times by that clock: a message sent with ``deliver_at_ms`` is
due by it, and a lease it gave before its clock jumped ends by it.  A delivery early by
at most that much, whose due time that clock reached while the window lasted (a lease
broken: given before the window), is counted as ``excused``, not named, whether it
arrived in the window or after it (what the ahead broker made due and left in a queue,
its successor delivers from there).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from testkit.ledger import (
    DRAIN,
    AckOk,
    Change,
    ClockAhead,
    Delivery,
    Entry,
    Probe,
    Release,
    SendAttempt,
    SendOk,
    Skip,
    load,
)
from testkit.promises import LOAD_KINDS, ahead_by, check_load, plain

VIOLATION_KINDS = ("LOST", "REDELIVERED_AFTER_ACK", "LEASE_BROKEN", "EARLY", "UNEXPECTED",
                   "CORRUPT")
ALL_KINDS = (*VIOLATION_KINDS, "NOT_BACK", "OK_AFTER_TAKEOVER", *LOAD_KINDS)
CLOCK_NOISE_MS = 100  # a prober's own delay in reading an answer (OK_AFTER_TAKEOVER)


def check_ledgers(ledgers: Path, group: str) -> Report:
    """``check`` the ledgers in ``ledgers``, the drain's apart."""
    entries = load(ledgers)

    def drained(e: Entry) -> bool:
        return isinstance(e, Delivery | AckOk) and e.lease.startswith(f"{DRAIN}:")

    return check([e for e in entries if not drained(e)], [e for e in entries if drained(e)],
                 group=group)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message_id: str
    token: str
    detail: str

    def __str__(self) -> str:
        if not self.message_id and not self.token:
            return f"{self.kind} {self.detail}"
        return f"{self.kind} id={self.message_id or '-'} token={self.token or '-'}: {self.detail}"


@dataclass(slots=True)
class Report:
    sends_attempted: int = 0
    sends_ok: int = 0
    deliveries: int = 0
    acks: int = 0
    releases: int = 0
    violations: list[Violation] = field(default_factory=list)
    excused: int = 0  # early by a broker's clock ahead, by at most as far (module doc)
    skipped: int = 0
    probes_ok: int = 0
    closest_ok_to_claim_ms: int | None = None  # max over claimed lives of OK - claim

    @property
    def ok(self) -> bool:
        return not self.violations

    def count(self, kind: str) -> int:
        return sum(v.kind == kind for v in self.violations)

    def summary(self, limit: int = 30) -> str:
        head = (f"sends attempted {self.sends_attempted}, OK {self.sends_ok}; deliveries "
                f"{self.deliveries}; acks {self.acks}; releases {self.releases}; violations: "
                + (", ".join(f"{k} {self.count(k)}" for k in ALL_KINDS if self.count(k))
                   or "none"))
        lines = [str(v) for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more")
        return "\n".join([head, *lines])


def check(entries: Iterable[Entry], drain: Iterable[Entry] = (), *, group: str,
          claims: Mapping[str, tuple[str, int]] | None = None) -> Report:
    """Check the ledger of the faulty run (``entries``) plus the final drain's entries
    against the durability contract, for the consumer group ``group``; name every
    violation (see the module docstring for what each entry means); ``claims``: broker
    life -> (its taker, ``claimed_ms``) of every lease claimed, for the probes:

    - LOST: a send answered OK whose token was never delivered to ``group``;
    - REDELIVERED_AFTER_ACK: a delivery to a group arriving after an OK ack of that
      message id by that group arrived;
    - LEASE_BROKEN: a delivery of an id to a group arriving before an earlier delivery's
      lease bound, that earlier lease not acked OK before it arrived;
    - EARLY: a delivery arriving before its send's deliver-at lower bound;
    - UNEXPECTED: a delivered body token that was never attempted;
    - CORRUPT: a body that fails its checksum, or a token delivered under another topic
      or another message id than its send was answered with;
    - NOT_BACK, OK_AFTER_TAKEOVER and the load's kinds: the module docstring.
    """
    everything = [*entries, *drain]
    all_entries = plain(everything)
    ahead = [e for e in all_entries if isinstance(e, ClockAhead)]
    attempts = {e.token: e for e in all_entries if isinstance(e, SendAttempt)}
    sent = {e.token: e.message_id for e in all_entries if isinstance(e, SendOk)}
    deliveries = [e for e in all_entries if isinstance(e, Delivery)]
    acks = [e for e in all_entries if isinstance(e, AckOk)]
    report = Report(len(attempts), len(sent), len(deliveries), len(acks),
                    sum(isinstance(e, Release) for e in all_entries))
    out = report.violations
    for d in deliveries:
        for v in _check_body(d, attempts, sent):
            if v.kind == "EARLY" and ahead_by(ahead, d.at_ms, attempts[d.token].lb_ms):
                report.excused += 1
            else:
                out.append(v)
    delivered = {d.token for d in deliveries if d.group == group and d.body_ok}
    out.extend(Violation("LOST", mid, token, f"send answered OK, never delivered to {group}")
               for token, mid in sent.items() if token not in delivered)
    out.extend(_check_acks(deliveries, acks))
    for v, earlier, later, bound in _check_leases(deliveries, acks, all_entries):
        if ahead_by([w for w in ahead if w.from_ms > earlier.start_ms], later.at_ms, bound):
            report.excused += 1
        else:
            out.append(v)
    skipped = {e.lease for e in everything if isinstance(e, Skip)}
    report.skipped = len(skipped)
    out.extend(_check_not_back([e for e in everything if isinstance(e, Delivery)], skipped))
    out.extend(_check_probes([e for e in everything if isinstance(e, Probe)], claims or {},
                             report))
    out.extend(Violation(text.split(" ", 1)[0], "", "", text.split(" ", 1)[1])
               for text in check_load(everything))
    return report


def not_back(deliveries: list[Delivery], skipped: set[str]) -> list[Delivery]:
    """Skipped deliveries whose message (id and body: a debounced id is used again) was
    not delivered again."""
    last: dict[tuple[str, str], int] = {}
    for d in deliveries:
        key = (d.message_id, d.token)
        last[key] = max(last.get(key, 0), d.at_ms)
    return [d for d in deliveries
            if d.lease in skipped and last[(d.message_id, d.token)] <= d.at_ms]


def _check_not_back(deliveries: list[Delivery], skipped: set[str]) -> Iterator[Violation]:
    for d in not_back(deliveries, skipped):
        yield Violation("NOT_BACK", d.message_id, d.token,
                        f"delivered at {d.at_ms} (lease {d.lease}, attempt {d.attempt}), "
                        "never settled, never delivered again")


def _check_probes(probes: list[Probe], claims: Mapping[str, tuple[str, int]],
                  report: Report) -> Iterator[Violation]:
    """A prober's OK from a broker life answered after its lease was claimed (the
    claimer's wall clock, this machine's: ``CLOCK_NOISE_MS`` allowed), or for a request
    begun after the claim."""
    report.probes_ok = len(probes)
    margins = []
    for p in probes:
        if p.broker not in claims:
            continue
        by, claimed = claims[p.broker]
        margins.append(p.at_ms - claimed)
        if p.at_ms > claimed + CLOCK_NOISE_MS or p.start_ms > claimed:
            yield Violation("OK_AFTER_TAKEOVER", p.message_id, "",
                            f"{p.broker} answered OK at {p.at_ms} (request begun at "
                            f"{p.start_ms}), {p.at_ms - claimed} ms after {by} claimed its "
                            f"lease (claimed_ms {claimed})")
    report.closest_ok_to_claim_ms = max(margins) if margins else None


def _check_body(d: Delivery, attempts: dict[str, SendAttempt],
                sent: dict[str, str]) -> Iterator[Violation]:
    if not d.body_ok:
        yield Violation("CORRUPT", d.message_id, d.token,
                        f"body fails its check (lease {d.lease}): {d.body_head}")
        return
    attempt = attempts.get(d.token)
    if attempt is None:
        yield Violation("UNEXPECTED", d.message_id, d.token,
                        f"delivered to {d.group} (lease {d.lease}), never sent")
        return
    if attempt.topic != d.topic:
        yield Violation("CORRUPT", d.message_id, d.token,
                        f"sent to topic {attempt.topic}, delivered under {d.topic}")
    if d.token in sent and sent[d.token] != d.message_id:
        yield Violation("CORRUPT", d.message_id, d.token,
                        f"send was answered with id {sent[d.token]}")
    if d.at_ms < attempt.lb_ms:
        yield Violation("EARLY", d.message_id, d.token,
                        f"arrived at {d.at_ms}, {attempt.lb_ms - d.at_ms} ms before its "
                        f"deliver-at lower bound {attempt.lb_ms} (lease {d.lease}, "
                        f"attempt {d.attempt})")


def _check_acks(deliveries: list[Delivery], acks: list[AckOk]) -> Iterator[Violation]:
    first_ack: dict[tuple[str, str], AckOk] = {}
    for a in acks:
        key = (a.message_id, a.group)
        if key not in first_ack or a.at_ms < first_ack[key].at_ms:
            first_ack[key] = a
    for d in deliveries:
        ack = first_ack.get((d.message_id, d.group))
        if ack is not None and d.at_ms > ack.at_ms:
            yield Violation("REDELIVERED_AFTER_ACK", d.message_id, d.token,
                            f"delivered to {d.group} at {d.at_ms} (lease {d.lease}, attempt "
                            f"{d.attempt}), {d.at_ms - ack.at_ms} ms after the OK ack of lease "
                            f"{ack.lease} arrived at {ack.at_ms}")


def _check_leases(deliveries: list[Delivery], acks: list[AckOk], entries: list[Entry]
                  ) -> Iterator[tuple[Violation, Delivery, Delivery, int]]:
    """Each LEASE_BROKEN, with the two deliveries and the bound the later one broke."""
    acked_at = {a.lease: a.at_ms for a in acks}
    cuts: dict[str, list[tuple[int, int]]] = defaultdict(list)  # lease -> (start, bound)
    for e in entries:
        if isinstance(e, Release):
            cuts[e.lease].append((e.start_ms, e.start_ms + e.delay_ms))
        elif isinstance(e, Change):
            cuts[e.lease].append((e.start_ms, e.start_ms + e.invisible_time_s * 1000))
    by_key: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_key[(d.message_id, d.group)].append(d)
    for group_deliveries in by_key.values():
        ordered = sorted(group_deliveries, key=lambda d: d.at_ms)
        for j, later in enumerate(ordered):
            for earlier in ordered[:j]:
                if acked_at.get(earlier.lease, later.at_ms) < later.at_ms:
                    continue  # acked before: REDELIVERED_AFTER_ACK names it
                bound = min([earlier.start_ms + earlier.invisible_time_s * 1000,
                             *(b for s, b in cuts[earlier.lease] if s < later.at_ms)])
                if later.at_ms < bound:
                    yield (Violation(
                        "LEASE_BROKEN", later.message_id, later.token,
                        f"delivered to {later.group} at {later.at_ms} (lease {later.lease}, "
                        f"attempt {later.attempt}) while lease {earlier.lease} (popped from "
                        f"{earlier.start_ms}, {earlier.invisible_time_s} s, attempt "
                        f"{earlier.attempt}) lasted until at least {bound}"), earlier, later, bound)
                    break
