"""A failing tier never slows the local path (issue 16).

Three levels, all on real parts:

* the TieredDispatcher on a real store, its uploads held by ``FaultyProvider``: Pop's
  reads of the queue map, Stats and retention never wait for an upload; one commit of
  many queues against a stalled tier costs one time-out; tier health in Stats;
* the S3 provider against moto's S3 server behind a fault proxy (``tests.tiered.proxy``):
  every call is bounded by its time-outs and attempts, whether S3 stalls, resets or
  answers 5xx;
* a real broker (a ``chronomq serve`` subprocess, real gRPC and RocksDB) uploading to
  moto through the proxy: while the proxy stalls, resets or answers 5xx, producers and
  live consumers (Pop and Subscribe) go on at their normal latency; afterwards the tier
  catches up and a new group reads the history back from it, after local retention
  dropped it.
"""

from __future__ import annotations

import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from chronomq.client import ChronomqClient, RpcError, Subscription
from chronomq.config import load_config
from chronomq.providers import make_provider
from store.clock import ManualClock
from store.errors import InvalidArgument
from store.message import Message, decode_record
from store.store import MessageStore, StoreConfig
from store.topics import Topic
from testkit.process import ServerProcess, wait_tier_caught_up
from testkit.proxy import FaultProxy
from testkit.wait import wait_until
from tests.conftest import CREDS, create_bucket
from tests.tiered.faults import FaultyProvider
from tiered.config import TierConfig
from tiered.dispatcher import RETRY_MIN_MS, TieredDispatcher
from tiered.errors import TierUnavailable
from tiered.flatfile import FlatFile
from tiered.providers.memory import MemoryProvider
from tiered.providers.s3 import S3Provider, S3Settings
from tiered.queue import TieredQueue
from tiered.uploads import await_uploads

UPLOAD_TIMEOUT_S = 1.0


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint) as p:
        yield p


def _bucket(s3_endpoint: str, tmp_path: Path) -> str:
    bucket = f"faults-{zlib.crc32(str(tmp_path).encode())}"
    create_bucket(s3_endpoint, bucket)
    return bucket


def _timed(f: Callable[..., object], *args: object) -> float:
    t0 = time.monotonic()
    f(*args)
    return time.monotonic() - t0


# ---------------------------------------------------------------------- the dispatcher


class Env:
    """A real store and a TieredDispatcher whose uploads go through ``faulty``."""

    def __init__(self, root: Path, clock: ManualClock, queues: int = 4, **config: object
                 ) -> None:
        self.root = root
        self.clock = clock
        self.store = MessageStore(StoreConfig(str(root / "data")), clock)
        self.store.open()
        self.store.start()
        self.faulty = FaultyProvider(MemoryProvider())
        self.tier = TieredDispatcher(
            self.store, self.faulty, "b0", str(root / "data" / "tiered"),
            TierConfig(**{"upload_batch_bytes": 1 << 20, "upload_batch_ms": 1000, "index_ms": 10**9,
                            "upload_timeout_s": UPLOAD_TIMEOUT_S, **config}),  # type: ignore[arg-type]
            clock)
        self.tier.open()
        self.store.create_topic(Topic("t", queues))
        self.sent = 0

    def send(self, n: int) -> None:
        self.store.put([Message("", "t", f"m{self.sent + i}".encode())
                        for i in range(n)]).result(10)
        self.sent += n
        self.store.wait_visible(10)
        while self.tier.step():
            pass

    def bodies(self, queues: int = 4) -> list[bytes]:
        return sorted(decode_record(e.record).body for qid in range(queues)
                      for e in self.tier.read("t", qid, 0, 10_000))

    def close(self) -> None:
        self.faulty.release()
        self.tier.stop()
        self.store.stop()


@pytest.fixture
def env(tmp_path: Path, manual_clock: ManualClock) -> Iterator[Env]:
    e = Env(tmp_path, manual_clock, retention_ms=1000)
    yield e
    e.close()


