"""A timer snapshot, the tier retention that deletes the system streams below it, or a
fold of small tier objects, cut by a crash at each of their named crash points
(``cluster.timersnapshot``, ``tiered.retention``, ``tiered.fold``), from outside: broker
processes, a local-directory tier,
the crash-point test's scripted, ledgered workload (delayed messages near and far,
deliveries, Nacks with back-off, revives), durable-ack.

Broker A, armed with ``server.crash_at=<label>:1``, a snapshot every 5 records and
retention every second over 16 KB segments (folds of 4 objects, the replaced ones
deleted at once), dies in its compactor, its retention or a fold.
Then either it is restarted with its data directory (its next snapshots and passes clear
what the crash left), or it is gone with its data directory and B takes it over from
the tier (from the snapshot the pointer names, or from the whole streams when the crash
came before the pointer).  The group drained afterwards must
satisfy the ledger checker: nothing acknowledged lost, nothing redelivered after an ack,
no lease broken, nothing early.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError
from store.crashpoint import CRASH_EXIT_CODE, LABELS
from testkit.checker import check_ledgers
from testkit.ledger import Ledger, LedgeredClient, drain, now_ms
from testkit.process import ServerProcess
from tests.chronomq.test_crashpoints import (
    CRASHPOINT_SETTINGS,
    GROUP,
    REVIVE_SLACK_MS,
    TOPIC,
    _tail,
    restart_and_drain,
    scripted_workload,
)

SETTINGS = (*CRASHPOINT_SETTINGS, "tier.durable_ack=true", "tier.journal_snapshot_records=5",
            # system streams in 16 KB tier segments, deleted below the floors every second
            "tier.segment_bytes=16384", "server.retention_interval_s=1",
            # small objects folded, and the replaced ones deleted, at every pass
            "tier.fold_objects=4", "tier.fold_keep_s=0")
A = (*SETTINGS, "tier.broker_name=a", "store.node_id=1")


@pytest.mark.slow
@pytest.mark.parametrize("after", ["restart", "takeover"])
@pytest.mark.parametrize("label", sorted(la for la in LABELS if la.startswith(
    ("timer_snapshot.", "tier_retention.", "tier_fold."))))
def test_a_timer_snapshot_cut_by_a_crash_keeps_every_promise(
        tmp_path: Path, label: str, after: str) -> None:
    ledgers = tmp_path / "ledger"
    a = ServerProcess(tmp_path / "a", *A, f"server.crash_at={label}:1")
    ledger = Ledger(ledgers / "workload.jsonl")
    with ChronomqClient(a.target, timeout_s=30) as client:
        lc = LedgeredClient(client, ledger, "w", pad_bytes=1024)
        with contextlib.suppress(RpcError):  # the crash may come while it runs
            scripted_workload(lc)
            # then delayed sends due at once, until the compactor (every second, a
            # snapshot every 5 stream records) reaches the label: a slow machine too
            deadline = time.monotonic() + 60
            while a.proc.poll() is None and time.monotonic() < deadline:
                lc.send([lc.draft(TOPIC, delay_ms=50) for _ in range(3)])
                time.sleep(0.05)
    ledger.close()
    try:
        code = a.proc.wait(10)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        a.kill9()
    assert code == CRASH_EXIT_CODE, f"{label} not reached:\n" + "\n".join(_tail(a.output))

    if after == "restart":
        report, code, output = restart_and_drain(tmp_path / "a", ledgers, lc.horizon_ms, A)
        assert report.ok, "\n".join([report.summary(), *_tail(output)])
        assert code == 0
        return
    shutil.rmtree(tmp_path / "a")  # the machine is gone
    b = ServerProcess(tmp_path / "b", *SETTINGS, "tier.broker_name=b", "store.node_id=2")
    try:
        with ChronomqClient(b.target, timeout_s=120) as client:
            assert TOPIC in client.takeover("a", force=True).topics
        drain(b.target, ledgers, TOPIC, GROUP,
              max(lc.horizon_ms, now_ms()) + REVIVE_SLACK_MS, grace_s=8)
    finally:
        code = b.terminate()
    report = check_ledgers(ledgers, GROUP)
    assert report.ok, "\n".join([report.summary(), *_tail(b.output)])
    assert code == 0
