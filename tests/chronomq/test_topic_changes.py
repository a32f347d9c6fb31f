"""CreateTopic and DeleteTopic pass the fence once durable, from outside (issue 51, 2).

Real broker processes on SeaweedFS's S3 (``tier.upload``, ``tier.durable_ack``,
``tier.claim_topics``), killed with kill -9, taken over by another broker
(``chronomq takeover``):

- a topic deleted with an OK never comes back at the successor, nor its acked
  messages; one deleted and created again comes back as the new one only;
- a topic created with an OK is at the successor, its copy in the tier when the OK came;
- each named crash point of a create and a delete (``topic.*``): the broker dies there,
  the successor takes it over, and whatever it holds is consistent: a topic it has is
  owned by it and brings back no acked message; a topic it has not is owned by nobody,
  so its name can be used again;
- a delete cut short before the group's positions were dropped, then a restart (no
  takeover): the start finishes it, so the topic created again is read from its start.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from botocore.exceptions import ClientError

from chronomq.client import ChronomqClient, RpcError, message
from store.crashpoint import CRASH_EXIT_CODE, LABELS
from testkit.process import ServerProcess, wait_tier_caught_up
from testkit.seaweed import s3_client
from tests.tiered.test_mount import _tier

# the bucket is set up first, so it is deleted after the broker processes are gone
pytestmark = pytest.mark.usefixtures("seaweed_bucket", "no_process_left")

TOPIC, GROUP = "orders", "g"


def _settings(endpoint: str, bucket: str, name: str, node: int) -> list[str]:
    return [*_tier(endpoint, bucket, name), "tier.upload=true", "tier.claim_topics=true",
            "tier.durable_ack=true", f"store.node_id={node}"]


def _send_and_ack(c: ChronomqClient, count: int = 20, prefix: str = "m") -> set[str]:
    """Send ``count`` messages to ``TOPIC``, pop and ack them all; their ids."""
    out = c.send([message(TOPIC, f"{prefix}{i}".encode()) for i in range(count)])
    assert all(o.ok for o in out)
    acked: set[str] = set()
    while len(acked) < count:
        got = c.pop(TOPIC, GROUP, 32, 30, 1000)
        assert got, f"only {len(acked)} of {count} popped"
        assert c.ack(GROUP, [m.receipt_handle for m in got]) == [""] * len(got)
        acked |= {m.message_id for m in got}
    return acked


def _popped(c: ChronomqClient, most: int = 200) -> set[str]:
    """Every message a Pop of ``TOPIC`` gives the group now (acked at once; at most
    ``most`` Pops, so a broker that keeps giving fails the test, not its time-out)."""
    seen: set[str] = set()
    for _ in range(most):
        got = c.pop(TOPIC, GROUP, 32, 30, 500)
        if not got:
            return seen
        seen |= {m.message_id for m in got}
        c.ack(GROUP, [m.receipt_handle for m in got])
    raise AssertionError(f"Pops kept giving messages: {len(seen)} distinct so far")


def _owner(endpoint: str, bucket: str, topic: str) -> str | None:
    """The broker ``owners/<topic>.json`` names (None: no record)."""
    try:
        body = s3_client(endpoint).get_object(Bucket=bucket, Key=f"owners/{topic}.json")
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchKey"
        return None
    return str(json.loads(body["Body"].read())["broker"])


def _topics(c: ChronomqClient) -> list[str]:
    return [t.name for t in c.list_topics()]


def _take_over(b: ServerProcess, departed: str) -> None:
    with ChronomqClient(b.target, timeout_s=120) as cb:
        cb.takeover(departed, force=True)


@pytest.mark.slow
def test_a_deleted_topic_never_comes_back_at_a_takeover(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # Given broker A had a topic whose 20 messages were all acked, then deleted (OK)
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1))
    with ChronomqClient(a.target) as c:
        c.create_topic(TOPIC, queue_count=2)
        _send_and_ack(c)
        c.delete_topic(TOPIC)
    # When A is killed -9 and B takes it over
    a.kill9()
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    _take_over(b, "broker-a")
    # Then the topic is not at B, nobody owns it, and a new one of that name is empty
    with ChronomqClient(b.target) as c:
        assert TOPIC not in _topics(c)
        with pytest.raises(RpcError) as missing:
            c.pop(TOPIC, GROUP, 32, 30)
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert _owner(endpoint, bucket, TOPIC) is None
        assert c.create_topic(TOPIC)
        assert _popped(c) == set()
    b.terminate()


@pytest.mark.slow
def test_a_name_deleted_and_taken_by_the_successor_does_not_block_the_takeover(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1))
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    # Given A deleted a topic (OK) whose name B then created, and A had another topic
    with ChronomqClient(a.target) as ca, ChronomqClient(b.target) as cb:
        ca.create_topic(TOPIC, queue_count=2)
        acked = _send_and_ack(ca)
        ca.delete_topic(TOPIC)
        assert cb.create_topic(TOPIC)
        ca.create_topic("payments")
        kept = ca.send_one("payments", b"p")
    a.kill9()
    # When B takes A over, it is not refused for the name it has
    _take_over(b, "broker-a")
    # Then B has A's other topic, and its own of the deleted name without A's messages
    with ChronomqClient(b.target) as cb:
        assert {"payments", TOPIC} <= set(_topics(cb))
        assert [m.message_id for m in cb.pop("payments", GROUP, 32, 30, 1000)] == [kept]
        assert not _popped(cb) & acked
    b.terminate()


@pytest.mark.slow
@pytest.mark.parametrize("sent_after", [0, 3])
def test_a_topic_deleted_and_created_again_comes_back_as_the_new_one(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str, sent_after: int) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # Given A deleted a topic whose messages were acked, created it again, sent some
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1))
    with ChronomqClient(a.target) as c:
        c.create_topic(TOPIC, queue_count=2)
        _send_and_ack(c)
        c.delete_topic(TOPIC)
        assert c.create_topic(TOPIC, queue_count=2)
        new = {c.send_one(TOPIC, b"new%d" % i) for i in range(sent_after)}
    a.kill9()
    # When B takes A over
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    _take_over(b, "broker-a")
    # Then B has the topic, with the new messages only (none: its tier holds only the
    # deleted one's queues)
    with ChronomqClient(b.target) as c:
        assert TOPIC in _topics(c)
        assert _popped(c) == new
    assert _owner(endpoint, bucket, TOPIC) == "broker-b"
    b.terminate()


@pytest.mark.slow
def test_a_created_topic_is_in_the_tier_when_create_answers(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # (uploads every 5 s: a copy "with the next upload" would come late)
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1),
                      "tier.upload_batch_ms=5000")
    # When A answers OK to CreateTopic
    with ChronomqClient(a.target) as c:
        assert c.create_topic(TOPIC, queue_count=2)
        # Then its catalogue copy in the tier names the topic already
        raw = s3_client(endpoint).get_object(Bucket=bucket, Key="broker-a/topics.json")
        assert TOPIC in [t["name"] for t in json.loads(raw["Body"].read())["topics"]]
    # and killed at once, A's successor has it
    a.kill9()
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    _take_over(b, "broker-a")
    with ChronomqClient(b.target) as c:
        assert TOPIC in _topics(c)
    assert _owner(endpoint, bucket, TOPIC) == "broker-b"
    b.terminate()


# (label, its hit to crash at, and what the client does): the copy is written by a
# create first, so a delete's pass of ``topic.after_catalogue`` is its second
_WALK = [(label, 1, "create") for label in ("topic.after_claim", "topic.after_create",
                                            "topic.after_catalogue")] + \
        [(label, 1, "delete") for label in ("topic.after_delete", "topic.after_forget")] + \
        [("topic.after_catalogue", 2, "delete")]


def test_the_walk_names_every_topic_crash_point() -> None:
    assert {label for label, _, _ in _WALK} == {la for la in LABELS if la.startswith("topic.")}


@pytest.mark.slow
@pytest.mark.parametrize("label, nth, change", _WALK)
def test_a_topic_change_cut_short_is_consistent_at_the_successor(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str, label: str, nth: int,
        change: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # Given broker A dies at the crash point, in a create or in a delete of a topic whose
    # 20 messages were acked
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1),
                      f"server.crash_at={label}:{nth}")
    acked: set[str] = set()
    with ChronomqClient(a.target, timeout_s=30) as c, pytest.raises(RpcError):
        c.create_topic(TOPIC, queue_count=2)
        acked = _send_and_ack(c)
        c.delete_topic(TOPIC)
    assert a.wait_exit() == CRASH_EXIT_CODE, f"{label}:{nth} not reached"
    assert (change == "delete") == bool(acked)
    # When B takes A over
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    _take_over(b, "broker-a")
    with ChronomqClient(b.target) as c:
        if TOPIC in _topics(c):  # Then a topic B has is B's, without its acked messages
            assert _owner(endpoint, bucket, TOPIC) == "broker-b"
        else:  # or one B has not is nobody's: its name can be used again
            assert _owner(endpoint, bucket, TOPIC) is None
            assert c.create_topic(TOPIC)
        assert not _popped(c) & acked
    b.terminate()


@pytest.mark.slow
@pytest.mark.parametrize("label, nth", [("topic.after_delete", 1),
                                        ("topic.after_catalogue", 2)])
def test_a_delete_cut_short_is_finished_at_restart(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str, label: str,
        nth: int) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    settings = _settings(endpoint, bucket, "broker-a", 1)
    # Given A died in a DeleteTopic of a topic whose 20 messages were acked, before it
    # dropped the group's positions
    a = ServerProcess(tmp_path / "a", *settings, f"server.crash_at={label}:{nth}")
    with ChronomqClient(a.target, timeout_s=30) as c, pytest.raises(RpcError):
        c.create_topic(TOPIC, queue_count=2)
        _send_and_ack(c)
        c.delete_topic(TOPIC)
    assert a.wait_exit() == CRASH_EXIT_CODE
    # When it restarts: the topic is gone, and so is what the group kept of it, so the
    # topic created again gives the group every message sent to it (the old positions
    # would skip the first 20)
    a = ServerProcess(tmp_path / "a", *settings)
    with ChronomqClient(a.target) as c:
        assert TOPIC not in _topics(c)
        assert c.create_topic(TOPIC, queue_count=2)
        sent = {c.send_one(TOPIC, b"again%d" % i) for i in range(20)}
        assert _popped(c) == sent
    raw = s3_client(endpoint).get_object(Bucket=bucket, Key="broker-a/topics.json")
    assert TOPIC in [t["name"] for t in json.loads(raw["Body"].read())["topics"]]
    assert a.terminate() == 0


@pytest.mark.slow
def test_a_taken_over_topic_deleted_and_created_again_is_the_new_one_only(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # Given B took over A's topic, whose 20 messages were all acked
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1))
    with ChronomqClient(a.target) as c:
        c.create_topic(TOPIC, queue_count=2)
        (chosen,) = c.send([message(TOPIC, b"chosen", message_id="CHOSEN-1")])
        acked = _send_and_ack(c) | _popped(c) | {chosen.message_id}
    a.kill9()
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    _take_over(b, "broker-a")
    # When B deletes it and creates it again (a purge)
    with ChronomqClient(b.target) as c:
        c.delete_topic(TOPIC)
        assert c.create_topic(TOPIC, queue_count=2)
        new = {c.send_one(TOPIC, b"new%d" % i) for i in range(3)}
        # (an id A stored for the old topic is not a duplicate in the new one)
        (again,) = c.send([message(TOPIC, b"again", message_id="CHOSEN-1")])
        assert again.ok and not again.duplicate
        new.add(again.message_id)
        # Then B serves the new messages only, not A's from A's tier
        assert _popped(c) == new
        more = c.send_one(TOPIC, b"more")
    # and so does B restarted, and C, which takes B over
    assert b.terminate() == 0
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    with ChronomqClient(b.target) as c:
        assert _popped(c) == {more}
    b.kill9()
    c3 = ServerProcess(tmp_path / "c", *_settings(endpoint, bucket, "broker-c", 3))
    _take_over(c3, "broker-b")
    with ChronomqClient(c3.target) as c:
        assert TOPIC in _topics(c)
        assert not _popped(c) & acked
    c3.terminate()


@pytest.mark.slow
def test_a_mount_serves_no_deleted_topic(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    # Given A deleted a topic whose messages are in its tier, and kept another
    a = ServerProcess(tmp_path / "a", *_settings(endpoint, bucket, "broker-a", 1))
    with ChronomqClient(a.target) as c:
        c.create_topic(TOPIC, queue_count=2)
        _send_and_ack(c)
        c.delete_topic(TOPIC)
        c.create_topic("kept")
        c.send_one("kept", b"k")
        wait_tier_caught_up(c)
    a.kill9()
    # When B mounts A's tier read-only
    b = ServerProcess(tmp_path / "b", *_settings(endpoint, bucket, "broker-b", 2))
    with ChronomqClient(b.target) as c:
        # Then it serves the kept topic only, and claims no owner record for the other
        assert c.mount("broker-a") == ["kept"]
    assert _owner(endpoint, bucket, TOPIC) is None
    b.terminate()
