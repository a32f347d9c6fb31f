"""What each ``chronomq`` client command does, given its parsed arguments.

A command returns an ``Outcome``: the value to print, the broker's refusals, one line
each (``CODE: message``), and warnings.  ``chronomq.cli`` prints the value on stdout, the
refusals and warnings on stderr, and turns the refusals into the exit status: 0 when
there are none, 1 when the broker refused or failed.  A warning (damaged tier objects a
Spark job skipped: it delivered every intact record) leaves the exit status alone.  Bad
input found before anything is sent raises ``InvalidArgument`` (exit 2).  Destructive
commands check their confirmation flag before they connect.

The Spark commands (``replay``, ``export``) import Spark only when run, so the other
commands start in a fraction of a second, and in a base install (the client only, no
``spark`` extra: ``chronomq.extras``) they say what to install instead.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import grpc

from chronomq.client.client import ChronomqClient, RpcError, message, status_by_number
from chronomq.extras import require
from chronomq.v1 import broker_pb2 as pb
from pop.policy import parse_duration_ms
from store.errors import InvalidArgument

if TYPE_CHECKING:
    from tiered.scan import Damage


@dataclass(slots=True)
class Outcome:
    value: Any
    refused: list[str] = field(default_factory=list)  # "CODE: message", one per refusal
    warnings: list[str] = field(default_factory=list)  # one line each, on stderr


def _refusal(error: pb.Error) -> str:
    return f"{status_by_number(error.code).name}: {error.message}"


def time_ms(text: str) -> int:
    """Epoch ms or ISO-8601 (UTC unless it says otherwise); '' is 0."""
    if not text:
        return 0
    if text.isdigit():
        return int(text)
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidArgument(f"bad time {text!r}: use epoch ms or ISO-8601") from exc
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def properties(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgument(f"--property expects NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def received_dict(m: pb.ReceivedMessage) -> dict[str, Any]:
    try:
        body: str = m.body.decode()
        encoding = "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode(), "base64"
    return {
        "message_id": m.message_id, "topic": m.topic, "queue_id": m.queue_id,
        "queue_offset": m.queue_offset, "key": m.key, "tag": m.tag, "body": body,
        "body_encoding": encoding, "properties": dict(m.properties),
        "born_at_ms": m.born_at_ms, "deliver_at_ms": m.deliver_at_ms,
        "delivery_attempt": m.delivery_attempt, "receipt_handle": m.receipt_handle,
    }


def groups(figures: dict[str, float]) -> list[dict[str, Any]]:
    """Rows of the ``group.<group>.<topic>.<figure>`` figures (group names hold no dot,
    topic names may)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, value in figures.items():
        if name.startswith("group."):
            group, rest = name[len("group."):].split(".", 1)
            topic, figure = rest.rsplit(".", 1)
            rows.setdefault((group, topic), {"group": group, "topic": topic})[figure] = \
                int(value) if value == int(value) else value
    return [rows[k] for k in sorted(rows)]


def _settle(c: ChronomqClient, args: argparse.Namespace) -> Outcome:
    if args.command == "ack":
        resp = c.call("Ack", pb.AckRequest(group=args.group, receipt_handles=args.handles))
    elif args.command == "nack":
        request = pb.NackRequest(group=args.group, receipt_handles=args.handles)
        if args.delay_ms is not None:
            request.delay_ms = args.delay_ms
        resp = c.call("Nack", request)
    else:
        resp = c.call("DeadLetter", pb.DeadLetterRequest(
            group=args.group, receipt_handles=args.handles, reason=args.reason))
    rows, refused = [], []
    for handle, r in zip(args.handles, resp.results, strict=True):
        error = _refusal(r.error) if r.HasField("error") else ""
        rows.append({"receipt_handle": handle, "ok": not error, "error": error})
        if error:
            refused.append(f"{error} (handle {handle})")
    return Outcome(rows, refused)


