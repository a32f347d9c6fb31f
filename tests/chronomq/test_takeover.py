"""A broker's promises outlive its machine: takeover from the shared tier, from outside.

Real processes on SeaweedFS's S3 server.  Broker A (``tier.upload``, ``tier.claim_topics``)
takes immediate and delayed messages (due in seconds, and hours ahead), a consumer group
acks part and holds leases, some delayed messages are cancelled; A is killed with kill -9
and its data directory deleted (the machine is gone).  Broker B runs ``takeover
broker-a``.  A client-side ledger of every OK answer is checked: nothing acknowledged is
lost, nothing cancelled or acked comes, delayed messages come not before their time,
held leases come back only after their invisible time, new sends are accepted with
offsets after A's, and Cancel/Reschedule by id work on B.  With ``tier.durable_ack`` the
ledger must hold exactly; without it the loss is at most the upload lag A reported.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError, message
from testkit.process import ServerProcess, wait_tier_caught_up
from tests.tiered.test_mount import _tier

HOUR_MS = 3_600_000
LEASE_S = 8

# the bucket is set up first, so it is deleted after the broker processes are gone
pytestmark = pytest.mark.usefixtures("seaweed_bucket", "no_process_left")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _common(endpoint: str, bucket: str, name: str, durable: bool) -> list[str]:
    return [*_tier(endpoint, bucket, name), "tier.upload=true", "tier.claim_topics=true",
            "tier.upload_batch_ms=300", f"tier.durable_ack={'true' if durable else 'false'}"]


@pytest.mark.slow
@pytest.mark.parametrize("durable", [True, False], ids=["durable-ack", "local-ack"])
def test_takeover_keeps_a_lost_brokers_promises(tmp_path: Path, seaweed_endpoint: str,
                                                seaweed_bucket: str, durable: bool) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    a = ServerProcess(tmp_path / "a", *_common(endpoint, bucket, "broker-a", durable),
                      "store.node_id=1")
    near: dict[str, tuple[bytes, int]] = {}  # id -> (body, due)
    far: dict[str, tuple[bytes, int]] = {}
    acked: set[str] = set()
    held: dict[str, int] = {}  # id -> when its lease ends (client clock, ms)
    with ChronomqClient(a.target) as c:
        c.create_topic("orders", queue_count=2)
        out = c.send([message("orders", f"now-{i}".encode(), key=f"k{i}") for i in range(60)])
        assert all(o.ok for o in out)
        immediate = {o.message_id for o in out}
        due_near = _now_ms() + 6_000
        out = c.send([message("orders", f"near-{i}".encode(), deliver_at_ms=due_near + i)
                      for i in range(30)])
        near = {o.message_id: (f"near-{i}".encode(), o.deliver_at_ms)
                for i, o in enumerate(out) if o.ok}
        out = c.send([message("orders", f"far-{i}".encode(), delay_ms=3 * HOUR_MS)
                      for i in range(6)])
        far = {o.message_id: (f"far-{i}".encode(), o.deliver_at_ms)
               for i, o in enumerate(out) if o.ok}
        cancelled = list(near)[:4] + list(far)[:1]
        for mid in cancelled:
            assert c.cancel(mid).outcome == "CANCELLED"
        got = c.pop("orders", "billing", 32, LEASE_S)
        got += c.pop("orders", "billing", 32, LEASE_S)
        popped_at = _now_ms()
        assert len(got) >= 40
        to_ack, to_hold = got[:30], got[30:40]
        assert c.ack("billing", [m.receipt_handle for m in to_ack]) == [""] * 30
        acked = {m.message_id for m in to_ack}
        held = {m.message_id: popped_at + LEASE_S * 1000 for m in to_hold}
        nacked = {m.message_id for m in got[40:42]}  # given back: a retry copy, later
        assert c.nack("billing", [m.receipt_handle for m in got[40:42]], 2_000) == ["", ""]
        lag_before_kill = 0.0  # durable-ack: every OK above waited for the tier
        if not durable:  # a tail sent just before the kill may not be in the tier yet
            wait_tier_caught_up(c)
            out = c.send([message("orders", f"tail-{i}".encode()) for i in range(20)])
            immediate |= {o.message_id for o in out if o.ok}
            lag_before_kill = c.stats()["tier.upload_lag_bytes"]
    a.kill9()
    shutil.rmtree(tmp_path / "a")  # the machine is gone

    b = ServerProcess(tmp_path / "b", *_common(endpoint, bucket, "broker-b", durable),
                      "store.node_id=2")
    try:
        with ChronomqClient(b.target) as c:
            with pytest.raises(RpcError) as refused:
                c.takeover("broker-a")  # A wrote a moment ago: it may be alive
            assert refused.value.code.name == "FAILED_PRECONDITION"
            started = time.monotonic()
            r = c.takeover("broker-a", force=True)
            took_s = time.monotonic() - started
            assert "orders" in r.topics
            (orders,) = [t for t in c.list_topics() if t.name == "orders"]
            assert (orders.queue_count, orders.taken_over_from) == (2, "broker-a")
            stats = c.stats()
            assert stats["takeover.broker-a.done"] == 1.0
            assert stats["takeover.broker-a.groups"] >= 1
            # new sends are accepted, after A's offsets
            new_id = c.send_one("orders", b"after-takeover")
            # Cancel and Reschedule by id reach A's pending messages here
            far_left = [mid for mid in far if mid not in cancelled]
            assert c.cancel(far_left[0]).outcome == "CANCELLED"
            moved = c.reschedule(far_left[1], delay_ms=1_000)
            assert moved.outcome == "RESCHEDULED"
            # consume everything until every expected message came
            expected = ((set(near) - set(cancelled)) | {far_left[1], new_id} | set(held)
                        | nacked
                        | (immediate - acked - {m.message_id for m in got}))
            seen: dict[str, int] = {}
            deadline = time.monotonic() + 60
            all_due_ms = max([*held.values(), *(due for _, due in near.values()),
                              moved.deliver_at_ms]) + 3_000
            while time.monotonic() < deadline and not expected <= set(seen):
                got_now = c.pop("orders", "billing", 32, 30, 1000)
                if not got_now and _now_ms() > all_due_ms:
                    break  # everything had its time: what is missing is lost
                for m in got_now:
                    at = _now_ms()
                    assert m.message_id not in acked, "an acked message came again"
                    assert m.message_id not in cancelled, "a cancelled message came"
                    if m.message_id in held:
                        assert at >= held[m.message_id] - 50, "a held lease was broken"
                    if m.message_id in near:
                        assert at >= near[m.message_id][1], "delivered before its time"
                        assert m.body == near[m.message_id][0]
                    seen.setdefault(m.message_id, at)
                    c.ack("billing", [m.receipt_handle])
            missing = expected - set(seen)
            if durable:
                kinds = {"held": set(held), "nacked": nacked, "near": set(near),
                         "immediate": immediate}
                assert not missing, "lost after takeover: " + ", ".join(
                    f"{k} {len(missing & v)}" for k, v in kinds.items())
            else:
                assert len(missing) * 60 <= lag_before_kill, (missing, lag_before_kill)
            late = [seen[m] - near[m][1] for m in near if m in seen]
            assert max(late) <= took_s * 1000 + 5_000, "pending messages came too late"
            # the far-future ones left are pending here, found by id
            assert c.reschedule(far_left[2], delay_ms=2 * HOUR_MS).outcome == "RESCHEDULED"
    finally:
        b.terminate()


@pytest.mark.slow
def test_a_second_takeover_is_refused_and_a_rerun_resumes(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    a = ServerProcess(tmp_path / "a", *_common(endpoint, bucket, "broker-a", True))
    with ChronomqClient(a.target) as c:
        c.create_topic("t1")
        c.send_one("t1", b"x", delay_ms=HOUR_MS)
    a.kill9()
    b = ServerProcess(tmp_path / "b", *_common(endpoint, bucket, "broker-b", True))
    c2 = ServerProcess(tmp_path / "c", *_common(endpoint, bucket, "broker-c", True))
    try:
        with ChronomqClient(b.target) as cb, ChronomqClient(c2.target) as cc:
            r = cb.takeover("broker-a", force=True)
            assert r.pending == 1
            with pytest.raises(RpcError) as other:
                cc.takeover("broker-a", force=True)
            assert other.value.code.name == "FAILED_PRECONDITION"
            assert "broker-b" in other.value.details
            again = cb.takeover("broker-a", force=True)  # idempotent: nothing twice
            assert again.pending == 1
    finally:
        b.terminate()
        c2.terminate()


@pytest.mark.slow
def test_a_chain_of_takeovers_serves_every_brokers_backlog(
        tmp_path: Path, seaweed_endpoint: str, seaweed_bucket: str) -> None:
    """A is taken over by B, which takes sends and is lost in turn; C takes B over and
    serves A's backlog and B's, to a group that starts from the beginning and to one
    that acked part on A."""
    endpoint, bucket = seaweed_endpoint, seaweed_bucket
    sent: set[str] = set()
    a = ServerProcess(tmp_path / "a", *_common(endpoint, bucket, "broker-a", True))
    with ChronomqClient(a.target) as c:
        c.create_topic("chain", queue_count=2)
        sent |= {c.send_one("chain", f"a{i}".encode()) for i in range(20)}
        got = c.pop("chain", "early", 5, 60)
        assert c.ack("early", [m.receipt_handle for m in got]) == [""] * len(got)
        acked = {m.message_id for m in got}
    a.kill9()
    b = ServerProcess(tmp_path / "b", *_common(endpoint, bucket, "broker-b", True))
    with ChronomqClient(b.target) as c:
        c.takeover("broker-a", force=True)
        sent |= {c.send_one("chain", f"b{i}".encode()) for i in range(20)}
    b.kill9()
    c3 = ServerProcess(tmp_path / "c", *_common(endpoint, bucket, "broker-c", True))
    try:
        with ChronomqClient(c3.target) as c:
            r = c.takeover("broker-b", force=True)
            assert "chain" in r.topics
            sent |= {c.send_one("chain", f"c{i}".encode()) for i in range(5)}
            for group, want in (("fresh", sent), ("early", sent - acked)):
                seen: set[str] = set()
                while batch := c.pop("chain", group, 32, 60):
                    seen |= {m.message_id for m in batch}
                    c.ack(group, [m.receipt_handle for m in batch])
                assert seen == want, (group, len(seen), len(want))
    finally:
        c3.terminate()
