"""A takeover whose taker is lost at each of its steps is finished by a third broker.

Issue 51, finding 1: broker A is lost; B, taking A over, is lost too (kill -9 at a named
crash point of the takeover, its data directory gone with its machine).  C takes B over:
what B had begun of A is finished at C (B's intent in the tier names A; A's lease names
B, which C took over), so A's topics are not stranded.  The group drained from C must
satisfy the ledger checker: nothing acknowledged lost, nothing redelivered after an ack,
no lease broken, nothing early.  A's workload is the crash-point test's scripted one,
with durable-ack on a local-directory tier.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest

from chronomq.client import ChronomqClient, RpcError
from cluster.layout import lease_path
from store.crashpoint import CRASH_EXIT_CODE, LABELS
from testkit.checker import check_ledgers
from testkit.ledger import drain, now_ms
from testkit.process import ServerProcess
from tests.chronomq.test_crashpoints import GROUP, REVIVE_SLACK_MS, TOPIC, _tail
from tests.chronomq.test_takeover_crashpoints import SETTINGS, departed  # noqa: F401

STEPS = sorted(la for la in LABELS if la.startswith("takeover."))
FINISHED = {"takeover.after_done", "takeover.after_owners"}  # B had taken A over


def _lease(tier: Path, broker: str) -> dict[str, object]:
    data = json.loads((tier / lease_path(broker)).read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("label", STEPS)
def test_a_takeover_whose_taker_dies_at_each_step_is_finished_by_a_third_broker(
        tmp_path: Path, departed: tuple[Path, int], label: str) -> None:  # noqa: F811
    root, horizon_ms = departed
    tier = tmp_path / "chronomq-tier"
    shutil.copytree(root / "chronomq-tier", tier)  # the shared tier
    shutil.copytree(root / "ledger", tmp_path / "ledger")
    ledgers = tmp_path / "ledger"
    # Given B, taking A over, dies at one step of it, its machine gone with it
    b = ServerProcess(tmp_path / "b", *SETTINGS, "tier.broker_name=b", "store.node_id=2",
                      f"server.crash_at={label}:1")
    try:
        with ChronomqClient(b.target, timeout_s=120) as client, pytest.raises(RpcError):
            client.takeover("a", force=True)
        code = b.proc.wait(60)  # (a loaded machine: the crash may come late)
    finally:
        b.kill9()
    assert code == CRASH_EXIT_CODE, f"{label} not reached:\n" + "\n".join(_tail(b.output))
    shutil.rmtree(tmp_path / "b")
    claimed = label != "takeover.after_intent"
    assert (_lease(tier, "a").get("taken_by") == "b") is claimed

    # When C takes B over
    c = ServerProcess(tmp_path / "c", *SETTINGS, "tier.broker_name=c", "store.node_id=3")
    try:
        with ChronomqClient(c.target, timeout_s=120) as client:
            client.takeover("b", force=True)
            # Then A's topic is C's: with B's (B finished taking A over before it died),
            # inherited with B's claim, or (B never claimed A) taken over as any
            # departed broker is
            if label in FINISHED:
                assert _lease(tier, "a").get("taken_by") == "b"
            elif claimed:
                assert _lease(tier, "a").get("taken_by") == "c"
            else:
                assert not _lease(tier, "a").get("taken_by")
                client.takeover("a", force=True)
            assert TOPIC in {t.name for t in client.list_topics()}
        drain(c.target, ledgers, TOPIC, GROUP, max(horizon_ms, now_ms()) + REVIVE_SLACK_MS,
              grace_s=8)
    finally:
        code = c.terminate()
    report = check_ledgers(ledgers, GROUP)
    assert report.ok, "\n".join([report.summary(), *_tail(c.output)])
    assert code == 0


@pytest.mark.slow
def test_taking_over_a_broker_whose_taker_is_alive_is_refused_with_its_name(
        tmp_path: Path, departed: tuple[Path, int]) -> None:  # noqa: F811
    root, _ = departed
    shutil.copytree(root / "chronomq-tier", tmp_path / "chronomq-tier")
    b = ServerProcess(tmp_path / "b", *SETTINGS, "tier.broker_name=b", "store.node_id=2")
    c = ServerProcess(tmp_path / "c", *SETTINGS, "tier.broker_name=c", "store.node_id=3")
    try:
        with ChronomqClient(b.target, timeout_s=120) as client:
            client.takeover("a", force=True)
        # Given B took A over; When C is asked to take A over
        with ChronomqClient(c.target, timeout_s=60) as client, \
                pytest.raises(RpcError) as refused:
            client.takeover("a", force=True)
        # Then C refuses, naming B (alive, not taken over by C)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "taken over by b" in refused.value.details
    finally:
        b.terminate()
        c.terminate()