def test_a_held_upload_never_blocks_reads_stats_or_retention(env: Env) -> None:
    # Given: a first batch in the tier, a second buffered, all of it past retention
    env.send(40)
    env.tier.commit()
    env.send(40)
    env.clock.advance(5000)
    # When: the tier takes the second batch's objects and never answers
    env.faulty.hold()
    committer = threading.Thread(target=env.tier.commit, name="test-commit")
    committer.start()
    wait_until(lambda: env.faulty.held >= 8, 10, "8 writes held (4 queues, 2 objects each)",
               show=lambda: f"{env.faulty.held} held")
    # Then: Pop's view of the tier, Stats and retention answer at once
    waits = [_timed(env.tier.queue, "t", 0), _timed(env.tier.min_queue_offset, "t", 1),
             _timed(env.tier.read, "t", 2, 0, 10), _timed(env.tier.statistics),
             _timed(env.tier.run_retention)]
    assert max(waits) < 0.2, waits
    assert env.tier.run_retention() == 0  # every queue is uploading: left for later
    committer.join()  # the upload timed out (held beyond UPLOAD_TIMEOUT_S)
    env.faulty.release()
    # and nothing is lost: the next commit takes the batch, the pass after it expires
    env.tier.commit()
    assert env.bodies() == sorted(f"m{i}".encode() for i in range(80))
    assert env.tier.position() == env.store.commitlog.confirmed_offset
    assert env.tier.run_retention() > 0 and env.bodies() == []


def test_a_stalled_commit_costs_one_time_out_not_one_per_queue(tmp_path: Path,
                                                              manual_clock: ManualClock) -> None:
    env = Env(tmp_path, manual_clock, queues=8)
    try:
        env.send(80)
        env.tier.commit()
        uploaded_at = manual_clock.now_ms()
        env.send(80)
        manual_clock.advance(3000)
        env.faulty.hold()
        # When: eight queues (sixteen objects) meet a tier that never answers
        took = _timed(env.tier.commit)
        # Then: one time-out for all of them, not eight
        assert took < 2 * UPLOAD_TIMEOUT_S, took
        s = env.tier.statistics()
        assert s.consecutive_failures == 1 and s.failed_uploads >= 8
        assert s.last_upload_ms == uploaded_at
        assert s.upload_lag_bytes == env.store.commitlog.confirmed_offset - s.position > 0
        assert s.upload_lag_s == 3.0  # the oldest record not in the tier: 3 s old
        # the next commit waits out a back-off instead of hammering the tier
        env.faulty.release()
        writes = env.faulty.writes
        assert env.tier.commit(force=False) == 0 and env.faulty.writes == writes
        manual_clock.advance(RETRY_MIN_MS)
        assert env.tier.commit(force=False) == 8
        s = env.tier.statistics()
        assert (s.consecutive_failures, s.upload_lag_bytes, s.upload_lag_s) == (0, 0, 0.0)
        assert s.last_upload_ms == manual_clock.now_ms()
        assert env.bodies(8) == sorted(f"m{i}".encode() for i in range(160))
    finally:
        env.close()


def _record(qo: int) -> bytes:
    from store.message import encode_record
    return encode_record(Message(f"id{qo}", "t", b"x" * 20, queue_offset=qo))


def test_retention_leaves_a_queue_alone_while_its_upload_is_in_flight() -> None:
    faulty = FaultyProvider(MemoryProvider())
    with ThreadPoolExecutor(4) as pool:
        q = TieredQueue(faulty, "b0", "t", 0, upload_timeout_s=5, uploader=pool)
        for qo in range(10):
            q.append(qo, _record(qo), 0, 1000)
        assert q.commit()
        for qo in range(10, 20):
            q.append(qo, _record(qo), 0, 5000)
        faulty.hold()
        ups = q.begin_commit()
        wait_until(lambda: faulty.held >= 2, 10, "the upload's 2 writes held",
                   show=lambda: f"{faulty.held} held")
        # When: retention would drop all that is committed (and so seal the segment
        # the upload goes to) while the upload is in flight
        assert q.expire_stored_before(2000) == []
        # Then: it waits for a later pass; the upload lands where it was reserved
        faulty.release()
        await_uploads([u for u in ups if u is not None], 5)
        assert q.finish_commit(ups) is True
        assert [e.queue_offset for e in q.read(0, 100)] == list(range(20))
        assert q.expire_stored_before(6000) != [] and q.read(0, 100) == []


