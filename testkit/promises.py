"""The checks of the failover chaos's load beyond plain sends (``testkit.checker.check``
calls them; the entries are ``testkit.ledger``'s): recurring schedules, debounced sends
and deleted topics across failovers (issue 51, "Tests and figures").

* **Schedules** (``ScheduleMade``: ``every_ms``, the first tick the broker named; ticks
  are ids ``<name>@<tick ms>``): TICK_MISSING for every tick from the first to the last
  one due ``OWED_MARGIN_MS`` before the ``DeleteSchedule`` (``ScheduleEnd``) that was
  never delivered, unless the misfire bound allowed dropping it: with misfire ``all`` a
  broker that gets to a schedule late sends at most ``misfire_bound`` of the owed ticks,
  the latest, so a tick is excused only when the next tick delivered arrived at least
  ``misfire_bound`` ticks after it was due.  TICK_TWICE for a tick delivered after an
  OK ack of it arrived.  Ticks are judged by id, never by this machine's clock (a broker
  with its clock ahead names and fires its ticks by its own).
* **Debounce** (ids ``deb-...``, each send a body ``<id>#<n>`` with ``replace``,
  ``ReplaceOk`` after an OK): DEBOUNCE_STALE when (1) an id's last send was answered OK
  and that body was never acked; (2) a body answered OK, then replaced by a later send
  of its id answered OK with ``replaced >= 1``, is delivered after that answer although
  it was surely pending meanwhile (its lower bound later than the answer: a body due
  earlier may have fired, and "only pending messages are replaced"); (3) the body acked
  last for an id is not the last one answered OK, though surely pending when that was
  sent.  A broker's clock jumping ahead between the two (``ClockAhead``) moves due times
  (pairs across it are not judged).  EARLY for a debounced body delivered before its
  lower bound, unless a broker's clock ahead made it due (``ahead_by``, as the plain
  checker excuses it).
* **Deleted topics** (``TopicDeleted`` after an OK DeleteTopic): DELETED_BACK for a
  deleted topic listed by a broker or named by an owner record later (``TopicSeen``,
  written by the harness when it looks), and for any delivery of it arriving after the
  delete (its acked messages delivered again).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from testkit.ledger import (
    AckOk,
    ClockAhead,
    Delivery,
    Entry,
    ReplaceOk,
    ScheduleEnd,
    ScheduleMade,
    SendAttempt,
    TopicDeleted,
    TopicSeen,
)

SCHEDULE_PREFIX = "sch-"
DEBOUNCE_PREFIX = "deb-"
OWED_MARGIN_MS = 5000  # a tick due this close to the DeleteSchedule may be on its way
LOAD_KINDS = ("TICK_MISSING", "TICK_TWICE", "DEBOUNCE_STALE", "DELETED_BACK")


def is_tick(message_id: str) -> bool:
    return message_id.startswith(SCHEDULE_PREFIX) and "@" in message_id


def is_debounced(message_id_or_token: str) -> bool:
    return message_id_or_token.startswith(DEBOUNCE_PREFIX)


def debounce_id(token: str) -> str:
    return token.split("#", 1)[0]


def plain(entries: Iterable[Entry]) -> list[Entry]:
    """The entries the plain checker judges: without ticks and debounced bodies (an id
    used again, a body replaced: their rules are here), but with any corrupt body."""
    leases = set()
    out: list[Entry] = []
    for e in entries:
        if isinstance(e, Delivery) and e.body_ok and (is_tick(e.message_id)
                                                      or is_debounced(e.message_id)):
            leases.add(e.lease)
            continue
        if isinstance(e, SendAttempt) and is_debounced(e.token):
            continue
        if hasattr(e, "lease") and e.lease in leases:
            continue
        out.append(e)
    return out


def check_load(entries: list[Entry]) -> list[str]:
    return [*check_ticks(entries), *check_debounce(entries), *check_deleted(entries)]


# ---------------------------------------------------------------------- schedules


def missing_ticks(entries: list[Entry]) -> dict[str, list[int]]:
    """Schedule name -> the ticks (ms) owed and not delivered, the excused left out."""
    ends = {e.name: e.start_ms for e in entries if isinstance(e, ScheduleEnd)}
    arrived: dict[str, dict[int, int]] = defaultdict(dict)  # name -> tick -> first arrival
    for d in entries:
        if isinstance(d, Delivery) and d.body_ok and is_tick(d.message_id):
            name, _, tick = d.message_id.rpartition("@")
            first = arrived[name].get(int(tick))
            arrived[name][int(tick)] = d.at_ms if first is None else min(first, d.at_ms)
    out: dict[str, list[int]] = {}
    for s in (e for e in entries if isinstance(e, ScheduleMade)):
        got = arrived.get(s.name, {})
        last = ends[s.name] - OWED_MARGIN_MS if s.name in ends else max(got, default=0)
        later = sorted(got)
        missing = []
        for due in range(s.first_tick_ms, last + 1, s.every_ms):
            if due in got:
                continue
            nxt = next((t for t in later if t > due), None)
            if nxt is not None and got[nxt] >= due + s.misfire_bound * s.every_ms:
                continue  # dropped by the misfire bound
            missing.append(due)
        out[s.name] = missing
    return out


def check_ticks(entries: list[Entry]) -> list[str]:
    out = []
    for name, ticks in missing_ticks(entries).items():
        out += [f"TICK_MISSING id={name}@{t}: owed (due before the DeleteSchedule), never "
                f"delivered" for t in ticks]
    acks = {a.lease: a for a in entries if isinstance(a, AckOk)}
    deliveries = [d for d in entries if isinstance(d, Delivery) and is_tick(d.message_id)]
    first_ack: dict[str, AckOk] = {}
    for d in deliveries:
        a = acks.get(d.lease)
        if a is not None and (d.message_id not in first_ack
                              or a.at_ms < first_ack[d.message_id].at_ms):
            first_ack[d.message_id] = a
    for d in deliveries:
        a = first_ack.get(d.message_id)
        if a is not None and d.at_ms > a.at_ms:
            out.append(f"TICK_TWICE id={d.message_id}: delivered at {d.at_ms} (lease "
                       f"{d.lease}, attempt {d.attempt}), {d.at_ms - a.at_ms} ms after the "
                       f"OK ack of lease {a.lease}")
    return out


# ---------------------------------------------------------------------- debounce


def _debounce_facts(entries: list[Entry]) -> tuple[
        dict[str, list[str]], dict[str, ReplaceOk], dict[str, list[Delivery]]]:
    """Per id its attempts' tokens in order; OKs by token; deliveries by token."""
    attempts: dict[str, list[str]] = defaultdict(list)
    oks: dict[str, ReplaceOk] = {}
    deliveries: dict[str, list[Delivery]] = defaultdict(list)
    for e in entries:
        if isinstance(e, SendAttempt) and is_debounced(e.token):
            attempts[debounce_id(e.token)].append(e.token)
        elif isinstance(e, ReplaceOk):
            oks[e.token] = e
        elif isinstance(e, Delivery) and e.body_ok and is_debounced(e.message_id):
            deliveries[e.token].append(e)
    return attempts, oks, deliveries


