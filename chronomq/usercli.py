"""``chronomq user``: users and their permissions, managed through the API.

    chronomq user add NAME                        a new user; prints its token once
    chronomq user grant NAME ACTION PATTERN [--deny]
    chronomq user revoke NAME ACTION PATTERN
    chronomq user list
    chronomq user remove NAME --yes
    chronomq user whoami                          who --token names, and its permissions

ACTION is ``send``, ``consume`` or ``admin``; PATTERN a topic name, a prefix ending in
``*`` (quote it for the shell: ``'billing-*'``) or ``*`` for every topic.  Every command
but ``whoami`` needs an admin's token (``--token``: the broker's ``server.auth_token`` or
a user with admin on ``*``).  The client flags are the other commands' (``--target``,
``--token``, ``--tls-ca``, ``--timeout-s``, ``--json``).

Exit status as for every command (``chronomq.cli``): 0 done, 1 the broker refused (the
status and its message on one line), 2 bad usage or input (names and patterns are
checked here before anything is sent: ``access.model``).  A group of ``chronomq.cli``'s
``COMMAND_GROUPS``: ``add_parser(sub)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from access.model import Action, check_user_name, parse_pattern
from chronomq.cli import _client_args
from chronomq.client.client import ChronomqClient
from chronomq.client.users import UserInfo
from store.errors import InvalidArgument

ACTIONS = tuple(str(a) for a in Action)


def add_parser(sub: Any) -> None:
    u = sub.add_parser("user", help="users and their permissions (admin)")
    usub = u.add_subparsers(dest="user_command", required=True)
    ua = usub.add_parser("add", help="add a user; prints its token once")
    ua.add_argument("name", help="1-64 characters from A-Z a-z 0-9 _ -")
    _client_args(ua)
    for verb, text in (("grant", "allow (or --deny) an action on the topics a pattern "
                                 "names; replaces the user's permission on them"),
                       ("revoke", "remove the user's permission (allow or deny) on an "
                                  "action and pattern")):
        g = usub.add_parser(verb, help=text)
        g.add_argument("name", help="the user")
        g.add_argument("action", choices=ACTIONS, help="send, consume or admin")
        g.add_argument("pattern", help="a topic, a prefix ending in * ('orders-*'), or *")
        if verb == "grant":
            g.add_argument("--deny", action="store_true",
                           help="deny instead of allow (a deny wins over any allow)")
        _client_args(g)
    ul = usub.add_parser("list", help="every user with its permissions")
    _client_args(ul)
    ur = usub.add_parser("remove", help="remove a user (its token stops working at once)")
    ur.add_argument("name", help="the user")
    ur.add_argument("--yes", action="store_true", help="confirm the removal")
    _client_args(ur)
    uw = usub.add_parser("whoami", help="who --token names, and its permissions")
    _client_args(uw)


def _line(u: UserInfo) -> str:
    grants = ", ".join(" ".join(g) for g in u.permissions) or "(no permission)"
    return f"{u.name}  {grants}"


def run(args: argparse.Namespace) -> int:
    """One ``chronomq user`` command; broker refusals raise ``RpcError`` (exit 1, printed
    by ``chronomq.cli.main``), bad input ``InvalidArgument`` (exit 2) before any call."""
    command = args.user_command
    if command in ("add", "grant", "revoke", "remove"):
        check_user_name(args.name)
    if command in ("grant", "revoke"):
        parse_pattern(args.pattern)
    if command == "remove" and not args.yes:
        raise InvalidArgument(f"removing user {args.name!r} stops its token at once: "
                              "pass --yes to confirm")
    with ChronomqClient(args.target, token=args.token, tls_ca_file=args.tls_ca,
                        timeout_s=args.timeout_s) as client:
        users = client.users
        out: Any
        if command == "add":
            new = users.add(args.name)
            out = {"user": new.user.name, "token": new.token,
                   "rocketmq_access_key": new.rocketmq_access_key,
                   "rocketmq_secret_key": new.rocketmq_secret_key}
            print("the token is shown this once (the broker keeps only its SHA-256): "
                  "keep it now", file=sys.stderr)
        elif command == "grant":
            out = users.grant(args.name, args.action, args.pattern, deny=args.deny)
        elif command == "revoke":
            out = users.revoke(args.name, args.action, args.pattern)
        elif command == "list":
            out = users.all()
        elif command == "remove":
            users.remove(args.name)
            out = {"removed": args.name}
        else:
            who, everything = users.whoami()
            out = who if not everything else {"user": who.name, "all_topics": True}
    _print(out, args.json)
    return 0


def _print(out: Any, as_json: bool) -> None:
    if isinstance(out, UserInfo):
        out = [out]
    if as_json:
        value = [asdict(u) for u in out] if isinstance(out, list) else out
        print(json.dumps(value, indent=2, sort_keys=True))
    elif isinstance(out, list):
        for u in out:
            print(_line(u))
        if not out:
            print("(no user)")
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