def test_a_late_write_never_lands_over_a_newer_one() -> None:
    faulty = FaultyProvider(MemoryProvider())
    with ThreadPoolExecutor(4) as pool:
        ff = FlatFile(faulty, "p", upload_timeout_s=0.2, uploader=pool)
        ff.append(b"aaaa")
        faulty.hold()
        assert not ff.commit()  # timed out: the empty segment is sealed, the next one
        # starts at the same position, so its first object has the very same path
        faulty.pass_new()
        ff.append(b"bbbb")
        assert not ff.commit()  # not started while the first write may still land
        assert faulty.writes == 0
        faulty.release()
        # the late write landed: now the path is free
        wait_until(lambda: faulty.writes >= 1, 10, "the late write to land",
                   show=lambda: f"{faulty.writes} writes")
        assert ff.commit() and faulty.writes == 2
    assert ff.read(0, 100) == b"aaaabbbb"


# ---------------------------------------------------------------------- the S3 provider


@pytest.mark.parametrize("mode", ["stall", "reset", "http"])
def test_every_s3_call_is_bounded(mode: str, s3_endpoint: str, proxy: FaultProxy,
                                  tmp_path: Path) -> None:
    s3 = S3Provider(S3Settings(bucket=_bucket(s3_endpoint, tmp_path),
                               endpoint_url=proxy.endpoint, connect_timeout_s=0.5,
                               read_timeout_s=0.5, max_attempts=2,
                               access_key_id=CREDS["access_key_id"],
                               secret_access_key=CREDS["secret_access_key"]))
    s3.write("a", b"1")
    proxy.set_mode(mode)
    before = proxy.connections
    # two attempts of at most 0.5 s each (a PUT's also waits up to 1 s for its
    # "100 Continue"), and botocore's jittered back-off between them (< 1 s)
    calls: list[tuple[Callable[..., object], tuple[object, ...], float]] = [
        (s3.write, ("b", b"2"), 4.0), (s3.read, ("a",), 2.5), (s3.size, ("a",), 2.5)]
    for call, args, bound_s in calls:
        t0 = time.monotonic()
        with pytest.raises(TierUnavailable):
            call(*args)
        assert time.monotonic() - t0 < bound_s, call
    assert proxy.connections - before == 3 * 2  # max_attempts, in all, per call
    proxy.set_mode("pass")
    assert s3.read("a") == b"1"


def test_s3_settings_reach_the_client(tmp_path: Path) -> None:
    base = ["tier.provider=s3", "tier.s3_bucket=b", "tier.s3_endpoint_url=http://127.0.0.1:9",
            f"store.data_dir={tmp_path}"]
    config = load_config(overrides=[*base, "tier.s3_connect_timeout_s=0.25",
                                    "tier.s3_read_timeout_s=0.75", "tier.s3_max_attempts=4"])
    config.validate()
    provider = make_provider(config)
    assert isinstance(provider, S3Provider)
    client_config: Any = provider._s3.meta.config
    assert (client_config.connect_timeout, client_config.read_timeout) == (0.25, 0.75)
    assert client_config.retries == {"total_max_attempts": 4, "mode": "standard"}
    with pytest.raises(InvalidArgument, match="s3_max_attempts"):
        load_config(overrides=[*base, "tier.s3_max_attempts=0"]).validate()


# ---------------------------------------------------------------------- a real broker


