"""``chronomq``: run the server and talk to it.

    chronomq serve [--config FILE] [--set section.key=value ...]
    chronomq topic create|list|delete ...
    chronomq send TOPIC BODY [--key K] [--tag T] [--delay-ms N | --deliver-at-ms T]
    chronomq pop TOPIC GROUP [--max N] [--invisible-time-s S] [--wait-ms W] [--no-ack]
    chronomq ack|nack|dead-letter GROUP HANDLE... [--delay-ms N] [--reason R]
    chronomq change-invisible GROUP HANDLE SECONDS
    chronomq groups
    chronomq cancel ID
    chronomq reschedule ID (--delay-ms N | --deliver-at-ms T)
    chronomq query TOPIC (--key K | --message-id ID)
    chronomq stats
    chronomq replay --topic T [--from T0] [--to T1] [--key K] [--into-topic T2]
                    [--spread DURATION] [--rate N] [--master local[2]] [--tier-dir D]
    chronomq export --topic T [--from T0] [--to T1] [--key K] --output DIR

Client commands take ``--target``, ``--token`` and ``--json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from chronomq.client import ChronomqClient, RpcError, message
from chronomq.config import load_config
from chronomq.v1 import broker_pb2 as pb
from pop.policy import parse_duration_ms
from store.errors import ChronomqError, InvalidArgument


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="127.0.0.1:7600", help="broker address host:port")
    p.add_argument("--token", default="", help="bearer token, if the broker requires one")
    p.add_argument("--tls-ca", default="", help="CA file to verify a TLS broker")
    p.add_argument("--json", action="store_true", help="print JSON")


def _bounded(hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)  # argparse turns a ValueError into a usage error (exit 2)
        if not 0 <= value <= hi:
            raise ValueError(f"{value} is out of range (0 to {hi})")
        return value
    parse.__name__ = "number"
    return parse


_u32 = _bounded(2**32 - 1)  # counts and seconds
_ms = _bounded(2**63 - 1)  # times and durations in ms


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="chronomq", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the broker")
    s.add_argument("--config", help="TOML config file")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting (repeatable)")
    s.add_argument("--log-level", default="INFO")

    t = sub.add_parser("topic", help="create, list or delete topics")
    tsub = t.add_subparsers(dest="topic_command", required=True)
    tc = tsub.add_parser("create")
    tc.add_argument("name")
    tc.add_argument("--queues", type=_u32, default=0, help="queue count (default: broker's)")
    tc.add_argument("--retention-ms", type=_ms, default=0, help="local retention")
    tc.add_argument("--tier-retention-ms", type=_ms, default=0,
                    help="how long the tier keeps the topic (default: tier.retention_ms)")
    _client_args(tc)
    tl = tsub.add_parser("list")
    _client_args(tl)
    td = tsub.add_parser("delete")
    td.add_argument("name")
    _client_args(td)

    se = sub.add_parser("send", help="send one message")
    se.add_argument("topic")
    se.add_argument("body", help="message body (UTF-8); '-' reads stdin")
    se.add_argument("--key", default="")
    se.add_argument("--tag", default="")
    se.add_argument("--property", action="append", default=[], metavar="NAME=VALUE")
    when = se.add_mutually_exclusive_group()
    when.add_argument("--delay-ms", type=_ms)
    when.add_argument("--deliver-at-ms", type=_ms)
    _client_args(se)

    po = sub.add_parser("pop", help="pop messages (and ack them unless --no-ack)")
    po.add_argument("topic")
    po.add_argument("group")
    po.add_argument("--max", type=_u32, default=16)
    po.add_argument("--invisible-time-s", type=_u32, default=30)
    po.add_argument("--wait-ms", type=_u32, default=0)
    po.add_argument("--tags", default="", help="tag expression: '*' or 'a || b'")
    po.add_argument("--no-ack", action="store_true")
    _client_args(po)

    for name, what in (("ack", "acknowledge leased messages"),
                       ("nack", "give leased messages back (the group's back-off by default)"),
                       ("dead-letter", "move leased messages to the group's dead-letter topic")):
        settle = sub.add_parser(name, help=what)
        settle.add_argument("group")
        settle.add_argument("handles", nargs="+", metavar="HANDLE")
        if name == "nack":
            settle.add_argument("--delay-ms", type=_ms)
        if name == "dead-letter":
            settle.add_argument("--reason", default="")
        _client_args(settle)

    ci = sub.add_parser("change-invisible", help="move a lease's deadline (0: visible now)")
    ci.add_argument("group")
    ci.add_argument("handle")
    ci.add_argument("seconds", type=_u32)
    _client_args(ci)

    gr = sub.add_parser("groups", help="per consumer group: in flight, backlog, lag, ...")
    _client_args(gr)

    ca = sub.add_parser("cancel", help="cancel a pending delayed message")
    ca.add_argument("message_id")
    _client_args(ca)

    rs = sub.add_parser("reschedule", help="move a pending delayed message")
    rs.add_argument("message_id")
    rwhen = rs.add_mutually_exclusive_group(required=True)
    rwhen.add_argument("--delay-ms", type=_ms)
    rwhen.add_argument("--deliver-at-ms", type=_ms)
    _client_args(rs)

    q = sub.add_parser("query", help="find messages by key or message id")
    q.add_argument("topic", nargs="?", default="")
    q.add_argument("--key", default="")
    q.add_argument("--message-id", default="")
    _client_args(q)

    st = sub.add_parser("stats", help="print broker figures")
    _client_args(st)

    rp = sub.add_parser("replay", help="replay a backlog from the tier into a live broker "
                        "(a Spark job)")
    _selection_args(rp)
    rp.add_argument("--into-topic", default="", help="send to this topic (default: the "
                    "message's own)")
    rp.add_argument("--spread", default="", metavar="DURATION",
                    help="re-time deliveries evenly over this span, e.g. 20m")
    rp.add_argument("--rate", type=float, default=0, metavar="N",
                    help="cap the total send rate at N msgs/s")
    _client_args(rp)
    ex = sub.add_parser("export", help="write a backlog from the tier as Parquet "
                        "(a Spark job)")
    _selection_args(ex)
    ex.add_argument("--output", required=True, help="Parquet directory (replaced)")
    ex.add_argument("--json", action="store_true", help="print JSON")
    return ap


def _selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="topic(s) to select, comma-separated")
    p.add_argument("--from", dest="start", default="",
                   help="stored at or after: epoch ms or ISO-8601 (default: the start)")
    p.add_argument("--to", dest="end", default="",
                   help="stored before: epoch ms or ISO-8601 (default: the end)")
    p.add_argument("--key", default="", help="only messages with this key")
    p.add_argument("--tier-dir", default="./chronomq-tier", help="local-directory tier")
    p.add_argument("--s3-bucket", default="", help="read an S3 tier instead")
    p.add_argument("--s3-prefix", default="")
    p.add_argument("--s3-endpoint-url", default="")
    p.add_argument("--s3-region", default="us-east-1")
    p.add_argument("--s3-access-key-id", default="")
    p.add_argument("--s3-secret-access-key", default="")
    p.add_argument("--broker-name", default="broker-0", help="whose tier layout to read")
    p.add_argument("--config", default="", metavar="TOML",
                   help="read the tier the broker with this config file writes to "
                        "(its [tier] and store.data_dir; instead of --tier-dir / --s3-*)")
    p.add_argument("--master", default="local[2]", help="local[N] or a cluster URL")
    p.add_argument("--spark-ui", action="store_true", help="keep Spark's web UI on")


def _time_ms(text: str) -> int:
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


def _run_spark_job(args: argparse.Namespace) -> Any:
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
                          _time_ms(args.start), _time_ms(args.end), args.key)
    spread_ms = parse_duration_ms(args.spread) if getattr(args, "spread", "") else 0
    t0 = time.monotonic()
    spark = make_session(args.master, f"chronomq-{args.command}", ui=args.spark_ui)
    started_s = time.monotonic() - t0
    try:
        df = select(spark, location, selection)
        if args.command == "export":
            rows = export(spark, df, args.output)
            return {"exported": rows, "output": args.output,
                    "seconds": round(time.monotonic() - t0, 2),
                    "spark_start_seconds": round(started_s, 2)}
        r = replay(spark, df, args.target, args.into_topic, spread_ms, args.rate, args.token)
        return {"selected": r.selected, "sent": r.sent, "duplicates": r.duplicates,
                "failed": r.failed, "seconds": round(r.seconds, 2),
                "spark_start_seconds": round(started_s, 2)}
    finally:
        spark.stop()


def _received_dict(m: pb.ReceivedMessage) -> dict[str, Any]:
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


def _run_client(args: argparse.Namespace) -> Any:
    with ChronomqClient(args.target, args.token, args.tls_ca) as c:
        if args.command == "topic":
            if args.topic_command == "create":
                created = c.create_topic(args.name, args.queues, args.retention_ms,
                                         tier_retention_ms=args.tier_retention_ms)
                return {"topic": args.name, "created": created}
            if args.topic_command == "delete":
                c.delete_topic(args.name)
                return {"topic": args.name, "deleted": True}
            return [{"name": t.name, "queue_count": t.queue_count,
                     "retention_ms": t.retention_ms,
                     "tier_retention_ms": t.tier_retention_ms} for t in c.list_topics()]
        if args.command == "send":
            body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode()
            props = dict(p.split("=", 1) for p in args.property)
            (out,) = c.send([message(args.topic, body, args.key, args.tag, props,
                                     args.deliver_at_ms, args.delay_ms)])
            if not out.ok:
                raise ChronomqError(out.error)
            return {"message_id": out.message_id, "deliver_at_ms": out.deliver_at_ms}
        if args.command == "pop":
            got = c.pop(args.topic, args.group, args.max, args.invisible_time_s, args.wait_ms,
                        args.tags)
            if got and not args.no_ack:
                errors = [e for e in c.ack(args.group, [m.receipt_handle for m in got]) if e]
                if errors:
                    raise ChronomqError("ack failed: " + "; ".join(errors))
            return [_received_dict(m) for m in got]
        if args.command in ("ack", "nack", "dead-letter"):
            if args.command == "ack":
                errors = c.ack(args.group, args.handles)
            elif args.command == "nack":
                errors = c.nack(args.group, args.handles, args.delay_ms)
            else:
                errors = c.dead_letter(args.group, args.handles, args.reason)
            return [{"receipt_handle": h, "ok": not e, "error": e}
                    for h, e in zip(args.handles, errors, strict=True)]
        if args.command == "change-invisible":
            return {"receipt_handle": c.change_invisible_time(args.group, args.handle,
                                                              args.seconds)}
        if args.command == "groups":
            return _groups(c.stats())
        if args.command == "cancel":
            return {"message_id": args.message_id, "outcome": c.cancel(args.message_id)}
        if args.command == "reschedule":
            outcome, due = c.reschedule(args.message_id, args.deliver_at_ms, args.delay_ms)
            return {"message_id": args.message_id, "outcome": outcome, "deliver_at_ms": due}
        if args.command == "query":
            return [_received_dict(m) for m in c.query(args.topic, args.key, args.message_id)]
        return c.stats()


def _groups(figures: dict[str, float]) -> list[dict[str, Any]]:
    """Rows of the ``group.<group>.<topic>.<figure>`` figures (group names hold no dot,
    topic names may)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, value in figures.items():
        if name.startswith("group."):
            group, rest = name[len("group."):].split(".", 1)
            topic, figure = rest.rsplit(".", 1)
            rows.setdefault((group, topic), {"group": group, "topic": topic})[figure] = int(value)
    return [rows[k] for k in sorted(rows)]


def _print(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif isinstance(result, list):
        for item in result:
            print("  ".join(f"{k}={v}" for k, v in item.items() if v not in ("", {}, 0)))
        if not result:
            print("(none)")
    elif isinstance(result, dict):
        for k, v in sorted(result.items()):
            print(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            logging.basicConfig(level=args.log_level.upper(),
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            from chronomq.server import serve

            serve(load_config(args.config, args.set))
            return 0
        if args.command in ("replay", "export"):
            _print(_run_spark_job(args), args.json)
            return 0
        _print(_run_client(args), args.json)
        return 0
    except RpcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ChronomqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
