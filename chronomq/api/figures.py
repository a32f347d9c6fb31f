"""The broker's figures: one flat ``name -> number`` map for Stats and ``/metrics``.

Gathered on demand from each part's statistics: the CommitLog and store (``commitlog.*``,
``store.*``), POP (``pop.*``) and its groups (``group.<group>.<topic>.<figure>``), the
gRPC call budget (``rpc.*``), the timer with its lateness histogram (``timer.*``), the
data volume (``disk.*``), the tier and its read-ahead cache (``tier.*``, when uploads are
on), and any extra sources (the RocketMQ front's ``rocketmq.*``).  ``chronomq.metrics``
turns them into Prometheus families.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

from chronomq.api.budget import CallBudget
from chronomq.broker import Broker
from store.names import DELAYED_STREAM, STATE_STREAM


def broker_figures(broker: Broker, budget: CallBudget, sent: int, popped: int,
                   more: Sequence[Callable[[], dict[str, float]]] = ()) -> dict[str, float]:
    """Every figure of Stats (and /metrics), by name."""
    s = broker.store.statistics()
    p = broker.pop.statistics()
    out: dict[str, float] = {
        f"commitlog.{k}": float(v) for k, v in asdict(s.commitlog).items()}
    out.update({
        "store.topics": s.topics, "store.queues": s.queues,
        "store.dispatched_offset": s.dispatched_offset,
        "store.dispatch_lag_bytes": s.commitlog.confirmed_offset - s.dispatched_offset,
        "store.messages_appended": s.messages_appended,
        "store.damaged_records": s.damaged_records,
        "pop.open_checkpoints": p.open_checkpoints, "pop.popped": p.popped,
        "pop.acked": p.acked, "pop.revived": p.revived, "pop.released": p.released,
        "pop.dead_lettered": p.dead_lettered, "pop.durable_syncs": p.durable_syncs,
        "pop.recovered_copies": broker.pop.copies.recovered,
        "rpc.sent": sent, "rpc.popped": popped,
        **budget.figures("rpc"),
    })
    flow = broker.pop.flow
    for g in broker.pop.group_statistics():
        base = f"group.{g.group}.{g.topic}."
        held = flow.held_count(g.group, g.topic)  # leased to the broker, not handed out
        out.update({base + "in_flight": g.in_flight - held, base + "backlog": g.backlog,
                    base + "lag": g.lag, base + "redelivered": g.redelivered,
                    base + "dead_lettered": g.dead_lettered})
        limits = flow.limits(g.group)
        if limits is not None:  # per-key flow control (``pop.flowcontrol``)
            out.update({base + "held_by_key": held,
                        base + "max_in_flight_per_key": limits.max_in_flight_per_key,
                        base + "rate_per_key": limits.rate_per_key})
    sched = broker.schedules
    out.update({"schedules.total": len(sched.book.states(by_name=False)),
                "schedules.ticks_sent": sched.sent,
                "schedules.last_step_seconds": sched.last_step_s})
    t = broker.timer.statistics()
    out.update({
        "timer.pending_wheel": t.pending_wheel, "timer.pending_rocksdb": t.pending_rocksdb,
        "timer.next_due_ms": t.next_due_ms, "timer.delivered": t.delivered,
        "timer.cancelled": t.cancelled, "timer.rescheduled": t.rescheduled,
        "timer.last_delivery_ms": t.last_delivery_ms,
        "timer.flat_buckets": t.flat_buckets, "timer.flat_objects": t.flat_objects,
        "timer.flat_damaged_objects": t.flat_damaged_objects,
        "timer.parked_unwritten": t.parked_unwritten,
    })
    out.update({f"disk.{k}": float(v)
                for k, v in asdict(broker.disk.refresh()).items()})
    if broker.tiered is not None:
        ts = broker.tiered.statistics()
        out.update({f"tier.{k}": float(v) for k, v in asdict(ts).items()})
        out["tier.lag_bytes"] = s.commitlog.confirmed_offset - ts.position
        reader = broker.tier_reader
        if reader is not None and reader.cache is not None:
            cs = reader.cache.statistics()
            out.update({f"tier.cache_{k}": float(v) for k, v in asdict(cs).items()})
    for bound, count in zip(t.lateness_bounds_ms, t.lateness_counts, strict=False):
        out[f"timer.lateness_le_{bound}ms"] = count
    out["timer.lateness_over_5000ms"] = t.lateness_counts[-1]
    for name, mounted in broker.mount_reader.mounts().items():
        out[f"mount.{name}.topics"] = len(mounted.topics())
        out[f"mount.{name}.messages"] = mounted.messages()
    for name, stream in (("journal.records", STATE_STREAM),
                         ("journal.delayed_records", DELAYED_STREAM)):
        if broker.store.topics.get(stream) is not None:  # what a takeover reads (tier.upload)
            out[name] = broker.store.queue_bounds(stream, 0)[1]
    if broker.lease is not None:  # tier.upload
        if broker.lease.watched:  # tier.failover: the timing fence
            out["lease.valid_for_s"] = broker.lease.valid_for_s()
        out["lease.taken_over"] = float(bool(broker.lease.taken_by))
    for name, r in broker.takeovers.results.items():
        out[f"takeover.{name}.topics"] = len(r.topics)
        out[f"takeover.{name}.pending"] = r.pending
        out[f"takeover.{name}.groups"] = r.groups
        out[f"takeover.{name}.seconds"] = r.seconds
        out[f"takeover.{name}.journal_records"] = r.journal_records
        out[f"takeover.{name}.journal_seconds"] = r.journal_seconds
        out[f"takeover.{name}.done"] = float(r.done)
    for source in more:
        out.update(source())
    return out