class Traffic:
    """A producer sending one message every ``every_s`` and two live consumers of its
    topic: group ``pop`` long-polls Pop, group ``sub`` holds a Subscribe stream.  Each
    records when every message arrived, to compare with when its Send began."""

    def __init__(self, target: str, topic: str, every_s: float = 0.02) -> None:
        self.target, self.topic, self.every_s = target, topic, every_s
        self.sent: dict[str, float] = {}  # acked message id -> when its Send began
        self.arrived: dict[str, dict[str, float]] = {"pop": {}, "sub": {}}  # id -> when
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producing = threading.Event()
        self._producing.set()
        self._sub: Subscription | None = None
        self._threads = [threading.Thread(target=f, name=f"traffic-{f.__name__}", daemon=True)
                         for f in (self._produce, self._pop, self._subscribe)]
        for t in self._threads:
            t.start()

    def _arrived(self, group: str, message_id: str) -> None:
        now = time.monotonic()  # may come before the producer noted the Send's answer
        with self._lock:
            self.arrived[group].setdefault(message_id, now)

    def _produce(self) -> None:
        with ChronomqClient(self.target) as c:
            while self._producing.is_set():
                began = time.monotonic()
                try:
                    mid = c.send_one(self.topic, b"x" * 200)
                except Exception as exc:
                    self.errors.append(f"send: {exc}")
                else:
                    with self._lock:
                        self.sent[mid] = began
                time.sleep(self.every_s)

    def _pop(self) -> None:
        with ChronomqClient(self.target) as c:
            while not self._stop.is_set():
                try:
                    got = c.pop(self.topic, "pop", 32, 30, wait_ms=200)
                    for m in got:
                        self._arrived("pop", m.message_id)
                    if got:
                        c.ack("pop", [m.receipt_handle for m in got])
                except Exception as exc:
                    self.errors.append(f"pop: {exc}")

    def _subscribe(self) -> None:
        with ChronomqClient(self.target) as c, c.subscribe(self.topic, "sub") as sub:
            self._sub = sub
            try:
                for m in sub.messages():
                    self._arrived("sub", m.message_id)
                    sub.ack([m.receipt_handle])
            except Exception as exc:
                if not self._stop.is_set():
                    self.errors.append(f"subscribe: {exc}")

    def latencies(self, group: str, since: float, until: float) -> list[float]:
        """Send-to-arrival seconds of the messages sent in ``[since, until)``."""
        with self._lock:
            return [self.arrived[group][mid] - began for mid, began in self.sent.items()
                    if since <= began < until and mid in self.arrived[group]]

    def missing(self, group: str) -> set[str]:
        """Acked messages the group has not received."""
        with self._lock:
            return set(self.sent) - set(self.arrived[group])

    def received(self, group: str, since: float) -> int:
        """Messages whose Send began at ``since`` or later that the group received."""
        with self._lock:
            return sum(began >= since and mid in self.arrived[group]
                       for mid, began in self.sent.items())

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sending, wait until both groups have every acked message (fails after
        ``timeout_s``), then stop consuming."""
        self._producing.clear()
        self._threads[0].join(10)  # its last Send answered: ``sent`` is complete
        try:
            wait_until(lambda: not (self.missing("pop") or self.missing("sub")), timeout_s,
                       "both groups to receive every acked message",
                       show=lambda: {g: len(self.missing(g)) for g in ("pop", "sub")},
                       poll_s=0.05)
        finally:
            self._stop.set()
            if self._sub is not None:
                self._sub.close()
            for t in self._threads:
                t.join(10)


def _stats(target: str, timeout_s: float = 2.0) -> dict[str, float]:
    """Stats, or {} when the broker does not answer within ``timeout_s``."""
    with ChronomqClient(target, timeout_s=timeout_s) as c:
        try:
            return c.stats()
        except RpcError:
            return {}


def _tier_failing(target: str) -> bool:
    """The broker reports the tier failing: an upload failed and the oldest record not in
    the tier waits longer than an upload time-out."""
    s = _stats(target)
    return bool(s) and s["tier.consecutive_failures"] >= 1 and \
        s["tier.upload_lag_s"] > UPLOAD_TIMEOUT_S


def _pop_all(c: ChronomqClient, topic: str, group: str) -> set[str]:
    """Every message the group can pop: until three Pops in a row bring nothing (one
    empty Pop is not the end: a Pop looks at each queue once)."""
    got: set[str] = set()
    empty = 0
    while empty < 3:
        batch = c.pop(topic, group, 32, 60, wait_ms=300)
        empty = 0 if batch else empty + 1
        got.update(m.message_id for m in batch)
        if batch:
            c.ack(group, [m.receipt_handle for m in batch])
    return got


def _where(c: ChronomqClient, missing: set[str]) -> str:
    """Where the messages a group did not get are: queue and offset, and what the
    broker's Stats say of retention and the tier."""
    found = []
    for mid in sorted(missing)[:20]:
        got = c.query("live", message_id=mid, max_messages=1)
        found.append(f"{mid}: " + (f"queue {got[0].queue_id} offset {got[0].queue_offset}"
                                   if got else "not found by id"))
    stats = {k: v for k, v in c.stats().items()
             if k.startswith(("tier.", "commitlog.")) or "retention" in k}
    return f"{len(missing)} not read back: {found}; stats {stats}"


