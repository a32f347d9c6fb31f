"""SendDedupe: the dedupe window of client-chosen message ids.

A send whose message carries a client-chosen id its topic accepted within
``store.dedupe_window_ms`` is not stored again: a producer that resends after a lost
answer is answered ``duplicate``, and a replay sent twice delivers once.  Ids accepted a
moment ago are remembered in memory (at most ``RECENT_IDS``) with where their send ends
in the CommitLog, so a duplicate's OK can wait for its original (``Sender.stored``);
older ones are found in the store's key index (one multi-get); for a topic taken over,
ids the broker it came from accepted count too (``cluster.handover``).  An id whose
send failed is forgotten: a retry is no repeat.

Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

from cluster.handover import InheritedIds
from store.message import DispatchInfo
from store.store import MessageStore

RECENT_IDS = 1 << 17  # client-chosen ids remembered in memory for the dedupe check
_IN_TIER: Future[int] = Future()  # where a taken-over broker's message ends here: nowhere
_IN_TIER.set_result(0)


class SendDedupe:
    """See the module docstring."""

    def __init__(self, store: MessageStore, window_ms: int, inherited: InheritedIds) -> None:
        self._store = store
        self._window_ms = window_ms
        self._inherited = inherited
        self._lock = threading.Lock()
        self._ids: OrderedDict[tuple[str, str], tuple[int, Future[int]]] = OrderedDict()

    def seen_recently(self, messages: list[tuple[str, str]], now_ms: int,
                      end: Future[int]) -> list[Future[int] | None]:
        """For each (topic, client-chosen id), whether the topic accepted a message with
        that id within the dedupe window (``store.dedupe_window_ms``; a repeat within
        ``messages`` counts too): a replay sent twice delivers once.  None: it did not,
        and the id is taken now, by the send ending at ``end``; else where the message
        accepted before ends in the CommitLog, once stored (it may be on its way still;
        it fails if that send fails).  Ids accepted a moment ago are remembered in memory
        until the index has them; the rest are one multi-get.  For a topic taken over,
        ids the broker it came from accepted count too (``cluster.handover``: in its
        tier already, they end at 0 here)."""
        window = self._window_ms
        if window <= 0:
            return [None] * len(messages)
        horizon = now_ms - window
        stored = self._store.stored_at(messages)
        earlier = self._inherited.stored_earlier(
            [m for m, at in zip(messages, stored, strict=True)
             if (at is None or at < horizon) and not self._remembered(m, horizon)], horizon,
            now_ms)
        indexed: Future[int] | None = None
        out: list[Future[int] | None] = []
        with self._lock:
            recent = self._ids
            for m, at in zip(messages, stored, strict=True):
                seen = recent.get(m)
                if seen is not None and seen[0] >= horizon:
                    out.append(seen[1])
                elif at is not None and at >= horizon:
                    if indexed is None:  # the index has only what the CommitLog confirmed
                        # (not where: waiting for all of that covers the original)
                        indexed = Future()
                        indexed.set_result(self._store.commitlog.confirmed_offset)
                    out.append(indexed)
                elif m in earlier:  # remembered: a resend again is not looked up again
                    recent[m] = (earlier[m], _IN_TIER)
                    out.append(_IN_TIER)
                else:
                    recent[m] = (now_ms, end)
                    out.append(None)
            while len(recent) > RECENT_IDS:
                recent.popitem(last=False)
        return out

    def _remembered(self, message: tuple[str, str], horizon: int) -> bool:
        seen = self._ids.get(message)  # a hint: ``seen_recently`` decides locked
        return seen is not None and seen[0] >= horizon

    def forget_topics(self, topics: set[str]) -> None:
        """Topics deleted: the ids they accepted count no more (a topic created again
        under the name is another; the key index tells them apart by generation)."""
        with self._lock:
            for m in [m for m in self._ids if m[0] in topics]:
                del self._ids[m]

    def forget(self, messages: list[tuple[str, str]], end: Future[int]) -> None:
        """(topic, id) pairs whose send (the one ending at ``end``) failed: a retry must
        not count as a duplicate.  An id taken by another send since stays."""
        with self._lock:
            for m in messages:
                seen = self._ids.get(m)
                if seen is not None and seen[1] is end:
                    del self._ids[m]

    def ended(self, end: Future[int], claimed: list[tuple[str, str]],
               stored: Future[list[DispatchInfo]]) -> None:
        """A send with client-chosen ids is stored: tell its repeats where it ends; or it
        failed: forget its ids (a retry is no repeat) and fail its repeats alike."""
        try:
            infos = stored.result()
        except BaseException as exc:
            self.forget(claimed, end)
            end.set_exception(exc)
            return
        end.set_result(max(i.commit_offset + i.record_size for i in infos))