def _topic(c: ChronomqClient, args: argparse.Namespace) -> Outcome:
    if args.topic_command == "create":
        created = c.create_topic(args.name, args.queues, args.retention_ms,
                                 tier_retention_ms=args.tier_retention_ms)
        return Outcome({"topic": args.name, "created": created})
    if args.topic_command == "delete":
        c.delete_topic(args.name)
        return Outcome({"topic": args.name, "deleted": True})
    return Outcome([{"name": t.name, "queue_count": t.queue_count,
                     "retention_ms": t.retention_ms, "tier_retention_ms": t.tier_retention_ms,
                     **({"mounted_from": t.mounted_from} if t.mounted_from else {}),
                     **({"taken_over_from": t.taken_over_from} if t.taken_over_from else {})}
                    for t in c.list_topics()])


def _zone(name: str) -> tzinfo:
    """A schedule's time zone (UTC for one this machine does not know)."""
    try:
        return ZoneInfo(name) if name else UTC
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _local(ms: int, zone: tzinfo) -> str:
    """``ms`` in a schedule's zone, ISO-8601 with its offset ("" for 0)."""
    return datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="milliseconds") \
        if ms else ""


def _zone_of(c: ChronomqClient, name: str) -> tzinfo:
    """The zone of schedule ``name`` as the broker holds it (UTC if it is not listed)."""
    found = [s for s in c.list_schedules(name) if s.name == name]
    return _zone(found[0].time_zone) if found else UTC


def _schedule_row(s: pb.Schedule) -> dict[str, Any]:
    """One schedule for people: its times in its own zone."""
    zone = _zone(s.time_zone)
    return {"name": s.name, "topic": s.topic, "cron": s.cron, "every_s": s.every_s,
            "time_zone": s.time_zone, "misfire": s.misfire, "paused": s.paused,
            "next_fire": _local(s.next_fire_ms, zone), "fired": s.fired,
            **({"jitter_ms": s.jitter_ms} if s.jitter_ms else {}),
            **({"recent": [f"{_local(t.tick_ms, zone)} {t.message_id}"
                           for t in s.recent_ticks]} if s.recent_ticks else {}),
            **({"last_error": s.last_error} if s.last_error else {})}


def _body(text: str | None) -> bytes | None:
    """A ``--body``: its UTF-8, stdin's bytes for ``-``, None when not given."""
    if text is None:
        return None
    return sys.stdin.buffer.read() if text == "-" else text.encode()


def _schedule(c: ChronomqClient, args: argparse.Namespace) -> Outcome:
    verb = args.schedule_command
    if verb == "create":
        r = c.put_schedule(pb.Schedule(
            name=args.name, topic=args.topic, body=_body(args.body), cron=args.cron or "",
            every_s=args.every_s or 0, time_zone=args.tz, key=args.key, tag=args.tag,
            properties=properties(args.property), start_ms=args.start_ms,
            end_ms=args.end_ms, misfire=args.misfire, misfire_bound=args.misfire_bound,
            jitter_ms=args.jitter_ms), args.upsert)
        return Outcome({**_schedule_row(r.schedule), "created": r.created,
                        **({"updated": r.updated} if args.upsert else {})})
    if verb == "update":
        props = properties(args.property or []) if args.property or args.clear_properties \
            else None
        changed, updated = c.update_schedule(
            args.name, topic=args.topic, cron=args.cron, every_s=args.every_s,
            time_zone=args.tz, body=_body(args.body),
            key=args.key, tag=args.tag, properties=props, start_ms=args.start_ms,
            end_ms=args.end_ms, misfire=args.misfire, misfire_bound=args.misfire_bound,
            jitter_ms=args.jitter_ms)
        return Outcome({**_schedule_row(changed), "updated": updated})
    if verb == "list":
        rows = c.iter_schedules(args.prefix, page_token=args.page_token)
        return Outcome([_schedule_row(s) for s in itertools.islice(rows, args.limit or None)])
    if verb in ("pause", "resume"):
        changed = c.pause_schedule(args.name) if verb == "pause" else \
            c.resume_schedule(args.name)
        return Outcome(_schedule_row(changed))
    if verb == "trigger":
        t = c.trigger_schedule(args.name)
        return Outcome({"name": args.name, "message_id": t.message_id,
                        "sent_at": _local(t.tick_ms, _zone_of(c, args.name))})
    if verb == "delete":
        c.delete_schedule(args.name)
        return Outcome({"name": args.name, "deleted": True})
    fires = c.next_fires(args.name, args.count)
    zone = _zone_of(c, args.name)
    return Outcome([_local(ms, zone) for ms in fires])