def owed_debounced(entries: list[Entry]) -> set[str]:
    """Tokens of the last bodies answered OK (and last sent) not delivered yet."""
    attempts, oks, deliveries = _debounce_facts(entries)
    return {tokens[-1] for tokens in attempts.values()
            if tokens[-1] in oks and not deliveries.get(tokens[-1])}


def ahead_by(ahead: list[ClockAhead], at_ms: int, due_ms: int) -> bool:
    """Whether a broker running ahead could have made ``due_ms`` due by ``at_ms``: its
    window began by then, its clock reached ``due_ms`` before the window ended, and it ran
    ahead by at least ``due_ms - at_ms``.  The delivery itself may come after the window:
    a message the ahead broker put in a queue as due, unconsumed when it died, is
    delivered by its successor from that queue."""
    return any(w.from_ms <= at_ms and at_ms + w.ahead_ms >= due_ms
               and due_ms - w.ahead_ms <= w.to_ms for w in ahead)


def check_debounce(entries: list[Entry]) -> list[str]:
    attempts, oks, deliveries = _debounce_facts(entries)
    acked = {a.lease: a.at_ms for a in entries if isinstance(a, AckOk)}
    lb = {e.token: e.lb_ms for e in entries if isinstance(e, SendAttempt)}
    ahead = [e for e in entries if isinstance(e, ClockAhead)]
    out = []
    for token, ds in deliveries.items():  # (made due early by a clock ahead: excused)
        out += [f"EARLY id={d.message_id} token={token}: arrived at {d.at_ms}, "
                f"{lb[token] - d.at_ms} ms before its lower bound {lb[token]}"
                for d in ds if token in lb and d.at_ms < lb[token]
                and not ahead_by(ahead, d.at_ms, lb[token])]

    def first(token: str) -> int | None:
        return min((d.at_ms for d in deliveries.get(token, [])), default=None)

    def pending(p: str, r: str) -> bool:
        """Whether body ``p`` was surely pending while ``r`` was sent: answered OK before
        ``r`` began, not due before ``r`` was answered, no broker's clock jumping between."""
        return (oks[p].at_ms < oks[r].start_ms and lb[p] > oks[r].at_ms
                and not any(oks[p].at_ms <= w.from_ms <= oks[r].at_ms for w in ahead))

    ahead = [e for e in entries if isinstance(e, ClockAhead)]
    for mid, tokens in attempts.items():
        sent_ok = [t for t in tokens if t in oks]
        for i, r in enumerate(sent_ok):
            if oks[r].replaced < 1:
                continue
            for p in sent_ok[:i]:
                at = first(p)
                if pending(p, r) and at is not None and at > oks[r].at_ms:
                    out.append(f"DEBOUNCE_STALE id={mid} token={p}: replaced by {r} (OK at "
                               f"{oks[r].at_ms}, replaced {oks[r].replaced}), delivered first "
                               f"at {at}")
        last = tokens[-1]
        if last not in oks:
            continue  # its outcome unknown: it may have replaced the last OK
        ack_times = [(acked[d.lease], t) for t, ds in deliveries.items()
                     if debounce_id(t) == mid for d in ds if d.lease in acked]
        if not any(t == last for _, t in ack_times):
            out.append(f"DEBOUNCE_STALE id={mid} token={last}: the last body answered OK "
                       f"(at {oks[last].at_ms}) was never acked")
            continue
        _, acked_last = max(ack_times)
        if acked_last != last and acked_last in oks and pending(acked_last, last):
            out.append(f"DEBOUNCE_STALE id={mid} token={acked_last}: acked last, first "
                       f"delivered at {first(acked_last)}, although it was pending when the "
                       f"last body {last} was sent (OK at {oks[last].at_ms})")
    return out


# ---------------------------------------------------------------------- deleted topics


def check_deleted(entries: list[Entry]) -> list[str]:
    deleted: dict[str, TopicDeleted] = {}
    for e in entries:
        if isinstance(e, TopicDeleted) and e.topic not in deleted:
            deleted[e.topic] = e
    out = []
    for e in entries:
        if isinstance(e, TopicSeen) and e.topic in deleted \
                and e.at_ms > deleted[e.topic].at_ms:
            out.append(f"DELETED_BACK {e.topic}: {e.where} at {e.at_ms}, "
                       f"{e.at_ms - deleted[e.topic].at_ms} ms after its DeleteTopic OK")
        elif isinstance(e, Delivery) and e.topic in deleted \
                and e.at_ms > deleted[e.topic].at_ms:
            out.append(f"DELETED_BACK {e.topic}: id={e.message_id} delivered at {e.at_ms} "
                       f"(lease {e.lease}) after its DeleteTopic OK at "
                       f"{deleted[e.topic].at_ms}")
    return out
