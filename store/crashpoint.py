"""Named crash points: ``crashpoint("commitlog.after_fsync")`` marks a durable step.

Off (the default) a crash point is one dictionary lookup that finds nothing.  Armed with
``arm(label, nth)`` (the composition root does it from the ``server.crash_at`` setting,
``"label:N"``), the Nth time the process passes that label it writes one line to stderr
and leaves at once with ``os._exit(CRASH_EXIT_CODE)``: no ``finally`` blocks, no
flushes, no atexit handlers, the same state a kill -9 at that instant leaves behind.
Tests walk ``LABELS`` to crash the broker at every durable step in turn (the way
FoundationDB's BUGGIFY points are enabled one at a time).

Every label used in the code is listed in ``LABELS`` with the step it follows; ``arm``
refuses a label that is not there, so a misspelt setting fails loudly.

Thread-safe: a hit counter is updated under a lock, only for the armed label.
"""

from __future__ import annotations

import os
import sys
import threading

CRASH_EXIT_CODE = 86

LABELS: dict[str, str] = {
    "commitlog.after_write": "a batch written to its segment, not yet fsynced",
    "commitlog.after_fsync": "a batch fsynced, before any caller is answered",
    "commitlog.after_roll": "a new segment created, before the batch is written to it",
    "commitlog.checkpoint": "the CommitLog checkpoint file replaced",
    "consumequeue.after_write": "ConsumeQueue entries written, not yet fsynced",
    "consumequeue.checkpoint": "ConsumeQueue files fsynced and their checkpoint written",
    "index.after_write": "key-index entries and their position written",
    "timer.after_add": "delayed records (or parked ids) written to the timer store",
    "timer.after_flat_write": "a TimerFlatFile object written to the tier",
    "timer.after_preload": "a TimerFlatFile bucket's entries synced into the timer store",
    "timer.after_bucket_delete": "a preloaded TimerFlatFile bucket deleted from the tier",
    "timer.after_deliver_append": "due messages durable under their topic, timer entries kept",
    "timer.after_deliver_remove": "delivered messages' timer entries removed (by the "
                                  "dispatcher, with its position)",
    "debounce.after_append": "a replacing message durable, the ones it replaces not yet "
                             "cancelled",
    "schedule.after_send": "a step's schedule ticks durable, the schedules not yet moved "
                           "past them",
    "pop.after_checkpoint": "a Pop's leases durable, before the messages leave the broker",
    "pop.after_ack": "acks durable, before the consumer is answered",
    "pop.after_change_invisible": "a new lease deadline durable, before the answer",
    "pop.after_copy_append": "retry / dead-letter copies durable, leases not yet marked done",
    "pop.after_mark_done": "revived or released leases marked done",
    "tier.after_upload": "a queue's batch uploaded to the tier, metadata not yet saved",
    "tier.checkpoint": "tier metadata and the tier checkpoint saved",
    "tier.after_commit_record": "durable-ack: a lease write carrying queue metadata in the "
                                "tier, those metadata copies not yet written",
    "timer_snapshot.after_parts": "a timer snapshot's parts written, no residual, no pointer",
    "timer_snapshot.after_pointer": "a timer snapshot pointed at, older snapshots still there",
    "timer_snapshot.before_delete": "the lease confirmed, older timer snapshots not yet deleted",
    "tier_retention.after_metadata": "segments below retention or a floor gone from the tier "
                                     "queues' metadata, their objects not yet deleted",
    "tier_retention.mid_delete": "the lease confirmed, some of the doomed objects deleted",
    "tier_fold.after_object": "a fold of small tier objects written, not yet listed",
    "tier_fold.after_metadata": "a fold listed in the queue's metadata (saved), the "
                                "objects it replaced still there",
    "tier_fold.mid_delete": "the lease confirmed, objects a fold replaced being deleted",
    "topic.after_claim": "a topic's owner record claimed in the tier, the topic not created",
    "topic.after_create": "a topic created here (its log fsynced), not in the tier's copy",
    "topic.after_catalogue": "the catalogue's copy naming a topic change in the tier, the "
                             "fence not passed",
    "topic.after_delete": "a topic deleted here (its log fsynced), the copy not written",
    "topic.after_forget": "a deleted topic's positions and retry topics dropped, its owner "
                          "record not released",
    "takeover.after_intent": "the intent to take a broker over in the tier, not claimed yet",
    "takeover.after_claim": "a takeover won (the departed lease's taken_by), nothing taken yet",
    "takeover.after_positions": "the departed broker's positions and leases written here",
    "takeover.after_topics": "its topics created here (held), continuing its offsets",
    "takeover.after_timers": "its pending delayed messages adopted here",
    "takeover.after_done": "the takeover recorded done in the tier, topics still held",
    "takeover.after_owners": "its topics' owner records name this broker",
}

_lock = threading.Lock()
_armed: dict[str, int] = {}  # label -> hits left before the crash


def arm(label: str, nth: int = 1) -> None:
    """Crash at the ``nth`` hit of ``label`` (1: the first)."""
    if label not in LABELS:
        raise ValueError(f"unknown crash point {label!r}; known: {', '.join(sorted(LABELS))}")
    if nth < 1:
        raise ValueError("a crash point's hit number starts at 1")
    with _lock:
        _armed[label] = nth


def arm_from_setting(setting: str) -> None:
    """``"label"`` or ``"label:N"`` (empty: nothing armed)."""
    if not setting:
        return
    label, _, nth = setting.partition(":")
    try:
        n = int(nth) if nth else 1
    except ValueError as exc:
        raise ValueError(f"crash point setting {setting!r} is not 'label' or 'label:N'") from exc
    arm(label, n)


def disarm() -> None:
    with _lock:
        _armed.clear()


def crashpoint(label: str) -> None:
    """Leave the process at once if ``label`` is armed and this is its chosen hit."""
    if not _armed or label not in _armed:
        return
    with _lock:
        left = _armed.get(label)
        if left is None:
            return
        if left > 1:
            _armed[label] = left - 1
            return
    sys.stderr.write(f"crash point {label} reached: exiting now\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)
