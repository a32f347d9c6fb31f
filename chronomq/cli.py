"""``chronomq``: run the server and talk to it.

    chronomq serve [--config FILE] [--set section.key=value ...]
    chronomq topic create|list|delete ...
    chronomq send TOPIC BODY [--key K] [--tag T] [--delay-ms N | --deliver-at-ms T]
    chronomq pop TOPIC GROUP [--max N] [--invisible-time-s S] [--wait-ms W] [--no-ack]
    chronomq ack|nack|dead-letter GROUP HANDLE... [--delay-ms N] [--reason R]
    chronomq change-invisible GROUP HANDLE SECONDS
    chronomq groups
    chronomq cancel ID [--topic T]
    chronomq reschedule ID (--delay-ms N | --deliver-at-ms T) [--topic T]
    chronomq query TOPIC (--key K | --message-id ID)
    chronomq stats
    chronomq mount|unmount BROKER
    chronomq takeover BROKER [--force]
    chronomq user add|grant|revoke|list|remove|whoami ...  (chronomq.usercli)
    chronomq replay --topic T [--from T0] [--to T1] [--key K] [--into-topic T2]
                    [--spread DURATION] [--rate N] [--master local[2]] [--tier-dir D]
    chronomq export --topic T [--from T0] [--to T1] [--key K] --output DIR [--overwrite]

Client commands take --target, --token, --tls-ca, --timeout-s and --json.

Exit status: 0 done; 1 the broker refused or failed (the status code name and its
message on stderr; for UNAVAILABLE the address tried); 2 bad usage or input (nothing was
sent).  Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import grpc

from chronomq.client.client import RpcError
from chronomq.commands import Outcome, run_client, run_spark_job
from chronomq.extras import require
from store.errors import ChronomqError

# groups of subcommands kept in modules of their own: each module has
# ``add_parser(sub)`` (registers its subcommand) and ``run(args) -> int`` (its exit status)
COMMAND_GROUPS: dict[str, str] = {"cluster": "chronomq.devcluster"}
COMMAND_GROUPS["user"] = "chronomq.usercli"  # users and permissions

UNAVAILABLE_HINT = ("  (no broker answered at {target}: is `chronomq serve` running there? "
                    "Start one with `chronomq serve`, or pass --target HOST:PORT)")


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="127.0.0.1:7600", help="broker address host:port")
    p.add_argument("--token", default="", help="bearer token, if the broker requires one")
    p.add_argument("--tls-ca", default="", help="CA file to verify a TLS broker")
    p.add_argument("--timeout-s", type=_positive_float, default=30.0,
                   help="give up on a call after this many seconds (default 30)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _timer_topic_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", default="", help="only the pending messages of this topic "
                   "(a group's retry copies: %%RETRY%%GROUP%%TOPIC); default: every topic")


def _bounded(hi: int, lo: int = 0) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)  # argparse turns a ValueError into a usage error (exit 2)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range ({lo} to {hi})")
        return value
    parse.__name__ = "number"
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):  # also refuses nan
        raise ValueError(f"{text} is not a finite number >= 0")
    return value


_positive_float.__name__ = "number"
_u32 = _bounded(2**32 - 1)  # counts and seconds
_ms = _bounded(2**63 - 1)  # times and durations in ms


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="chronomq", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    for module in COMMAND_GROUPS.values():
        importlib.import_module(module).add_parser(sub)

    s = sub.add_parser("serve", help="run the broker")
    s.add_argument("--config", help="TOML config file")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting (repeatable)")
    s.add_argument("--log-level", default="INFO",
                   help="DEBUG, INFO (default: one line per meaningful event), WARNING")

    t = sub.add_parser("topic", help="create, list or delete topics")
    tsub = t.add_subparsers(dest="topic_command", required=True)
    tc = tsub.add_parser("create", help="create a topic (no error if it exists the same)")
    tc.add_argument("name", help="topic name (letters, digits, . _ - %% |)")
    tc.add_argument("--queues", type=_u32, default=0, help="queue count (default: broker's)")
    tc.add_argument("--retention-ms", type=_ms, default=0, help="local retention")
    tc.add_argument("--tier-retention-ms", type=_ms, default=0,
                    help="how long the tier keeps the topic (default: tier.retention_ms)")
    _client_args(tc)
    tl = tsub.add_parser("list", help="list topics")
    _client_args(tl)
    td = tsub.add_parser("delete", help="delete a topic (needs --yes)")
    td.add_argument("name", help="topic to delete with all its messages")
    td.add_argument("--yes", action="store_true", help="confirm the deletion")
    _client_args(td)

    se = sub.add_parser("send", help="send one message")
    se.add_argument("topic", help="topic to send to (it must exist)")
    se.add_argument("body", help="message body (UTF-8); '-' reads stdin")
    se.add_argument("--key", default="", help="message key (for query --key)")
    se.add_argument("--tag", default="", help="tag consumers can filter on")
    se.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                    help="a user property (repeatable)")
    when = se.add_mutually_exclusive_group()
    when.add_argument("--delay-ms", type=_ms, help="deliver this many ms from now")
    when.add_argument("--deliver-at-ms", type=_ms, help="deliver at this epoch ms")
    se.add_argument("--id", default="", dest="message_id",
                    help="a client-chosen message id (sent again within the dedupe window: "
                         "a duplicate, not stored)")
    se.add_argument("--replace", action="store_true",
                    help="with --id: replace the messages with that id still pending in "
                         "the topic (debounce)")
    se.add_argument("--if-delivered", choices=("NEW_ID", "REFUSE"), default=None,
                    help="with --replace, when the id's message was delivered already: "
                         "store this one as the id's next generation <id>~N (NEW_ID, the "
                         "default) or refuse it (REFUSE)")
    _client_args(se)

    sc = sub.add_parser("schedule", help="recurring schedules: a message at each tick")
    ssub = sc.add_subparsers(dest="schedule_command", required=True)
    scc = ssub.add_parser("create", help="create a schedule (cron or a fixed interval)")
    scc.add_argument("name", help="the schedule's name (its ticks' ids: NAME@<tick ms>)")
    _schedule_settings(scc, update=False)
    scc.add_argument("--upsert", action="store_true", help="a schedule of that name with "
                     "other settings is updated in place (else: refused)")
    _client_args(scc)
    scu = ssub.add_parser("update", help="change a schedule in place (only the settings "
                          "given): ticks sent stay sent, the next follows the new rule")
    scu.add_argument("name", help="the schedule's name")
    _schedule_settings(scu, update=True)
    scu.add_argument("--clear-properties", action="store_true",
                     help="remove every message property (with --property: only those)")
    _client_args(scu)
    sl = ssub.add_parser("list", help="list schedules with their next fire times (all of "
                         "them, page after page)")
    sl.add_argument("--prefix", default="", help="only names starting with this")
    sl.add_argument("--page-token", default="", metavar="NAME",
                    help="start after this name (the last one a list showed)")
    sl.add_argument("--limit", type=_u32, default=0, help="at most this many (0: all)")
    _client_args(sl)
    for verb, text in (("pause", "stop sending ticks"), ("resume", "send ticks again, "
                       "from the next one after now"), ("delete", "delete a schedule"),
                       ("trigger", "send one tick now (its id: NAME!<now ms>)")):
        sv = ssub.add_parser(verb, help=text)
        sv.add_argument("name", help="the schedule's name")
        _client_args(sv)
    sn = ssub.add_parser("next", help="the next fire times")
    sn.add_argument("name", help="the schedule's name")
    sn.add_argument("--count", type=_bounded(1000, lo=1), default=10,
                    help="how many (1 to 1000; default 10)")
    _client_args(sn)

    po = sub.add_parser("pop", help="pop messages (and ack them unless --no-ack)")
    po.add_argument("topic", help="topic to pop from")
    po.add_argument("group", help="consumer group (its own position and leases)")
    po.add_argument("--max", type=_u32, default=16, help="at most this many messages")
    po.add_argument("--invisible-time-s", type=_u32, default=30,
                    help="lease: invisible to others this long unless acked")
    po.add_argument("--wait-ms", type=_u32, default=0,
                    help="long poll: wait this long for a message (default: answer at once)")
    po.add_argument("--tags", default="", help="tag expression: '*' or 'a || b'")
    po.add_argument("--no-ack", action="store_true",
                    help="keep the leases (ack, nack or let them run out later)")
    _client_args(po)

    for name, what in (("ack", "acknowledge leased messages"),
                       ("nack", "give leased messages back (the group's back-off by default)"),
                       ("dead-letter", "move leased messages to the group's dead-letter topic")):
        settle = sub.add_parser(name, help=what)
        settle.add_argument("group", help="consumer group that holds the leases")
        settle.add_argument("handles", nargs="+", metavar="HANDLE",
                            help="receipt handle(s) from pop")
        if name == "nack":
            settle.add_argument("--delay-ms", type=_ms,
                                help="visible again after this (default: the group's back-off)")
        if name == "dead-letter":
            settle.add_argument("--reason", default="",
                                help="kept as a property of the dead letter")
        _client_args(settle)

    ci = sub.add_parser("change-invisible", help="move a lease's deadline (0: visible now)")
    ci.add_argument("group", help="consumer group that holds the lease")
    ci.add_argument("handle", help="receipt handle from pop")
    ci.add_argument("seconds", type=_u32, help="new deadline: now + this (0: visible now)")
    _client_args(ci)

    gr = sub.add_parser("groups", help="per consumer group: in flight, backlog, lag, ...")
    _client_args(gr)

    ca = sub.add_parser("cancel", help="cancel the pending delayed messages with an id")
    ca.add_argument("message_id", help="id answered by send")
    _timer_topic_arg(ca)
    _client_args(ca)

    rs = sub.add_parser("reschedule", help="move the pending delayed messages with an id")
    rs.add_argument("message_id", help="id answered by send")
    _timer_topic_arg(rs)
    rwhen = rs.add_mutually_exclusive_group(required=True)
    rwhen.add_argument("--delay-ms", type=_ms, help="deliver this many ms from now")
    rwhen.add_argument("--deliver-at-ms", type=_ms, help="deliver at this epoch ms")
    _client_args(rs)

    q = sub.add_parser("query", help="find messages by key or message id")
    q.add_argument("topic", nargs="?", default="", help="topic (needed with --key)")
    q.add_argument("--key", default="", help="messages with this key")
    q.add_argument("--message-id", default="", help="the message with this id (any topic)")
    _client_args(q)

    st = sub.add_parser("stats", help="print broker figures")
    _client_args(st)

    for name, what in (("mount", "serve another broker's topics read-only from the shared "
                                 "tier (until unmount or restart; tier.mounts keeps it)"),
                       ("unmount", "stop serving a mounted broker's topics")):
        mo = sub.add_parser(name, help=what)
        mo.add_argument("broker", help="that broker's tier.broker_name")
        _client_args(mo)

    tk = sub.add_parser("takeover", help="become the owner of a departed broker's topics, "
                        "consumer positions and pending delayed messages (from the shared tier)")
    tk.add_argument("broker", help="the departed broker's tier.broker_name")
    tk.add_argument("--force", action="store_true",
                    help="even if it wrote to the tier within the last minute")
    _client_args(tk)

    rp = sub.add_parser("replay", help="replay a backlog from the tier into a live broker "
                        "(a Spark job)")
    _selection_args(rp)
    rp.add_argument("--into-topic", default="", help="send to this topic (default: the "
                    "message's own)")
    rp.add_argument("--spread", default="", metavar="DURATION",
                    help="re-time deliveries evenly over this span, e.g. 20m")
    rp.add_argument("--rate", type=_positive_float, default=0, metavar="N",
                    help="cap the total send rate at N msgs/s")
    _client_args(rp)
    ex = sub.add_parser("export", help="write a backlog from the tier as Parquet "
                        "(a Spark job)")
    _selection_args(ex)
    ex.add_argument("--output", required=True, help="Parquet directory to write")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace what --output holds (refused without it)")
    ex.add_argument("--json", action="store_true", help="print JSON")
    return ap


def _schedule_settings(p: argparse.ArgumentParser, update: bool) -> None:
    """The flags of a schedule's settings: create's defaults, or (update) none: only
    those given change."""
    def default(value: object) -> object:
        return None if update else value
    p.add_argument("--topic", required=not update, help="topic each tick is sent to")
    every = p.add_mutually_exclusive_group(required=not update)
    every.add_argument("--cron", help='five crontab fields or a macro, e.g. "0 9 * * 1-5"')
    every.add_argument("--every-s", type=_bounded(10 * 366 * 86_400),
                       help="a fixed interval in seconds")
    p.add_argument("--tz", default=default("UTC"), help="IANA time zone, e.g. Europe/Berlin")
    p.add_argument("--body", required=not update, default=None,
                   help="the message body (UTF-8); '-' reads stdin")
    p.add_argument("--key", default=default(""), help="the message key")
    p.add_argument("--tag", default=default(""), help="the message tag")
    p.add_argument("--property", action="append", default=default([]),
                   metavar="NAME=VALUE", help="a message property (repeatable)")
    p.add_argument("--start-ms", type=_ms, default=default(0), help="no tick before "
                   "(epoch ms; 0: from now)")
    p.add_argument("--end-ms", type=_ms, default=default(0), help="no tick after (epoch "
                   "ms; 0: no end)")
    p.add_argument("--misfire", choices=("skip", "once", "all"), default=default("once"),
                   help="ticks missed while no broker ran: none, the latest, or all")
    p.add_argument("--misfire-bound", type=_bounded(10_000), default=default(0),
                   help="with --misfire all: at most this many (default 100)")
    p.add_argument("--jitter-ms", type=_bounded(3_600_000), default=default(0),
                   help="deliver each tick up to this much after it, the same offset for "
                        "the same tick (0: none)")


def _selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="topic(s) to select, comma-separated")
    p.add_argument("--from", dest="start", default="",
                   help="stored at or after: epoch ms or ISO-8601 (default: the start)")
    p.add_argument("--to", dest="end", default="",
                   help="stored before: epoch ms or ISO-8601 (default: the end)")
    p.add_argument("--key", default="", help="only messages with this key")
    p.add_argument("--tier-dir", default="./chronomq-tier", help="local-directory tier")
    p.add_argument("--s3-bucket", default="", help="read an S3 tier instead")
    p.add_argument("--s3-prefix", default="", help="key prefix inside the bucket")
    p.add_argument("--s3-endpoint-url", default="",
                   help="S3-compatible endpoint (default: AWS)")
    p.add_argument("--s3-region", default="us-east-1", help="S3 region")
    p.add_argument("--s3-access-key-id", default="",
                   help="default: boto3's credential chain")
    p.add_argument("--s3-secret-access-key", default="", help="with --s3-access-key-id")
    p.add_argument("--broker-name", default="broker-0",
                   help="the broker(s) whose tier to read: a name (every incarnation of it),"
                   " a comma-separated list, or * (every broker)")
    p.add_argument("--config", default="", metavar="TOML",
                   help="read the tier the broker with this config file writes to "
                        "(its [tier] and store.data_dir; instead of --tier-dir / --s3-*)")
    p.add_argument("--master", default="local[2]", help="local[N] or a cluster URL")
    p.add_argument("--spark-ui", action="store_true", help="keep Spark's web UI on")


def _print(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif isinstance(result, list):  # one line a record: k=v pairs, or the value itself
        for item in result:
            print("  ".join(f"{k}={v}" for k, v in item.items() if v not in ("", {}))
                  if isinstance(item, dict) else item)
        if not result:
            print("(none)")
    elif isinstance(result, dict):
        for k, v in sorted(result.items()):
            text = json.dumps(v) if isinstance(v, list | dict) else f"{v}"
            print(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {text}")


def configure_logging(level_name: str) -> None:
    """One line per meaningful event at INFO: APScheduler's per-run lines ("Running job",
    "executed successfully") only at DEBUG."""
    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        raise ChronomqError(f"--log-level {level_name!r}: use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(level if level <= logging.DEBUG
                                              else max(level, logging.WARNING))


def _serve(args: argparse.Namespace) -> None:
    """The broker: the server extra first (a base install is the client only), then the
    config, then the RocketMQ extra when the config turns the front on."""
    require("server", "the broker")
    from chronomq.config import load_config  # the store's modules: RocksDB, APScheduler

    config = load_config(args.config, args.set)
    if config.rocketmq.enabled:
        require("rocketmq", "the RocketMQ 5 front (rocketmq.enabled)")
    configure_logging(args.log_level)
    from chronomq.server import serve

    serve(config)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # bad usage: argparse prints it and exits 2
    try:
        if args.command in COMMAND_GROUPS:
            exit_status: int = importlib.import_module(COMMAND_GROUPS[args.command]).run(args)
            return exit_status
        if args.command == "serve":
            _serve(args)
            return 0
        outcome: Outcome = (run_spark_job(args) if args.command in ("replay", "export")
                            else run_client(args))
    except RpcError as exc:
        print(f"error: {exc.code.name}: {exc.details}", file=sys.stderr)
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            print(UNAVAILABLE_HINT.format(target=getattr(args, "target", "")), file=sys.stderr)
        return 1
    except ChronomqError as exc:  # found before anything was sent
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file named on the command line
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    _print(outcome.value, args.json)
    for line in outcome.warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in outcome.refused:
        print(f"error: {line}", file=sys.stderr)
    return 1 if outcome.refused else 0


if __name__ == "__main__":
    sys.exit(main())
