"""The one name rule, for every name that comes from outside (chronomq API, RocketMQ
front, CLI, configuration, Spark jobs).

- A topic or group a user names is ``[A-Za-z0-9_-]{1,127}``, matched whole
  (``fullmatch``: no trailing newline slips through, no ``.``, ``/`` or ``%``).
- Names that start with ``%`` are the broker's own: ``%RETRY%<group>%<topic>`` (a
  group's retries of a topic) and ``%DLQ%<group>%<topic>`` (its dead letters), made only
  by the broker (``pop``).  Users may read them (Pop, Subscribe, QueryMessages: the
  dead-letter topic is how dead letters are inspected), never create, delete or send to
  them.

As defence in depth, ``inside(root, path)`` refuses any path built from a name that would
resolve outside the directory it belongs in, before it is opened or removed.
"""

from __future__ import annotations

import os
import re

from store.errors import InvalidArgument

MAX_NAME = 127
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# The broker's system streams, kept only when it uploads to the tier: every delayed
# record (in its own queue offsets, so the tier holds the timer's pending set), the
# journal of the consumer groups' state and the journal of the timer's changes
# (``store.journal``).  Never read or written by a client.
DELAYED_STREAM = "%SYS%delayed"
STATE_STREAM = "%SYS%state"
TIMER_STREAM = "%SYS%timer"
SYSTEM_STREAMS = (DELAYED_STREAM, STATE_STREAM, TIMER_STREAM)
# a broker's later incarnations keep their data under <name>--<n> (cluster.layout,
# cluster.rejoin): a broker name never ends so (chronomq.config)
INCARNATION_SEP = "--"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,127}")


def is_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_name(name: str, what: str = "topic") -> None:
    """Raise ``InvalidArgument`` unless ``name`` is a name a user may give a topic or group."""
    if not is_name(name):
        reserved = " (names starting with % are the broker's own)" if name[:1] == "%" else ""
        raise InvalidArgument(f"{what} name {name[:140]!r} is invalid: use 1-{MAX_NAME} "
                              f"characters from A-Z a-z 0-9 _ -{reserved}")


def split_broker_made(name: str) -> tuple[str, str, str] | None:
    """``(prefix, group, topic)`` of a retry or dead-letter topic's name, else None."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            group, sep, topic = name[len(prefix):].partition("%")
            if sep and is_name(group) and is_name(topic):
                return prefix, group, topic
    return None


def is_system_stream(name: str) -> bool:
    return name in SYSTEM_STREAMS


def check_broker_made(name: str) -> None:
    if split_broker_made(name) is None and name not in SYSTEM_STREAMS:
        raise InvalidArgument(f"{name[:140]!r} is not a retry or dead-letter topic name")


def check_readable(name: str) -> None:
    """A topic a user may read: their own, or a retry or dead-letter topic."""
    if not is_name(name) and split_broker_made(name) is None:
        check_name(name)


def inside(root: str, *parts: str) -> str:
    """``root`` joined with ``parts``; ``InvalidArgument`` if that leaves ``root``."""
    base = os.path.realpath(root)
    path = os.path.realpath(os.path.join(base, *parts))
    if path == base or not path.startswith(base + os.sep):
        raise InvalidArgument(f"{os.path.join(*parts)!r} would leave {root}")
    return path