def _broker(tmp_path: Path, s3_endpoint: str, proxy: FaultProxy) -> ServerProcess:
    return ServerProcess(
        tmp_path / "data", "tier.upload=true", "tier.provider=s3",
        f"tier.s3_bucket={_bucket(s3_endpoint, tmp_path)}",
        f"tier.s3_endpoint_url={proxy.endpoint}",
        f"tier.s3_access_key_id={CREDS['access_key_id']}",
        f"tier.s3_secret_access_key={CREDS['secret_access_key']}",
        "tier.upload_batch_ms=100", f"tier.upload_timeout_s={UPLOAD_TIMEOUT_S}",
        "tier.s3_connect_timeout_s=0.5", "tier.s3_read_timeout_s=0.5", "tier.s3_max_attempts=2",
        "tier.index_ms=200", "store.segment_bytes=16384", "store.retention_bytes=1",
        "server.retention_interval_s=1")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stall", "reset", "http"])
def test_a_failing_tier_never_slows_the_local_path(mode: str, tmp_path: Path,
                                                   s3_endpoint: str,
                                                   proxy: FaultProxy) -> None:
    fault_s = 3.0
    srv = _broker(tmp_path, s3_endpoint, proxy)
    try:
        with ChronomqClient(srv.target) as c:
            c.create_topic("live", queue_count=4)
            traffic = Traffic(srv.target, "live")
            # warm-up: connections, the first uploads
            wait_until(lambda: traffic.received("pop", 0) and traffic.received("sub", 0)
                       and c.stats()["tier.upload_batches"] >= 1, 10,
                       "both groups to receive and the tier to take a first batch",
                       show=lambda: (traffic.received("pop", 0), traffic.received("sub", 0),
                                     c.stats()["tier.upload_batches"]))
            # Given: normal latency, the tier healthy (a sample of 40 messages a group)
            t0 = time.monotonic()
            wait_until(lambda: min(traffic.received(g, t0) for g in ("pop", "sub")) >= 40, 10,
                       "40 messages to each group at normal latency",
                       show=lambda: [traffic.received(g, t0) for g in ("pop", "sub")])
            # When: S3 stalls (accepts, never answers) / resets / answers 503, for
            # longer than the upload time-out
            t1 = time.monotonic()
            proxy.set_mode(mode)
            # the fault lasts fault_s on purpose (traffic meets the failing tier that
            # long), and until the broker reports it
            wait_until(lambda: time.monotonic() - t1 >= fault_s and _tier_failing(srv.target),
                       fault_s + 20, "the broker to report the tier failing",
                       show=lambda: _stats(srv.target), poll_s=0.1)
            during = _stats(srv.target)  # Stats itself answers at once
            t2 = time.monotonic()
            proxy.set_mode("pass")
            traffic.stop()
            # Then: consumers got the messages as fast as before
            for group in ("pop", "sub"):
                normal = statistics.median(traffic.latencies(group, t0, t1))
                faulty = sorted(traffic.latencies(group, t1, t2))
                print(f"{mode} {group}: normal median {normal * 1000:.1f} ms, during the "
                      f"fault median {statistics.median(faulty) * 1000:.1f} ms, p90 "
                      f"{faulty[len(faulty) * 9 // 10] * 1000:.1f} ms, max "
                      f"{faulty[-1] * 1000:.1f} ms ({len(faulty)} messages)")
                assert statistics.median(faulty) <= max(2 * normal, 0.25), group
                assert faulty[len(faulty) * 9 // 10] < UPLOAD_TIMEOUT_S, group
                assert faulty[-1] < fault_s, group
            assert not traffic.errors
            # nothing acked was lost, and the operator saw the tier fail
            assert not traffic.missing("pop") and not traffic.missing("sub")
            assert during, "Stats waited for the tier"
            assert during["tier.consecutive_failures"] >= 1
            assert during["tier.upload_lag_bytes"] > 0 and during["tier.upload_lag_s"] > 1
            # the tier catches up once the fault clears ...
            print(f"{mode}: caught up {wait_tier_caught_up(c, 30):.2f} s after the fault")
            after = c.stats()
            assert after["tier.consecutive_failures"] == 0 and after["tier.upload_lag_s"] == 0
            assert after["tier.damaged_objects"] == 0
            # ... local retention drops what the tier holds, and a new group reads it back
            wait_until(lambda: c.stats()["commitlog.min_offset"] > 0, 10,
                       "local retention to run (Stats commitlog.min_offset > 0)", poll_s=0.2)
            missing = set(traffic.sent) - _pop_all(c, "live", "late")
            assert not missing, _where(c, missing)
            assert c.stats()["tier.cache_fetches"] > 0  # read from the tier
    finally:
        assert srv.terminate() == 0, "".join(srv.output)


def test_the_upload_lag_counts_metadata_copies_a_mount_has_not_got(env: Env) -> None:
    """Found with two broker processes: Stats said the tier had caught up (lag 0) while the
    copy of one queue's metadata had not reached the tier; the broker was killed then,
    and a mount of its tier missed that queue's last batch.  The lag a mount's loss window
    is read from must count a batch until its metadata copy is in the tier."""
    env.send(40)
    env.tier.commit()
    assert env.tier.statistics().upload_lag_bytes == 0
    before = env.store.commitlog.confirmed_offset
    env.faulty.refuse = "/meta/"  # the data objects go up, the metadata copies do not
    env.send(40)
    env.tier.commit()
    assert env.tier.position() == env.store.commitlog.confirmed_offset  # local: uploaded
    stats = env.tier.statistics()
    assert stats.position == before  # what a mount sees stops at the first batch
    assert stats.upload_lag_bytes == env.store.commitlog.confirmed_offset - before > 0
    assert stats.failed_uploads >= 4  # each queue's copy, counted
    env.clock.advance(2500)
    assert env.tier.statistics().upload_lag_s >= 2.5  # the batch's age, though uploaded
    # the copies are written again at the next commit, even with nothing new to upload
    env.faulty.refuse = ""
    env.tier.commit()
    stats = env.tier.statistics()
    assert (stats.position, stats.upload_lag_bytes) == (env.store.commitlog.confirmed_offset, 0)
    metas = sorted(p for p in env.faulty.list("b0/meta/t/"))
    assert len(metas) == 4
    for path in metas:  # the tier's copy is the local truth
        qid = path.rsplit("/", 1)[1]
        local = (env.root / "data" / "tiered" / "queues" / "t" / qid).read_bytes()
        assert env.faulty.read(path) == local
