"""The clients of the failover chaos (``bench/bench_failover.py``), all through the client
library, with a ledger of what each was told (``testkit.ledger.Ledger`` in memory: this
process is never killed; written out as JSON lines at the end).

Per topic:

* a **sender**: one unary ``RoutedClient.send`` at a time (client-chosen ids; 80 %
  immediate, 10 % by ``delay_ms``, 10 % by ``deliver_at_ms``); its OKs also time the
  unavailability of the topic after a fault (``first_ok_after``);
* a **producer**: ``RoutedClient.producer`` (idempotent ``Producer``, one SendStream),
  a message every ``PRODUCER_EVERY_S``, every tenth delayed; an OK when its future
  resolves;
* a **stream consumer**: ``RoutedClient.consumer`` (Subscribe) of group ``g``: acks 90 %
  (an OK when the ack's future resolves), leaves 10 % unsettled ("skipped");
* a **pop consumer**: ``RoutedClient.pop`` of group ``g`` with an invisible time: acks
  85 %, nacks 5 % (1 s), skips 10 %;
* a **recurring schedule** ``sch-<topic>`` ticking every second (misfire ``all``),
  created at the start through the client and deleted at ``stop``; its ticks reach
  the consumers like any message;
* a **debouncer**: Sends with ``replace`` of a few ids (``deb-<topic>-<k>``), each
  delayed 2-5 s, one every 0.3-0.8 s, so most bodies are replaced, some fire; at
  ``stop`` each id is sent once more until answered OK.

The rules for those (ticks, debounced bodies, deleted topics): ``testkit.promises``.

Per broker life (its prefix in the bucket: a rejoined broker is a new one), a
**prober** sends one message per topic to that broker's address
directly every ``PROBE_EVERY_S`` and keeps who answered OK, and when
(a ``Probe`` entry): any OK from a broker after its successor's claim is a violation
(``testkit.checker``).  Probe messages that were answered OK are ledgered like any.

Thread-safe: ``Ledger`` takes a lock, so does ``where`` (evidence: which queue/offset
each lease had, which broker address answered); each client thread owns its client.
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from chronomq.client import ChronomqClient, RpcError, SendOutcome, message
from chronomq.client.routing import RoutedClient
from chronomq.v1 import broker_pb2 as pb
from testkit.ledger import (
    AckOk,
    Delivery,
    Ledger,
    Probe,
    Release,
    ReplaceOk,
    ScheduleEnd,
    ScheduleMade,
    SendAttempt,
    SendOk,
    Skip,
    delivery,
    make_body,
    now_ms,
)

T = TypeVar("T")
GROUP = "g"
SENDER_PAUSE_S = 0.02
PRODUCER_EVERY_S = 0.05
PROBE_EVERY_S = 0.2
PROBE_TIMEOUT_S = 2.0
STREAM_INVISIBLE_S = 8  # the stream consumer's leases
POP_INVISIBLE_S = 6  # the pop consumer's
DEBOUNCED_IDS = 3  # per topic


def _draft(topic: str, token: str, rng: random.Random, lease_s: float,
           delayed_share: float) -> tuple[pb.OutgoingMessage, int]:
    """A message carrying ``token`` (id = token), and its deliver-at lower bound."""
    start = now_ms()
    r = rng.random()
    body = make_body(token)
    if r < delayed_share / 2:
        delay = rng.randrange(500, int(2000 * lease_s))
        return message(topic, body, delay_ms=delay, message_id=token), start + delay
    if r < delayed_share:
        at = start + rng.randrange(500, int(3000 * lease_s))
        return message(topic, body, deliver_at_ms=at, message_id=token), at
    return message(topic, body, message_id=token), start


def _retry(call: Callable[[], T], forget: Callable[[], None] | None = None,
           within_s: float = 120) -> T:
    """``call`` until it answers (an owner moving, a takeover under way), for up to
    ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except RpcError:
            if time.monotonic() > deadline:
                raise
            if forget is not None:
                forget()
            time.sleep(0.5)


