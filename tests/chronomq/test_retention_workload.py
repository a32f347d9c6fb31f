"""Local retention deleting every CommitLog segment the dispatchers and the tier have
passed, every second, while the crash-point workload runs: Pop, revive and the timer then
read through the tier, and the ledger checker must find no violation of the contract,
with and without a kill -9 and a restart in the middle."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronomq.client import ChronomqClient
from testkit.ledger import Ledger, LedgeredClient
from testkit.process import ServerProcess
from tests.chronomq.test_crashpoints import (
    CRASHPOINT_SETTINGS,
    restart_and_drain,
    scripted_workload,
)

RETAIN_NOTHING = (*CRASHPOINT_SETTINGS, "store.retention_bytes=1",
                  "server.retention_interval_s=1")


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["sigterm", "kill9"])
def test_retention_of_everything_passed_keeps_the_contract(tmp_path: Path,
                                                           restart: str) -> None:
    data, ledgers = tmp_path / "data", tmp_path / "ledger"
    srv = ServerProcess(data, *RETAIN_NOTHING)
    ledger = Ledger(ledgers / "workload.jsonl")
    with ChronomqClient(srv.target, timeout_s=10) as client:
        lc = LedgeredClient(client, ledger, "w", pad_bytes=1024)
        scripted_workload(lc)
    ledger.close()
    first = srv.output
    if restart == "kill9":
        srv.kill9()
    else:
        assert srv.terminate() == 0
    report, code, output = restart_and_drain(data, ledgers, lc.horizon_ms, RETAIN_NOTHING)
    evidence = "\n".join([report.summary(), f"ledger: {ledgers}", *first[-25:],
                          "after the restart:", *output[-25:]])
    assert report.ok, evidence
    assert code == 0, evidence
