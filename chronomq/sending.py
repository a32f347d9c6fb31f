"""The write path of a send, between the fronts and the store: delivery times, the
dedupe window of client-chosen ids, the topics a takeover holds, and the wait for an OK.

Every front sends through here (the gRPC servicer, the RocketMQ front, a debounce's
replace, the recurring schedules' ticks): ``resolve_deliver_at`` and ``check`` before
anything is allocated, ``submit`` to queue the drafts for the CommitLog writer (a
client-chosen id its topic accepted within ``store.dedupe_window_ms`` is a duplicate,
not stored again: ``chronomq.dedupe``), ``stored`` to wait until they are durable and
past the Fence (docs/DESIGN.md, "Every OK and its gate").  Thread-safe.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import NamedTuple

from chronomq.dedupe import SendDedupe
from store.disk import DiskGuard
from store.errors import FailedPrecondition, InvalidArgument
from store.journal import StateJournal
from store.message import FLAG_DELAYED, DispatchInfo, Draft
from store.store import MessageStore
from tiered.dispatcher import TieredDispatcher
from timer.service import TimerService


class Submission(NamedTuple):
    """Drafts on their way into the store (``Sender.submit``)."""

    duplicate: list[bool]  # per draft: a repeat of a recent client-chosen id, not stored
    future: Future[list[DispatchInfo]] | None  # the others, in order; None if none
    claimed: list[tuple[str, str]]  # (topic, client-chosen id) of the others
    end: Future[int] | None  # where the others end in the CommitLog, for their repeats
    originals: list[Future[int]]  # where the messages the duplicates repeat end (``stored``)


class Sender:
    """See the module docstring."""

    def __init__(self, store: MessageStore, disk: DiskGuard, dedupe: SendDedupe,
                 journal: StateJournal, tiered: TieredDispatcher | None,
                 timer: TimerService, timer_enabled: bool) -> None:
        self._store, self._disk, self._dedupe = store, disk, dedupe
        self._journal, self._tiered = journal, tiered
        self._timer, self._timer_enabled = timer, timer_enabled

    def resolve_deliver_at(self, deliver_at_ms: int, delay_ms: int,
                           now_ms: int) -> tuple[int, int]:
        """``(due time, record flags)`` of a message sent at ``now_ms``, or raise for an
        impossible one.  A time in the past or within the current millisecond is now."""
        if delay_ms < 0:
            raise InvalidArgument(f"delay_ms must not be negative (got {delay_ms})")
        if deliver_at_ms < 0:
            raise InvalidArgument(f"deliver_at_ms must not be negative (got {deliver_at_ms})")
        due = now_ms + delay_ms if delay_ms else max(deliver_at_ms, now_ms)
        if due <= now_ms:
            return now_ms, 0
        if not self._timer_enabled:
            raise FailedPrecondition(
                "delayed delivery is turned off on this broker (timer.enabled = false): "
                "send without deliver_at_ms/delay_ms")
        self._timer.check_delay(due, now_ms)
        return due, FLAG_DELAYED

    def check(self, m: Draft) -> None:
        """Raise for a draft that cannot be stored (``MessageStore.check``)."""
        self._store.check(m)

    def send(self, drafts: list[Draft]) -> Future[list[DispatchInfo]]:
        """Append checked drafts; resolves once they are durable."""
        return self._store.put_drafts(drafts)

    def submit(self, drafts: list[Draft], now_ms: int, dedupe: bool = True) -> Submission:
        """Append checked drafts, except those whose client-chosen id their topic accepted
        within the dedupe window (``dedupe=False``: all of them, as a debounce's replacing
        message is).  Pass the result to ``stored``."""
        holds = self._store.holds
        if holds.active():  # a topic a takeover still adopts takes no send, nor a
            for d in drafts:  # debounce's replace (``store.holds``)
                holds.check(d.topic)
        self._disk.check_send(sum(len(d.body) for d in drafts))
        chosen = [(d.topic, d.message_id) for d in drafts if d.message_id] if dedupe else []
        duplicate = [False] * len(drafts)
        end: Future[int] | None = None
        originals: list[Future[int]] = []
        if chosen:
            end = Future()
            seen = iter(self._dedupe.seen_recently(chosen, now_ms, end))
            repeats = [next(seen) if d.message_id else None for d in drafts]
            duplicate = [r is not None for r in repeats]
            originals = list(dict.fromkeys(r for r in repeats if r is not None))
            if originals:
                drafts = [d for d, dup in zip(drafts, duplicate, strict=True) if not dup]
        claimed = [(d.topic, d.message_id) for d in drafts if d.message_id]
        try:
            future = self.send(drafts) if drafts else None
        except BaseException as exc:
            if end is not None:
                self._dedupe.forget(claimed, end)
                end.set_exception(exc)
            raise
        if end is not None and future is not None:
            future.add_done_callback(lambda f: self._dedupe.ended(end, claimed, f))
        return Submission(duplicate, future, claimed, end, originals)

    def stored(self, submission: Submission) -> list[DispatchInfo]:
        """Wait until a submission is durable: one ``DispatchInfo`` per stored draft.  If
        it fails, its ids are forgotten, so that a retry is not taken for a duplicate.  A
        duplicate's OK stands for its original: it waits until that is durable too (and
        fails if that failed), and passes the fence like any OK."""
        try:
            infos = submission.future.result() if submission.future is not None else []
        except BaseException:
            if submission.end is not None:  # now, not only once ``ended`` runs
                self._dedupe.forget(submission.claimed, submission.end)
            raise
        ends = [f.result() for f in submission.originals]  # raises as a failed original did
        if ends and self._journal.durable_ack and self._tiered is not None:
            self._tiered.wait_durable(max(ends))  # the originals in the tier too
        if infos or ends:
            self._journal.wait_tier(infos)  # tier.durable_ack: in the tier before the OK
        return infos