def run_client(args: argparse.Namespace) -> Outcome:
    if args.command == "topic" and args.topic_command == "delete" and not args.yes:
        raise InvalidArgument(f"topic delete removes {args.name!r} and every message in it: "
                              "add --yes to confirm")
    if args.command == "schedule" and args.schedule_command == "update" and not (
            args.clear_properties or any(getattr(args, f) is not None for f in (
                "topic", "cron", "every_s", "tz", "body", "key", "tag", "property",
                "start_ms", "end_ms", "misfire", "misfire_bound", "jitter_ms"))):
        raise InvalidArgument("schedule update: give the settings to change (--cron, "
                              "--every-s, --tz, --body, ...)")
    if args.command == "send":  # input checked before connecting
        if args.replace and not args.message_id:
            raise InvalidArgument("--replace needs --id: the id of the message to replace")
        if args.if_delivered and not args.replace:
            raise InvalidArgument("--if-delivered is a setting of --replace (with --id)")
        props = properties(args.property)
        body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode()
    with ChronomqClient(args.target, args.token, args.tls_ca, args.timeout_s) as c:
        if args.command == "topic":
            return _topic(c, args)
        if args.command == "schedule":
            return _schedule(c, args)
        if args.command == "send":
            (out,) = c.send([message(args.topic, body, args.key, args.tag, props,
                                     args.deliver_at_ms, args.delay_ms, args.message_id,
                                     args.replace, args.if_delivered or "NEW_ID")])
            if not out.ok:
                return Outcome({}, [f"{status_by_number(out.error_code).name}: {out.error}"])
            sent = {"message_id": out.message_id, "deliver_at_ms": out.deliver_at_ms,
                    "duplicate": out.duplicate}
            return Outcome({**sent, "replaced": out.replaced} if args.replace else sent)
        if args.command == "pop":
            got = c.pop(args.topic, args.group, args.max, args.invisible_time_s, args.wait_ms,
                        args.tags)
            refused: list[str] = []
            if got and not args.no_ack:
                resp = c.call("Ack", pb.AckRequest(
                    group=args.group, receipt_handles=[m.receipt_handle for m in got]))
                refused = [f"ack of {m.message_id}: {_refusal(r.error)}"
                           for m, r in zip(got, resp.results, strict=True)
                           if r.HasField("error")]
            return Outcome([received_dict(m) for m in got], refused)
        if args.command in ("ack", "nack", "dead-letter"):
            return _settle(c, args)
        if args.command == "change-invisible":
            return Outcome({"receipt_handle": c.change_invisible_time(
                args.group, args.handle, args.seconds)})
        if args.command == "groups":
            return Outcome(groups(c.stats()))
        if args.command in ("cancel", "reschedule"):
            return _timer_change(c, args)
        if args.command in ("mount", "unmount"):
            topics = c.mount(args.broker) if args.command == "mount" else \
                c.unmount(args.broker)
            return Outcome({"broker": args.broker, args.command + "ed": ", ".join(topics)})
        if args.command == "takeover":
            r = c.takeover(args.broker, args.force)
            return Outcome({"broker": args.broker, "topics": len(r.topics),
                            "pending": r.pending, "groups": r.groups,
                            "seconds": round(r.seconds, 3),
                            "accepting_after_seconds": round(r.accepting_after_seconds, 3)})
        if args.command == "query":
            return Outcome([received_dict(m)
                            for m in c.query(args.topic, args.key, args.message_id)])
        return Outcome(c.stats())


def _timer_change(c: ChronomqClient, args: argparse.Namespace) -> Outcome:
    """Cancel or reschedule every pending message with the id (of ``--topic``, if given)."""
    if args.command == "cancel":
        r = c.cancel(args.message_id, args.topic)
    else:
        r = c.reschedule(args.message_id, args.deliver_at_ms, args.delay_ms, args.topic)
    out: dict[str, Any] = {"message_id": args.message_id, "outcome": r.outcome,
                           "changed": r.changed}
    if args.command == "reschedule":
        out["deliver_at_ms"] = r.deliver_at_ms
    where = f" in topic {args.topic}" if args.topic else ""
    return Outcome(out, [] if r.changed else
                   [f"{r.outcome}: no message {args.message_id}{where} is pending"])


