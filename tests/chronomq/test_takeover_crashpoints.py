"""A takeover interrupted by a crash at each of its named crash points, then run again.

Broker A (durable-ack, uploading to a local-directory tier, a journal snapshot every 20
records) runs the crash-point test's scripted, ledgered workload and is killed with
kill -9, its data directory deleted: B replays A's journal from its latest snapshot.
Broker B, armed with ``server.crash_at=takeover.<step>:1``, runs the takeover and dies at
that step; restarted without it, it runs the takeover again, and the group drained from
B must satisfy the ledger checker: nothing acknowledged lost, nothing redelivered after
an ack, no lease broken, nothing early.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError
from store.crashpoint import CRASH_EXIT_CODE, LABELS
from store.journal import SNAPSHOT_POINTER
from testkit.checker import check_ledgers
from testkit.ledger import Ledger, LedgeredClient, drain, now_ms
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.chronomq.test_crashpoints import (
    CRASHPOINT_SETTINGS,
    GROUP,
    REVIVE_SLACK_MS,
    TOPIC,
    _tail,
    scripted_workload,
)

SETTINGS = (*CRASHPOINT_SETTINGS, "tier.durable_ack=true")


@pytest.fixture(scope="module")
def departed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Broker A's tier and the ledger of its workload, once for every label (each test
    takes a copy): A ran the scripted workload and was killed, its data directory gone."""
    root = tmp_path_factory.mktemp("departed")
    a = ServerProcess(root / "a", *SETTINGS, "tier.broker_name=a", "store.node_id=1")
    ledger = Ledger(root / "ledger" / "workload.jsonl")
    with ChronomqClient(a.target, timeout_s=30) as client:
        lc = LedgeredClient(client, ledger, "w", pad_bytes=1024)
        scripted_workload(lc)
    ledger.close()
    # A's journal snapshots (tier.journal_snapshot_records=20): B replays from the latest
    wait_until(lambda: (root / "chronomq-tier" / "a" / SNAPSHOT_POINTER).exists(), 10,
               "A's journal snapshot pointer in the tier")
    a.kill9()
    shutil.rmtree(root / "a")  # the machine is gone
    return root, lc.horizon_ms


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(la for la in LABELS if la.startswith("takeover.")))
def test_a_takeover_crashed_at_each_step_completes_when_run_again(
        tmp_path: Path, departed: tuple[Path, int], label: str) -> None:
    root, horizon_ms = departed
    shutil.copytree(root / "chronomq-tier", tmp_path / "chronomq-tier")  # the shared tier
    shutil.copytree(root / "ledger", tmp_path / "ledger")
    ledgers = tmp_path / "ledger"
    b_settings = (*SETTINGS, "tier.broker_name=b", "store.node_id=2")
    b = ServerProcess(tmp_path / "b", *b_settings, f"server.crash_at={label}:1")
    try:
        with ChronomqClient(b.target, timeout_s=120) as client, pytest.raises(RpcError):
            client.takeover("a", force=True)
        code = b.proc.wait(60)  # (a loaded machine: the crash may come late)
    finally:
        b.kill9()  # gone already (closes its pipe), or never to be left running
    assert code == CRASH_EXIT_CODE, f"{label} not reached:\n" + "\n".join(_tail(b.output))

    b = ServerProcess(tmp_path / "b", *b_settings)
    try:
        with ChronomqClient(b.target, timeout_s=120) as client:
            result = client.takeover("a", force=True)
            assert TOPIC in result.topics
        drain(b.target, ledgers, TOPIC, GROUP, max(horizon_ms, now_ms()) + REVIVE_SLACK_MS,
              grace_s=8)
    finally:
        code = b.terminate()
    report = check_ledgers(ledgers, GROUP)
    assert report.ok, "\n".join([report.summary(), *_tail(b.output)])
    assert code == 0
