"""Many topics: open files, lazy queues and the topic log.

In process (real files, real RocksDB):

* The ConsumeQueue descriptor cache closes the least recently used file when full, never
  one in use, and a forgotten file in use closes when its user leaves.
* A store whose cache holds two files, writing and reading 24 queues: every read and
  append of an evicted queue reopens its file, entries land at their queue offsets,
  and a restart continues each queue where it ended.
* The open-file budget: the cache takes what RLIMIT_NOFILE leaves (a soft limit below
  the hard one is raised first); a limit too low names RLIMIT_NOFILE and the value.
* A clean restart reads no queue; a cut CommitLog tail makes the start walk every queue
  and turn the lost entries into holes; with flush=async a start walks only after an OS
  restart or a walk cut short.
* The topic log: a line round-trips and a flipped byte is caught (hypothesis); a torn
  last record of every length is dropped (the topics before it
  stay, and the next create is durable); a damaged line in the middle costs that topic
  only; ``topics.json`` of older versions is migrated; concurrent creates share fsyncs.

Under a real server (``chronomq serve`` in a subprocess, ``ulimit -n 1024``):

* 2,500 topics x 4 queues, every queue written: the broker stays under 1,024 open files,
  serves Send/Pop across the whole range, and restarts (clean and kill -9) within it.
* With a limit too low for its caches it refuses to start with one line naming
  RLIMIT_NOFILE and the value it needs, not a traceback.
* Every topic whose CreateTopic answered OK exists after a kill -9 that lands while
  creates are in flight.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronomq.client import ChronomqClient, message
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc
from store import openfiles
from store.clock import SystemClock
from store.errors import InvalidArgument
from store.filecache import FileCache
from store.message import Message
from store.openfiles import OpenFilesLimit, plan_open_files
from store.store import MessageStore, StoreConfig
from store.topiclog import decode_line, encode_line
from store.topics import LOG_NAME, Topic, TopicCatalogue
from testkit.process import ServerProcess
from testkit.wait import wait_until

NOFILE = 1024  # the common default soft limit the broker must live under


# ---------------------------------------------------------------- the descriptor cache


def _files(tmp_path: Path, n: int) -> list[str]:
    paths = [str(tmp_path / f"f{i}") for i in range(n)]
    for p in paths:
        Path(p).write_bytes(b"x")
    return paths


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_cache_closes_the_least_recently_used_file(tmp_path: Path) -> None:
    a, b, c = _files(tmp_path, 3)
    cache = FileCache(2)
    with cache.use(a) as fa:
        pass
    with cache.use(b):
        pass
    with cache.use(a) as again:
        assert again == fa  # a hit: a is now the most recently used
    with cache.use(c):
        pass
    s = cache.statistics()
    assert (s.open_files, s.opens, s.hits, s.evictions) == (2, 3, 1, 1)
    with cache.use(b) as fb:  # b was evicted: opened again, and readable
        assert os.pread(fb, 1, 0) == b"x"
    assert cache.statistics().opens == 4
    cache.close()
    assert cache.statistics().open_files == 0


def test_a_file_in_use_is_never_closed(tmp_path: Path) -> None:
    paths = _files(tmp_path, 5)
    cache = FileCache(1)
    with cache.use(paths[0]) as held:
        for p in paths[1:]:
            with cache.use(p):  # one over the bound while both are in use
                assert cache.statistics().open_files == 2
            assert cache.statistics().open_files == 1  # the newcomer went, not ``held``
        assert _is_open(held) and os.pread(held, 1, 0) == b"x"
    with cache.use(paths[1]) as fd:
        cache.forget(paths[1])  # deleted while in use: closed once its user leaves
        assert _is_open(fd)
    assert cache.statistics().open_files == 0
    with pytest.raises(FileNotFoundError), cache.use(str(tmp_path / "missing")):
        pass
    cache.close()


# ---------------------------------------------------------------- lazy, evicting queues


def _config(tmp_path: Path, **kw: object) -> StoreConfig:
    return StoreConfig(data_dir=str(tmp_path / "data"), segment_bytes=64 << 10,
                       cq_entries_per_file=10, **kw)  # type: ignore[arg-type]


@pytest.fixture
def small_cache(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(_config(tmp_path, max_open_files=2), SystemClock())
    s.open()
    s.start()
    yield s
    s.stop()


def _send(s: MessageStore, topics: list[str], rounds: int) -> dict[tuple[str, int], list[int]]:
    """``rounds`` messages per queue (keys pick the queue); the commit offsets per queue."""
    sent: dict[tuple[str, int], list[int]] = {}
    for r in range(rounds):
        msgs = [Message("", t, f"{t}-{q}-{r}".encode(), key=_key_for(q)) for t in topics
                for q in range(2)]
        for info in s.put(msgs).result(10):
            sent.setdefault((info.topic, info.queue_id), []).append(info.commit_offset)
    assert s.wait_visible(10)
    return sent


def _key_for(queue_id: int) -> str:
    """A key that maps to ``queue_id`` of a two-queue topic (the store takes crc32 % 2)."""
    return next(k for k in (f"k{i}" for i in range(100)) if zlib.crc32(k.encode()) % 2
                == queue_id)


def _read(s: MessageStore, topic: str, qid: int) -> list[int]:
    out: list[int] = []
    while entries := s.consume_queue_entries(topic, qid, len(out), 7):
        out += [e.commit_offset for e in entries]
    return out


def test_evicted_queues_reopen_and_appends_land(small_cache: MessageStore,
                                                tmp_path: Path) -> None:
    # Given 12 topics x 2 queues and a cache of two descriptors
    topics = [f"t{i:02d}" for i in range(12)]
    for t in topics:
        small_cache.create_topic(Topic(t, 2))
    # When every queue is written 25 times (three files each), round after round
    sent = _send(small_cache, topics, 25)
    # Then every queue reads back densely, through at most two open files
    for (t, q), offsets in sent.items():
        assert _read(small_cache, t, q) == offsets
    stats = small_cache.queues.statistics()
    assert stats.open_files <= 2 and stats.evictions > 100
    assert small_cache.statistics().cq_files_open <= 2
    # And after a restart, each queue continues at its end
    small_cache.stop()
    s = MessageStore(_config(tmp_path, max_open_files=2), SystemClock())
    s.open()
    s.start()
    try:
        more = _send(s, topics, 3)
        for key, offsets in more.items():
            assert _read(s, *key) == sent[key] + offsets
            assert s.queue_bounds(*key) == (0, 28)
    finally:
        s.stop()


def test_a_clean_restart_reads_no_queue_and_a_cut_tail_walks_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(tmp_path)
    s = MessageStore(config, SystemClock())
    s.open()
    s.start()
    for t in ("a", "b"):
        s.create_topic(Topic(t, 2))
    sent = _send(s, ["a", "b"], 5)
    s.stop()
    # Given a clean stop: the start loads no queue (each loads on first use)
    caplog.set_level(logging.INFO, logger="store.store")
    s = MessageStore(config, SystemClock())
    s.open()
    assert s.queues.loaded() == []
    assert "checking every consume queue" not in caplog.text
    s.stop()
    # When the CommitLog loses its last record (a cut made from outside)
    last = max(o for offsets in sent.values() for o in offsets)
    segment = sorted((tmp_path / "data" / "commitlog").glob("*.log"))[-1]
    os.truncate(segment, last - int(segment.name[:-4]))
    # Then the start walks every queue and the lost entry is a hole; its offset stays used
    s = MessageStore(config, SystemClock())
    s.open()
    s.start()
    try:
        assert "checking every consume queue" in caplog.text
        key = next(k for k, offsets in sent.items() if last in offsets)
        entries = s.consume_queue_entries(*key, 4, 1)
        assert entries[0].is_hole and s.queue_bounds(*key) == (0, 5)
        (info,) = s.put([Message("", key[0], b"new", key=_key_for(key[1]))]).result(10)
        assert info.queue_offset == 5
    finally:
        s.stop()


def test_flush_async_walks_after_an_os_restart_or_an_unfinished_walk(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(tmp_path, flush="async")
    checkpoints = tmp_path / "data" / "checkpoint"
    caplog.set_level(logging.INFO, logger="store.store")

    def walked() -> bool:
        caplog.clear()
        s = MessageStore(config, SystemClock())
        s.open()
        s.stop()
        return "checking every consume queue" in caplog.text

    assert walked()  # the first start: no boot id kept yet
    assert not walked()  # flush=async, the same boot: written data is still there
    (checkpoints / "boot-id").write_text("another boot\n")
    assert walked()  # the OS restarted: unsynced dispatched data may be gone
    (checkpoints / "consumequeue.walk").write_text("0\n")  # a walk cut short by a crash
    assert walked() and not (checkpoints / "consumequeue.walk").exists()
    assert not walked()


# ---------------------------------------------------------------- the topic log


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(), inner, max_size=3), max_leaves=8)


@given(st.dictionaries(st.text(), _JSON, max_size=4))
def test_a_log_line_round_trips(record: dict[str, object]) -> None:
    line = encode_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_line(line) == record


@given(st.dictionaries(st.text(), _JSON, min_size=1, max_size=4), st.data())
def test_a_flipped_payload_byte_is_caught(record: dict[str, object],
                                          data: st.DataObject) -> None:
    line = bytearray(encode_line(record))
    at = data.draw(st.integers(9, len(line) - 2))  # the JSON, not the CRC or the newline
    line[at] ^= data.draw(st.integers(1, 255))
    assert decode_line(bytes(line)) is None


def _catalogue_with(tmp_path: Path, names: list[str]) -> Path:
    tmp_path.mkdir(exist_ok=True)
    c = TopicCatalogue(str(tmp_path))
    for n in names:
        c.create(Topic(n, 4, since_offset=7))
    c.close()
    return tmp_path / LOG_NAME


def test_a_torn_last_record_of_every_length_is_dropped(tmp_path: Path) -> None:
    path = _catalogue_with(tmp_path / "src", ["a", "b", "c"])
    whole = path.read_bytes()
    last = len(whole.rstrip(b"\n").split(b"\n")[-1]) + 1  # c's record and its newline
    for cut in range(1, last + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / LOG_NAME).write_bytes(whole[:-cut])
        c = TopicCatalogue(str(d))
        assert [t.name for t in c.list()] == ["a", "b"], cut
        c.create(Topic("d", 1))  # appended after the rewritten, clean log
        c.close()
        assert [t.name for t in TopicCatalogue(str(d)).list()] == ["a", "b", "d"], cut


def test_a_damaged_line_costs_that_topic_only(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    path = _catalogue_with(tmp_path, ["a", "b", "c"])
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"b"', b'"x"')  # header, a, b: b's CRC no longer matches
    path.write_bytes(b"\n".join(lines))
    c = TopicCatalogue(str(tmp_path))
    assert [t.name for t in c.list()] == ["a", "c"]
    assert "line 3 is damaged" in caplog.text
    c.close()


def test_topics_json_of_older_versions_is_migrated(tmp_path: Path) -> None:
    legacy = {"version": 1, "topics": [
        {"name": "old", "queue_count": 3, "retention_ms": 5, "retention_bytes": 0,
         "since_offset": 99, "tier_retention_ms": 0}]}
    (tmp_path / "topics.json").write_text(json.dumps(legacy))
    c = TopicCatalogue(str(tmp_path))
    assert c.list() == [Topic("old", 3, 5, 0, 99, 0)]
    assert not (tmp_path / "topics.json").exists() and (tmp_path / LOG_NAME).exists()
    c.close()
    assert TopicCatalogue(str(tmp_path)).list() == [Topic("old", 3, 5, 0, 99, 0)]


def test_concurrent_creates_share_fsyncs_and_all_survive(tmp_path: Path) -> None:
    c = TopicCatalogue(str(tmp_path))
    errors: list[BaseException] = []

    def create(worker: int) -> None:
        try:
            for i in range(60):
                c.create(Topic(f"w{worker}-{i}", 2))
                c.create(Topic(f"w{worker}-{i}", 2))  # the same again: no new record
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(w,)) for w in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.count() == 720 and c.syncs < 720
    c.delete("w0-0")
    c.close()
    again = TopicCatalogue(str(tmp_path))
    assert again.count() == 719 and again.get("w0-0") is None
    again.close()


# ---------------------------------------------------------------- a real server, ulimit -n 1024


def _pipelined(stub: pb_grpc.BrokerStub, requests: list[tuple[str, object]],
               window: int = 64) -> list[object]:
    """Call ``stub.<method>(request)`` for each pair, ``window`` calls in flight."""
    out: list[object] = [None] * len(requests)
    inflight: list[tuple[int, Future[object]]] = []
    for i, (method, request) in enumerate(requests):
        inflight.append((i, getattr(stub, method).future(request, timeout=60)))
        if len(inflight) >= window:
            j, f = inflight.pop(0)
            out[j] = f.result()
    for j, f in inflight:
        out[j] = f.result()
    return out


def _open_files(srv: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{srv.proc.pid}/fd"))


def _pop_all(c: ChronomqClient, topic: str, group: str) -> list[bytes]:
    return sorted(m.body for m in c.pop(topic, group, 16))


@pytest.mark.slow
def test_2500_topics_start_and_serve_under_ulimit_1024(tmp_path: Path) -> None:
    n = 2500
    names = [f"topic-{i:05d}" for i in range(n)]
    srv = ServerProcess(tmp_path / "data", nofile=NOFILE)
    try:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            # Given 2,500 topics x 4 queues, each queue with one message: 10,000 files
            _pipelined(stub, [("CreateTopic", pb.CreateTopicRequest(
                topic=pb.Topic(name=t, queue_count=4))) for t in names])
            sends = _pipelined(stub, [("Send", pb.SendRequest(messages=[
                message(t, f"{t}/{q}".encode()) for q in range(4)])) for t in names])
            assert not [r for resp in sends for r in resp.results  # type: ignore[attr-defined]
                        if r.WhichOneof("outcome") == "error"]
        with ChronomqClient(srv.target) as c:
            wait_until(lambda: c.stats()["store.dispatch_lag_bytes"] <= 0, 120,
                       "the dispatcher to catch up (Stats store.dispatch_lag_bytes 0)",
                       show=lambda: c.stats()["store.dispatch_lag_bytes"], poll_s=0.05)
        assert len(list((tmp_path / "data" / "consumequeue").glob("*/*/*.cq"))) == 4 * n
        assert _open_files(srv) < NOFILE
        # When it restarts under the same limit: cleanly, then after a kill -9 with
        # flush=async and what looks like an OS restart (a new boot id), so that start
        # walks every queue for entries past the log end
        for kill, settings in ((False, ()), (True, ("store.flush=async",))):
            srv.kill9() if kill else srv.terminate()
            if kill:
                (tmp_path / "data" / "checkpoint" / "boot-id").write_text("another boot\n")
            srv = ServerProcess(tmp_path / "data", *settings, nofile=NOFILE)
        # Then Pop serves every queue across the whole range, still under the limit
        with ChronomqClient(srv.target) as c:
            for t in names[::25] + names[-3:]:
                assert _pop_all(c, t, "g") == [f"{t}/{q}".encode() for q in range(4)]
            c.send_one(names[-1], b"after")
            assert [m.body for m in c.pop(names[-1], "g", 16, wait_ms=2000)] == [b"after"]
        assert _open_files(srv) < NOFILE
    finally:
        srv.kill9()


@pytest.mark.slow
def test_a_limit_too_low_fails_the_start_with_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as failed:
        ServerProcess(tmp_path / "data", nofile=200)
    text = str(failed.value)
    assert "RLIMIT_NOFILE is 200" in text and "ulimit -n" in text
    assert "Traceback" not in text


@pytest.mark.slow
def test_a_topic_answered_ok_survives_kill9(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    answered: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def create(worker: int) -> None:
        with ChronomqClient(srv.target, timeout_s=10) as c:
            for i in range(10_000):
                if stop.is_set():
                    return
                name = f"w{worker}-{i}"
                try:
                    c.create_topic(name, 2)
                except Exception:
                    return  # the server is gone
                with lock:  # the ledger: written only after the OK
                    answered.append(name)

    # Given 8 clients creating topics as fast as they can
    threads = [threading.Thread(target=create, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(answered) >= 400, 60, "400 answered CreateTopics",
                   show=lambda: len(answered))
    finally:  # When the broker is killed while creates are in flight
        srv.kill9()
        stop.set()
        for t in threads:
            t.join()
    srv = ServerProcess(tmp_path / "data")
    try:
        with ChronomqClient(srv.target) as c:
            listed = {t.name for t in c.list_topics()}
        # Then every topic whose create answered OK is there
        assert set(answered) <= listed, sorted(set(answered) - listed)[:5]
    finally:
        srv.terminate()


# ---------------------------------------------------------------- the open-file budget


class _Limits:
    """Stands in for ``resource``'s RLIMIT_NOFILE calls."""

    RLIMIT_NOFILE = resource.RLIMIT_NOFILE
    RLIM_INFINITY = resource.RLIM_INFINITY

    def __init__(self, soft: int, hard: int) -> None:
        self.soft, self.hard = soft, hard

    def getrlimit(self, which: int) -> tuple[int, int]:
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert limits[0] <= self.hard
        self.soft, self.hard = limits


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Limits]:
    fake = _Limits(1024, 1024)
    monkeypatch.setattr(openfiles, "resource", fake)
    yield fake


def test_the_cache_takes_what_the_limit_leaves(limits: _Limits, tmp_path: Path) -> None:
    plan = plan_open_files(0, str(tmp_path))
    assert plan.cq_files == 1024 - plan.reserved and plan.cq_files >= 500
    limits.soft, limits.hard = 1024, 1 << 20  # a soft limit below the hard one is raised
    plan = plan_open_files(0, str(tmp_path))
    assert limits.soft == plan.limit == plan.reserved + openfiles.AUTO_MAX_CQ_FILES
    assert plan.cq_files == openfiles.AUTO_MAX_CQ_FILES


def test_a_limit_too_low_names_rlimit_nofile_and_the_value(limits: _Limits,
                                                            tmp_path: Path) -> None:
    with pytest.raises(OpenFilesLimit, match=r"RLIMIT_NOFILE is 1024 .* needs 2\d\d\d open"):
        plan_open_files(2000, str(tmp_path))
    limits.soft = limits.hard = 300
    with pytest.raises(OpenFilesLimit, match=r"ulimit -n \d+"):
        plan_open_files(0, str(tmp_path))
    with pytest.raises(InvalidArgument):
        plan_open_files(-1, str(tmp_path))