class Workload:
    """The client threads (see the module); ``start``, then ``stop`` before the drain."""

    def __init__(self, routed: Callable[[], RoutedClient], topics: list[str],
                 addresses: Callable[[], dict[str, str]], lease_s: float, seed: int) -> None:
        self.routed, self.topics, self.addresses = routed, topics, addresses
        self.lease_s, self.seed = lease_s, seed
        self.ledger = Ledger()
        self.where: dict[str, str] = {}  # lease -> queue/offset, via (evidence)
        self.oks: dict[str, list[tuple[float, float]]] = {t: [] for t in topics}  # sender
        self.errors: dict[str, int] = {}  # "<who> <code>" -> count (not OK, not counted)
        self._stop = threading.Event()
        self._stop_probes = threading.Event()
        self._threads: list[threading.Thread] = []
        self._probers: dict[str, threading.Thread] = {}
        self._manager: threading.Thread | None = None
        self._probe_seq = itertools.count()
        self._lock = threading.Lock()
        self.stuck: list[str] = []  # stacks of client threads that did not stop

    def _thread(self, target: Callable[..., None], name: str, *args: object) -> None:
        t = threading.Thread(target=self._guard, args=(target, name, *args), name=name,
                             daemon=True)
        self._threads.append(t)
        t.start()

    def _guard(self, target: Callable[..., None], name: str, *args: object) -> None:
        """Run a client loop; an unexpected error is counted and the loop starts again."""
        while not self._stop.is_set():
            try:
                target(*args)
                return
            except Exception as exc:
                self._error(name, type(exc).__name__)
                time.sleep(0.5)

    def _error(self, who: str, what: str) -> None:
        key = f"{who.split('-')[0]} {what}"
        with self._lock:
            self.errors[key] = self.errors.get(key, 0) + 1

    def start(self) -> None:
        for topic in self.topics:
            self._create_schedule(topic)
        for i, topic in enumerate(self.topics):
            self._thread(self._debounce_loop, f"debouncer-{topic}", topic, i)
            self._thread(self._send_loop, f"sender-{topic}", topic, i)
            self._thread(self._produce_loop, f"producer-{topic}", topic, i)
            self._thread(self._stream_loop, f"stream-{topic}", topic, i)
            self._thread(self._pop_loop, f"pop-{topic}", topic, i)
        self._manager = threading.Thread(target=self._probe_manager, name="probers",
                                         daemon=True)
        self._manager.start()

    def stop(self) -> None:
        """Stop sending and consuming (the producers flush, the consumers close)."""
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            self._join(t, 120)
        for topic in self.topics:
            self._delete_schedule(topic)
        self._stop_probes.set()
        if self._manager is not None:
            self._manager.join(10)
        for t in list(self._probers.values()):
            self._join(t, 10)

    def _join(self, t: threading.Thread, timeout_s: float) -> None:
        """Join ``t``; one that takes over 10 s is reported (with its stack if it hangs)."""
        started = time.monotonic()
        t.join(10)
        if t.is_alive():
            frame = sys._current_frames().get(t.ident or 0)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
            t.join(timeout_s - 10)
            self.stuck.append(f"{t.name} took {time.monotonic() - started:.1f} s to stop; "
                              f"its stack after 10 s:\n{stack}")

    def delivered(self, lease: str, m: pb.ReceivedMessage, start_ms: int,
                  invisible_time_s: int, via: str = "") -> Delivery:
        """Ledger ``m`` delivered under ``lease``; keep where it came from (evidence)."""
        d = delivery(lease, m, GROUP, start_ms, invisible_time_s)
        self.ledger.append(d)
        with self._lock:
            self.where[lease] = (f"{m.queue_id}/{m.queue_offset} born {m.born_at_ms}"
                                 f" via {via or '?'}")
        return d

    def _settled_via(self, leases: list[str], how: str, via: str) -> None:
        """Evidence: which broker address (the client's owner of the topic after the
        call) answered the ack or nack of ``leases``."""
        with self._lock:
            for lease in leases:
                self.where[lease] = f"{self.where.get(lease, '?')}, {how} via {via}"

    def first_ok_after(self, topic: str, t: float) -> float | None:
        """The monotonic time of the first OK of a sender's send begun after ``t``."""
        later = [ok for start, ok in list(self.oks[topic]) if start > t]
        return min(later) if later else None

    def ok_count(self) -> int:
        return sum(isinstance(e, SendOk) for e in self.ledger.snapshot())

    # ------------------------------------------------------------------ senders

    def _send_loop(self, topic: str, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        seq = itertools.count()
        with self.routed() as rc:
            while not self._stop.is_set():
                token = f"u{i}-{next(seq)}"
                m, lb = _draft(topic, token, rng, self.lease_s, 0.2)
                self.ledger.append(SendAttempt(token, topic, lb))
                started = time.monotonic()
                try:
                    (out,) = rc.send([m])
                except RpcError as exc:
                    self._error(f"sender-{topic}", exc.code.name)
                    continue
                if out.ok:
                    self.ledger.append(SendOk(token, out.message_id))
                    self.oks[topic].append((started, time.monotonic()))
                else:
                    self._error(f"sender-{topic}", str(out.error_code))
                time.sleep(SENDER_PAUSE_S)

    def _produce_loop(self, topic: str, i: int) -> None:
        rng = random.Random(self.seed * 1000 + 100 + i)
        seq = itertools.count()
        with self.routed() as rc, rc.producer(topic, delivery_timeout_s=600,
                                              block_s=600) as producer:
            while not self._stop.is_set():
                token = f"p{i}-{next(seq)}"
                m, lb = _draft(topic, token, rng, self.lease_s, 0.1)
                self.ledger.append(SendAttempt(token, topic, lb))
                f = producer.send(topic, m.body, message_id=token,
                                  delay_ms=m.delay_ms if m.HasField("delay_ms") else None,
                                  deliver_at_ms=(m.deliver_at_ms
                                                 if m.HasField("deliver_at_ms") else None))
                f.add_done_callback(self._produced(token, topic))
                time.sleep(PRODUCER_EVERY_S)
            producer.flush(600)

    def _produced(self, token: str, topic: str) -> Callable[[Future[SendOutcome]], None]:
        def done(f: Future[SendOutcome]) -> None:
            exc = f.exception()
            if exc is None:
                self.ledger.append(SendOk(token, f.result().message_id))
            else:
                self._error(f"producer-{topic}", getattr(getattr(exc, "code", None), "name",
                                                         type(exc).__name__))
        return done

    # ------------------------------------------------------------------ schedules

    def _create_schedule(self, topic: str) -> None:
        name = f"sch-{topic}"
        with self.routed() as rc:
            s, _ = _retry(lambda: rc.directory.for_topic(topic).create_schedule(
                name, topic, make_body(f"tick-{topic}"), every_s=1, misfire="all"),
                forget=lambda: rc.directory.forget(topic))
        self.ledger.append(ScheduleMade(name, topic, 1000, s.next_fire_ms,
                                     s.misfire_bound or 100, now_ms()))

    def _delete_schedule(self, topic: str) -> None:
        name = f"sch-{topic}"
        with self.routed() as rc:
            self.ledger.append(ScheduleEnd(name, now_ms()))
            try:
                _retry(lambda: rc.directory.for_topic(topic).delete_schedule(name),
                       forget=lambda: rc.directory.forget(topic))
            except RpcError as exc:  # its ticks go on: the drain takes them
                self._error(f"schedules-{topic}", f"delete {exc.code.name}")

    # ------------------------------------------------------------------ debounce

    def _debounce_loop(self, topic: str, i: int) -> None:
        rng = random.Random(self.seed * 1000 + 400 + i)
        seq = itertools.count()
        ids = [f"deb-{topic}-{k}" for k in range(DEBOUNCED_IDS)]
        with self.routed() as rc:
            while not self._stop.is_set():
                self._replace(rc, topic, rng.choice(ids), next(seq), rng)
                self._stop.wait(rng.uniform(0.3, 0.8))
            for mid in ids:  # the last body of each id answered OK: it must fire
                deadline = time.monotonic() + 120
                while not self._replace(rc, topic, mid, next(seq), rng) \
                        and time.monotonic() < deadline:
                    time.sleep(0.5)

    def _replace(self, rc: RoutedClient, topic: str, mid: str, n: int,
                 rng: random.Random) -> bool:
        token, delay = f"{mid}#{n}", rng.randrange(2000, 5000)
        start = now_ms()
        self.ledger.append(SendAttempt(token, topic, start + delay))
        try:
            (out,) = rc.send([message(topic, make_body(token), message_id=mid,
                                      delay_ms=delay, replace=True)])
        except RpcError as exc:
            self._error(f"debouncer-{topic}", exc.code.name)
            return False
        if not out.ok:
            self._error(f"debouncer-{topic}", str(out.error_code))
            return False
        self.ledger.append(ReplaceOk(token, out.message_id, out.replaced, start, now_ms()))
        return True

    # ------------------------------------------------------------------ consumers

    def _stream_loop(self, topic: str, i: int) -> None:
        rng = random.Random(self.seed * 1000 + 200 + i)
        leases = itertools.count()
        with self.routed() as rc, rc.consumer(topic, GROUP, prefetch=16,
                                              invisible_time_s=STREAM_INVISIBLE_S) as c:
            while not self._stop.is_set():
                m = c.receive(timeout_s=0.5)
                if m is None:
                    continue
                lease = f"s{i}:{next(leases)}"
                # a stream's lease ends when the stream does (given back at once): no
                # lease bound is claimed for it (invisible time 0 in the ledger)
                self.delivered(lease, m, now_ms(), 0, self._owner(rc, topic))
                if rng.random() < 0.1:
                    self.ledger.append(Skip(lease))
                    continue
                c.ack(m).add_done_callback(self._acked(lease, m.message_id, topic))
            c.flush(60)

    def _acked(self, lease: str, message_id: str, topic: str) -> Callable[[Future[None]], None]:
        def done(f: Future[None]) -> None:
            if f.exception() is None:
                self.ledger.append(AckOk(lease, message_id, GROUP, now_ms()))
            else:
                self._error(f"stream-{topic}", "ack failed")
        return done

    def _pop_loop(self, topic: str, i: int) -> None:
        rng = random.Random(self.seed * 1000 + 300 + i)
        leases = itertools.count()
        with self.routed() as rc:
            while not self._stop.is_set():
                start = now_ms()
                try:
                    got = rc.pop(topic, GROUP, 8, POP_INVISIBLE_S, 500)
                except RpcError as exc:
                    self._error(f"pop-{topic}", exc.code.name)
                    continue
                acks, nacks = [], []
                via = self._owner(rc, topic)
                for m in got:
                    lease = f"q{i}:{next(leases)}"
                    self.delivered(lease, m, start, POP_INVISIBLE_S, via)
                    r = rng.random()
                    if r < 0.1:
                        self.ledger.append(Skip(lease))
                    elif r < 0.15:
                        nacks.append((lease, m))
                    else:
                        acks.append((lease, m))
                self._settle(rc, topic, acks, nacks)

    @staticmethod
    def _owner(rc: RoutedClient, topic: str) -> str:
        """The address the client holds for ``topic``'s owner now (evidence only)."""
        try:
            return rc.directory.locate(topic)
        except RpcError:
            return "?"

    def _settle(self, rc: RoutedClient, topic: str, acks: list[tuple[str, pb.ReceivedMessage]],
                nacks: list[tuple[str, pb.ReceivedMessage]]) -> None:
        try:
            if nacks:
                start = now_ms()
                self.ledger.append(*[Release(lease, m.message_id, GROUP, start, 1000)
                                  for lease, m in nacks])
                rc.nack(topic, GROUP, [m.receipt_handle for _, m in nacks], 1000)
                self._settled_via([lease for lease, _ in nacks], "nack",
                                        self._owner(rc, topic))
            if acks:
                errors = rc.ack(topic, GROUP, [m.receipt_handle for _, m in acks])
                at = now_ms()
                self._settled_via([lease for lease, _ in acks], "ack",
                                        self._owner(rc, topic))
                self.ledger.append(*[AckOk(lease, m.message_id, GROUP, at)
                                  for (lease, m), e in zip(acks, errors, strict=True) if not e])
        except RpcError as exc:
            self._error(f"pop-{topic}", f"settle {exc.code.name}")

    # ------------------------------------------------------------------ probers

    def _probe_manager(self) -> None:
        """A prober thread per broker name, started as names join, ended as they retire."""
        while not self._stop_probes.is_set():
            for name, address in self.addresses().items():
                if name not in self._probers or not self._probers[name].is_alive():
                    t = threading.Thread(target=self._probe_loop, args=(name, address),
                                         name=f"probe-{name}", daemon=True)
                    self._probers[name] = t
                    t.start()
            self._stop_probes.wait(0.2)

    def _probe_loop(self, name: str, address: str) -> None:
        seq = self._probe_seq  # shared: a prober started again for a life sends new ids
        with ChronomqClient(address, timeout_s=PROBE_TIMEOUT_S) as c:
            while not self._stop_probes.is_set() and name in self.addresses():
                n = next(seq)
                batch = [(f"x-{name}-{n}-{t}", t) for t in self.topics]
                start = now_ms()
                self.ledger.append(*[SendAttempt(token, t, start) for token, t in batch])
                try:
                    out = c.send([message(t, make_body(token), message_id=token)
                                  for token, t in batch])
                except RpcError:
                    out = []
                at = now_ms()
                for (token, _), o in zip(batch, out, strict=False):
                    if o.ok:
                        self.ledger.append(SendOk(token, o.message_id))
                        self.ledger.append(Probe(name, o.message_id, start, at))
                self._stop_probes.wait(PROBE_EVERY_S)