def _check_replay_target(args: argparse.Namespace) -> None:
    """Refuse before Spark starts when a topic the replay would send to is missing."""
    wanted = ({args.into_topic} if args.into_topic else
              {t.strip() for t in args.topic.split(",") if t.strip()})
    with ChronomqClient(args.target, args.token, args.tls_ca, args.timeout_s) as c:
        have = {t.name for t in c.list_topics()}
    missing = sorted(wanted - have)
    if missing:
        raise RpcError(grpc.StatusCode.NOT_FOUND,
                       f"topic(s) {', '.join(missing)} do not exist on the broker at "
                       f"{args.target}: create them first (chronomq topic create NAME)")


def _damage_summary(damaged: list[Damage]) -> dict[str, Any]:
    return {"damaged_objects": len(damaged),
            "damaged": [{"object": d.path, "reason": d.reason} for d in damaged]}


def _damage_warnings(damaged: list[Damage], done: str) -> list[str]:
    if not damaged:
        return []
    return [*(f"damaged tier object {d.path}: {d.reason}" for d in damaged),
            f"{len(damaged)} damaged tier object(s) read in part or skipped: every intact "
            f"record was {done}, the damaged ones were not"]


def run_spark_job(args: argparse.Namespace) -> Outcome:
    require("spark", f"chronomq {args.command}")  # a base install is the client only
    if args.command == "export" and not args.overwrite and os.path.isdir(args.output) \
            and os.listdir(args.output):
        raise InvalidArgument(f"{args.output} is not empty: export replaces what it holds; "
                              "add --overwrite to confirm, or choose another --output")
    if args.command == "replay":
        _check_replay_target(args)
    from chronomq.config import load_config
    from chronomq.replay_sink import GrpcReplaySink
    from spark.datasource import TierLocation
    from spark.jobs import export, replay, select
    from spark.session import make_session
    from tiered.scan import Selection

    if args.config:
        broker = load_config(args.config)
        try:
            location = TierLocation.from_tier(broker.tier, broker.tier_local_dir())
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
    else:
        location = TierLocation(
            path="" if args.s3_bucket else args.tier_dir, s3_bucket=args.s3_bucket,
            s3_prefix=args.s3_prefix, s3_endpoint_url=args.s3_endpoint_url,
            s3_region=args.s3_region, s3_access_key_id=args.s3_access_key_id,
            s3_secret_access_key=args.s3_secret_access_key, broker=args.broker_name)
    selection = Selection(frozenset(t.strip() for t in args.topic.split(",") if t.strip()),
                          time_ms(args.start), time_ms(args.end), args.key)
    spread_ms = parse_duration_ms(args.spread) if getattr(args, "spread", "") else 0
    t0 = time.monotonic()
    spark = make_session(args.master, f"chronomq-{args.command}", ui=args.spark_ui)
    started_s = time.monotonic() - t0
    try:
        df = select(spark, location, selection)
        if args.command == "export":
            damaged: list[Damage] = []
            rows = export(spark, df, args.output, damaged=damaged)
            return Outcome({"exported": rows, "output": args.output,
                            "seconds": round(time.monotonic() - t0, 2),
                            "spark_start_seconds": round(started_s, 2),
                            **_damage_summary(damaged)}, [],
                           _damage_warnings(damaged, "exported"))
        r = replay(spark, df, GrpcReplaySink(args.target, args.token), args.into_topic,
                   spread_ms, args.rate)
        return Outcome({"selected": r.selected, "sent": r.sent, "duplicates": r.duplicates,
                        "failed": r.failed, "seconds": round(r.seconds, 2),
                        "send_seconds": round(r.send_seconds, 2),
                        "msgs_per_s": round(r.rate, 1),
                        "spark_start_seconds": round(started_s, 2),
                        **_damage_summary(list(r.damaged))},
                       [f"{r.failed} message(s) not replayed; the first: {r.first_error}"]
                       if r.failed else [], _damage_warnings(list(r.damaged), "replayed"))
    finally:
        spark.stop()
