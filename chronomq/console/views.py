"""What each console page shows, as plain JSON-able dicts (the pages render them, and
their scripts fetch them again from ``/api/<page>`` to update without a reload).

Cheap by construction, so pages stay fast with 10,000 topics and 1,000 groups:

* the overview reads each part's counters directly (not ``broker_figures``, which walks
  every group);
* topics and groups are paged (``PAGE`` rows, a name prefix filter): only the rows on
  the page have their queues and leases looked at;
* the schedule is the timer's cached ``Schedule`` (``timer.schedule``: the due times of
  pending messages from RocksDB's 16-byte id values, never a body);
* a dead-letter page reads ``PAGE`` entries of one ConsumeQueue.

Every name, id and number from a request is checked here before it reaches the broker
(``check_name``, ``validate_message_id``, bounded integers).

**Who looks** (``who``, the session's principal: ``chronomq.console.session``): each
page shows what the API would answer that principal.  The broker-wide figures (the
overview's rates, lateness, timer, tier and disk; the schedule of every pending
message) need ``admin`` on ``*``, as Stats does (others get their topics' and groups'
counts); topics are those it may send to, consume or administer (ListTopics), groups
and dead letters those of topics it may consume, recurring schedules those whose topic
it may send to (ListSchedules), messages those of topics it may consume
(QueryMessages).  A page it may not see raises ``AccessDenied`` before anything is read,
the same whether what it names exists or not (the server counts and audits it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from access.model import ALL, Action
from access.principals import Principal
from chronomq.broker import Broker
from chronomq.console.rates import RateSampler
from pop.model import PROP_DLQ_ATTEMPTS, PROP_DLQ_REASON, PROP_ORIGIN_TOPIC, dlq_topic
from recurring.model import fires
from store.errors import InvalidArgument
from store.message import Message, validate_message_id
from store.names import check_name
from timer.model import LATENESS_BOUNDS_MS

PAGE = 50
MAX_PAGE = 1_000_000
MAX_PREVIEW = 512  # body bytes shown
LOOKUP_LIMIT = 64  # messages a lookup by key shows (delivered, then pending)
OVERVIEW_SCHEDULE_AGE_MS = 30_000  # the overview's pending count: a scan at most this often
REDRIVE_ID = "redrive-"  # + the dead letter's id: the redriven copy's client-chosen id


def page_number(raw: str) -> int:
    if not raw:
        return 0
    if not raw.isdigit() or len(raw) > 7 or int(raw) > MAX_PAGE:
        raise InvalidArgument("page must be a whole number from 0 to 1,000,000")
    return int(raw)


def name_prefix(raw: str) -> str:
    if len(raw) > 255 or not raw.isprintable():
        raise InvalidArgument("the filter must be printable and at most 255 characters")
    return raw


def message_dict(m: Message, due_ms: int | None = None) -> dict[str, Any]:
    body = m.body[:MAX_PREVIEW]
    try:
        text, binary = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, binary = body.hex(), True
    return {"message_id": m.message_id, "topic": m.topic, "queue_id": m.queue_id,
            "queue_offset": m.queue_offset, "key": m.key, "tag": m.tag,
            "properties": dict(sorted(m.properties.items())), "born_at_ms": m.born_at_ms,
            "store_at_ms": m.store_at_ms, "deliver_at_ms": m.deliver_at_ms,
            "delivery_attempt": m.delivery_attempt, "body_bytes": len(m.body),
            "body_preview": text, "body_binary": binary, "pending_due_ms": due_ms}


def pending_stub(message_id: str, topic: str, key: str, due_ms: int) -> dict[str, Any]:
    """A pending message whose stored record cannot be read here (local retention took
    it; the timer keeps its own copy): what the index and the timer know."""
    return {"message_id": message_id, "topic": topic, "queue_id": "-", "queue_offset": "-",
            "key": key, "tag": "", "properties": {}, "born_at_ms": None,
            "store_at_ms": None, "deliver_at_ms": due_ms, "delivery_attempt": 0,
            "body_bytes": 0, "body_preview": "(held by the timer; not readable here)",
            "body_binary": False, "pending_due_ms": due_ms}


class ConsoleViews:
    def __init__(self, broker: Broker, sampler: RateSampler,
                 counters: Callable[[], dict[str, float]]) -> None:
        self.broker = broker
        self.sampler = sampler
        self.counters = counters

    # ------------------------------------------------------------------ overview

    def overview(self, who: Principal) -> dict[str, Any]:
        b = self.broker
        if not who.unrestricted(Action.ADMIN):  # only its topics' and groups' counts
            return {"now_ms": b.clock.now_ms(), "scope": "user", "user": who.name,
                    "topics": len(self._topic_names(who)),
                    "groups": len(self._group_pairs(who))}
        t = b.timer.statistics()
        tier: dict[str, Any] = {"enabled": b.tiered is not None}
        if b.tiered is not None:
            ts = b.tiered.statistics()
            tier.update(asdict(ts))
            tier["health"] = "failing" if ts.consecutive_failures else "ok"
        disk = asdict(b.disk.refresh())
        schedule = b.timer.schedule(OVERVIEW_SCHEDULE_AGE_MS)
        return {
            "now_ms": b.clock.now_ms(),
            "rates": self.sampler.series(),
            "lateness": {"bounds_ms": list(LATENESS_BOUNDS_MS),
                         "counts": list(t.lateness_counts)},
            "timer": {"pending_wheel": t.pending_wheel, "pending_rocksdb": t.pending_rocksdb,
                      "parked_unwritten": t.parked_unwritten, "next_due_ms": t.next_due_ms,
                      "delivered": t.delivered, "cancelled": t.cancelled,
                      "rescheduled": t.rescheduled, "flat_buckets": t.flat_buckets,
                      "flat_objects": t.flat_objects, "pending": schedule.total,
                      "overdue": schedule.overdue, "pending_as_of_ms": schedule.now_ms},
            "counters": self.counters(),
            "tier": tier, "disk": disk, "scope": "broker",
            "topics": b.store.topics.count(), "groups": len(b.pop.group_pairs()),
        }

    def schedule(self, who: Principal) -> dict[str, Any]:
        who.check([(Action.ADMIN, ALL)])  # every pending message's due time
        return asdict(self.broker.timer.schedule())

    def recurring(self, page: int, prefix: str, who: Principal) -> dict[str, Any]:
        """One page of the recurring schedules, each with its next three fire times and
        its last ticks sent (``[tick ms, message id]``, newest first)."""
        states = [s for s in self.broker.schedules.book.states()
                  if s.spec.name.startswith(prefix) and who.may(Action.SEND, s.spec.topic)]
        rows = []
        for st in states[page * PAGE : (page + 1) * PAGE]:
            s = st.spec
            nexts = [] if st.next_ms is None or st.paused else \
                [st.next_ms, *fires(s.trigger(), st.next_ms, 2)]
            rows.append({"name": s.name, "topic": s.topic, "cron": s.cron,
                         "every_s": s.every_s, "time_zone": s.time_zone,
                         "paused": st.paused, "next_fires": nexts, "fired": st.fired,
                         "misfire": s.misfire, "last_error": st.last_error,
                         "recent": [list(r) for r in reversed(st.recent)]})
        return {"page": page, "page_size": PAGE, "total": len(states), "rows": rows}

    # ------------------------------------------------------------------ topics, groups

    def _topic_names(self, who: Principal) -> list[str]:
        """The topics here and mounted that ``who`` may send to, consume or administer."""
        b = self.broker
        names = sorted([t.name for t in b.topics()] +
                       [n for m in b.mount_reader.mounts().values() for n in m.topics()])
        if any(who.unrestricted(a) for a in Action):
            return names
        return [n for n in names if any(who.may(a, n) for a in Action)]

    def _group_pairs(self, who: Principal) -> list[tuple[str, str]]:
        """``(group, topic)`` of the groups of topics ``who`` may consume."""
        pairs = self.broker.pop.group_pairs()
        if who.unrestricted(Action.CONSUME):
            return pairs
        return [p for p in pairs if who.may(Action.CONSUME, p[1])]

    def topics(self, page: int, prefix: str, who: Principal) -> dict[str, Any]:
        b = self.broker
        adopted = b.mount_reader.adopted()
        names = self._topic_names(who)
        if prefix:
            names = [n for n in names if n.startswith(prefix)]
        rows = []
        for name in names[page * PAGE:(page + 1) * PAGE]:
            t = b.store.topics.get(name)
            mounted = b.mount_reader.mounted(name)
            seen = t or b.store.topics.mounted(name)
            queues = seen.queue_count if seen is not None else 0
            stored = tier_bytes = 0
            for qid in range(queues):
                if t is not None:
                    low, high = b.store.queue_bounds(name, qid)
                    stored += high - low
                if b.tiered is not None:
                    q = b.tiered.queue(name, qid)
                    if q is not None:
                        tier_bytes += q.log.commit_position - q.log.start_position
            cfg = b.config
            rows.append({
                "name": name, "queues": queues, "stored": stored, "tier_bytes": tier_bytes,
                "mounted_from": mounted.broker if mounted is not None else "",
                "taken_over_from": adopted.get(name, ""),
                "retention_ms": (t.retention_ms if t and t.retention_ms
                                 else cfg.store.retention_ms),
                "retention_bytes": t.retention_bytes if t else 0,
                "tier_retention_ms": (t.tier_retention_ms if t and t.tier_retention_ms
                                      else cfg.tier.retention_ms)})
        return {"page": page, "page_size": PAGE, "total": len(names), "rows": rows}

    def groups(self, page: int, prefix: str, who: Principal) -> dict[str, Any]:
        b = self.broker
        pairs = self._group_pairs(who)
        if prefix:
            pairs = [p for p in pairs if p[0].startswith(prefix)]
        rows = []
        for g in b.pop.group_statistics(pairs[page * PAGE:(page + 1) * PAGE]):
            policy = b.config.groups.get(g.group) or b.config.retry_policy()
            dead = dlq_topic(g.group, g.topic)
            dead_stored = sum(high - low for low, high in (
                b.store.queue_bounds(dead, 0),)) if b.store.topics.get(dead) else 0
            held = b.pop.flow.held_count(g.group, g.topic)
            limits = b.pop.flow.limits(g.group)
            rows.append({"group": g.group, "topic": g.topic, "lag": g.lag,
                         "backlog": g.backlog, "in_flight": g.in_flight - held,
                         "held_by_key": held,
                         "max_in_flight_per_key": limits.max_in_flight_per_key if limits
                         else 0, "rate_per_key": limits.rate_per_key if limits else 0.0,
                         "redelivered": g.redelivered, "dead_lettered": g.dead_lettered,
                         "dead_letters_stored": dead_stored,
                         "max_attempts": policy.max_attempts,
                         "backoff_ms": list(policy.backoff_ms), "jitter": policy.jitter})
        return {"page": page, "page_size": PAGE, "total": len(pairs), "rows": rows}

    # ------------------------------------------------------------------ messages

    def message(self, message_id: str, who: Principal) -> dict[str, Any]:
        """The messages with this id in topics ``who`` may consume (nothing tells of the
        others), each saying whether ``who`` may act on it (send on its topic)."""
        validate_message_id(message_id)
        if not message_id:
            raise InvalidArgument("give a message id")
        found = [m for m in self.broker.queries.by_message_id(message_id)
                 if who.may(Action.CONSUME, m.topic)]
        due = self.broker.timer.pending_due(message_id)
        rows = [message_dict(m, due) for m in found]
        # a client-chosen id's pending messages are in no index until delivered
        topics = {m.topic for m in found}
        rows += [message_dict(m, m.deliver_at_ms)
                 for m in self.broker.timer.pending_messages(message_id)
                 if m.topic not in topics and who.may(Action.CONSUME, m.topic)]
        for row in rows:
            row["may_act"] = who.may(Action.SEND, row["topic"])
        return {"messages": rows, "pending_due_ms": due if rows else None}

    def by_key(self, topic: str, key: str, who: Principal) -> dict[str, Any]:
        who.check([(Action.CONSUME, topic)])
        check_name(topic)
        if not key or len(key) > 1024:
            raise InvalidArgument("give a key of at most 1,024 characters")
        b = self.broker
        found = b.queries.by_key(topic, key, LOOKUP_LIMIT)
        rows = [message_dict(m, b.timer.pending_due(m.message_id)) for m in found]
        seen = {m.message_id for m in found}
        # pending ones: the index's delayed records with this key that the timer still holds
        for _offset, mid in b.store.index.pending_by_key(topic, key, LOOKUP_LIMIT):
            due = b.timer.pending_due(mid) if mid not in seen else None
            if due is None:
                continue  # delivered (then found above), cancelled, or a duplicate entry
            seen.add(mid)
            record = [m for m in b.queries.by_message_id(mid) if m.topic == topic and m.key == key]
            rows.append(message_dict(record[-1], due) if record else
                        pending_stub(mid, topic, key, due))
        may_act = who.may(Action.SEND, topic)
        return {"messages": [{**r, "may_act": may_act} for r in rows]}

    def dead_letters(self, group: str, topic: str, page: int, who: Principal
                     ) -> dict[str, Any]:
        """One page of ``group``'s dead letters of ``topic``, newest first, each with
        whether it was redriven (its copy's id is in the dedupe index)."""
        who.check([(Action.CONSUME, topic)])
        check_name(group)
        check_name(topic)
        b = self.broker
        dead = dlq_topic(group, topic)
        if b.store.topics.get(dead) is None:
            return {"group": group, "topic": topic, "total": 0, "page": page,
                    "page_size": PAGE, "rows": []}
        low, high = b.store.queue_bounds(dead, 0)
        end = high - page * PAGE
        start = max(low, end - PAGE)
        entries = b.store.consume_queue_entries(dead, 0, start, max(0, end - start))
        read = b.store.read_messages_skipping([(e.commit_offset, e.record_size)
                                               for e in entries if not e.is_hole])
        messages = [m for m in read if isinstance(m, Message)]
        origin = [(m.properties.get(PROP_ORIGIN_TOPIC, topic), REDRIVE_ID + m.message_id)
                  for m in messages]
        redriven = b.store.stored_at(origin) if origin else []
        rows = []
        for m, at in zip(reversed(messages), reversed(redriven), strict=True):
            row = message_dict(m)
            row.update(reason=m.properties.get(PROP_DLQ_REASON, ""),
                       attempts=m.properties.get(PROP_DLQ_ATTEMPTS, ""), redriven_at_ms=at)
            rows.append(row)
        return {"group": group, "topic": topic, "total": high - low, "page": page,
                "page_size": PAGE, "rows": rows}
