"""A durable commit in two request rounds (issue 52): the data objects, then the one
conditional lease write that names them (``tiered.carried``) and fences.  The queues'
metadata copies follow off the path of an OK, so a broker whose copies cannot go in at
all still answers OK, and a broker taking it over reads what it acknowledged from the
lease.  Real brokers in one process, a real local-directory tier, RocksDB, a manual
clock.

Before the commit record an OK waited for the copies (three rounds): with every copy
refused, a durable Send timed out (``TierUnavailable``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import chronomq.broker
from chronomq.client import ChronomqClient, RpcError
from store.clock import ManualClock
from store.crashpoint import CRASH_EXIT_CODE
from store.message import Message, draft_of
from store.names import STATE_STREAM
from store.topics import Topic
from testkit.checker import check_ledgers
from testkit.ledger import Ledger, LedgeredClient, drain, now_ms
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.chronomq.test_duplicate_durability import Faulty
from tests.chronomq.test_takeover_at_most_once import _broker
from tiered.carried import carried, meta_prefix
from tiered.providers.local import LocalProvider

CRASH_TOPIC, GROUP = "cr", "g"


@pytest.fixture
def refusing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Faulty:
    """The tier, refusing every write of a queue's metadata copy."""
    faulty = Faulty(LocalProvider(str(tmp_path / "tier")))
    faulty.refuse = "/meta/"
    monkeypatch.setattr(chronomq.broker, "make_provider", lambda config: faulty)
    return faulty


@pytest.fixture
def alive(refusing: Faulty) -> Iterator[list[chronomq.broker.Broker]]:
    """The brokers a test opened, stopped at its end (the tier let through, to drain)."""
    brokers: list[chronomq.broker.Broker] = []
    yield brokers
    refusing.refuse = ""
    for broker in brokers:
        broker.stop()


def _open(root: Path, name: str, clock: ManualClock, alive: list[chronomq.broker.Broker]
          ) -> chronomq.broker.Broker:
    b = _broker(root, name, clock)
    alive.append(b)
    return b


def _popped_at_b(root: Path, clock: ManualClock, alive: list[chronomq.broker.Broker]
                 ) -> list[str]:
    """B takes A over; what group g pops of t there."""
    b = _open(root, "b", clock, alive)
    assert b.takeover("a", force=True).done
    return sorted(p.message.message_id for p in b.pop.pop("t", "g", 32, 60))


def _send(b: chronomq.broker.Broker, n: int) -> list[str]:
    """Send ``n`` to ``t``, answered OK (in the tier: durable-ack)."""
    drafts = [draft_of(Message("", "t", f"m{i}".encode())) for i in range(n)]
    submission = b.sender.submit(drafts, b.clock.now_ms())
    return [i.message_id for i in b.sender.stored(submission)]


def test_a_durable_send_is_ok_without_its_metadata_copy_and_its_successor_serves_it(
        tmp_path: Path, manual_clock: ManualClock, refusing: Faulty,
        alive: list[chronomq.broker.Broker]) -> None:
    # Given A, durable-ack, whose tier refuses every metadata copy
    a = _open(tmp_path, "a", manual_clock, alive)
    a.create_topic(Topic("t", 1))

    # When A sends five: each answered OK (the lease write named their objects)
    sent = _send(a, 5)
    assert not refusing.inner.list(meta_prefix("a") + "t/")  # no copy of t's queue
    assert f"{meta_prefix('a')}t/0.json" in carried(refusing.inner, "a")

    # Then B, taking A over (A still running: the claim fences it), serves all five
    assert _popped_at_b(tmp_path, manual_clock, alive) == sorted(sent)


def test_a_restart_carries_on_what_the_lease_carried(
        tmp_path: Path, manual_clock: ManualClock, refusing: Faulty,
        alive: list[chronomq.broker.Broker]) -> None:
    # Given A sent five and acked two of them, nothing of it in a metadata copy
    a = _open(tmp_path, "a", manual_clock, alive)
    a.create_topic(Topic("t", 1))
    sent = _send(a, 5)
    acked = a.pop.pop("t", "g", 2, 60)
    assert a.pop.ack_many("g", [p.receipt_handle for p in acked]) == [None, None]
    state = f"{meta_prefix('a')}{STATE_STREAM}/0.json"
    assert state in carried(refusing.inner, "a")

    # When A restarts on its data, the copies still refused, and stops again
    a.stop()
    alive.remove(a)
    a = _open(tmp_path, "a", manual_clock, alive)
    assert {f"{meta_prefix('a')}t/0.json", state} <= set(carried(refusing.inner, "a"))
    a.stop()
    alive.remove(a)

    # Then B, taking A over, serves the three not acked, never the two acked
    assert _popped_at_b(tmp_path, manual_clock, alive) == \
        sorted(set(sent) - {p.message.message_id for p in acked})


@pytest.mark.slow
@pytest.mark.parametrize("after", ["restart", "takeover"])
@pytest.mark.parametrize("nth", [3, 8])
def test_a_crash_after_a_commit_record_keeps_every_ok(tmp_path: Path, after: str,
                                                      nth: int) -> None:
    """A broker process killed (``tier.after_commit_record``) the moment a commit record
    is in, its copies not: restarted on its data, or taken over by another with none,
    every send answered OK comes, nothing acked OK comes again."""
    tier, ledgers = tmp_path / "tier", tmp_path / "ledger"
    settings = ("tier.upload=true", "tier.durable_ack=true", "tier.provider=local",
                f"tier.local_dir={tier}")
    srv = ServerProcess(tmp_path / "a", *settings, "tier.broker_name=a",
                        f"server.crash_at=tier.after_commit_record:{nth}")
    ledger = Ledger(ledgers / "workload.jsonl")
    with ChronomqClient(srv.target, timeout_s=10) as client:
        lc = LedgeredClient(client, ledger, "w")
        client.create_topic(CRASH_TOPIC, queue_count=2)  # (before the crash)
        try:
            for _ in range(50):  # until the crash
                lc.send([lc.draft(CRASH_TOPIC) for _ in range(4)])
                lc.ack(GROUP, lc.pop(CRASH_TOPIC, GROUP, 3, invisible_time_s=1))
        except RpcError:
            pass
    ledger.close()
    assert srv.proc.wait(10) == CRASH_EXIT_CODE, "".join(srv.output)
    srv.kill9()  # (gone: closes its pipe)
    assert carried(LocalProvider(str(tier)), "a")  # what the copies did not have yet

    if after == "restart":
        survivor = ServerProcess(tmp_path / "a", *settings, "tier.broker_name=a")
    else:
        survivor = ServerProcess(tmp_path / "b", *settings, "tier.broker_name=b",
                                 "tier.takeover=a")
    try:
        with ChronomqClient(survivor.target, timeout_s=10) as client:
            wait_until(lambda: _served(client), 30,
                       f"{CRASH_TOPIC} served by the survivor (a takeover runs after start)")
        # (a Pop answered by none leased its messages for 1 s: they come back)
        drain(survivor.target, ledgers, CRASH_TOPIC, GROUP, now_ms() + 2000, grace_s=8)
    finally:
        code = survivor.terminate()
    report = check_ledgers(ledgers, GROUP)
    assert report.ok, report.summary() + "\n" + "".join(survivor.output[-30:])
    assert code == 0


def _served(client: ChronomqClient) -> bool:
    """Whether the survivor serves the topic (a Pop of another group answers)."""
    try:
        client.pop(CRASH_TOPIC, "probe", 1, invisible_time_s=1)
    except RpcError:  # NOT_FOUND, or UNAVAILABLE while held by the takeover
        return False
    return True
