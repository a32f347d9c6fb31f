"""A takeover killed inside its timer step (``cluster.adoption``) at a real crash point,
then run again: broker processes, a local-directory tier, a ledger of every OK answer.

Broker A (durable-ack) holds delayed messages near (RocksDB) and far (its TimerFlatFiles),
three of these rescheduled into a later bucket, so that B has to write those into a
TimerFlatFile object of its own; A is killed with kill -9, its data directory deleted.
B, armed with ``server.crash_at=<label>:1``, dies in the middle of the step: after its
first TimerFlatFile object (``timer.after_flat_write``), or after its first batch is in
RocksDB (``timer.after_add``).  Restarted, it finishes the takeover, and the group
drained from it must satisfy the ledger checker: nothing acknowledged lost, nothing
delivered twice after an ack, nothing early.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError
from store.crashpoint import CRASH_EXIT_CODE
from testkit.checker import check_ledgers
from testkit.ledger import Ledger, LedgeredClient, drain, now_ms
from testkit.process import ServerProcess
from testkit.wait import wait_until
from tests.chronomq.test_crashpoints import GROUP, REVIVE_SLACK_MS, TOPIC, _tail

SETTINGS = (
    "tier.upload=true", "tier.durable_ack=true", "tier.upload_batch_ms=100",
    "timer.rocks_horizon_ms=4000", "timer.bucket_ms=2000", "timer.preload_ahead_ms=2000",
    "timer.preload_interval_ms=200", "timer.flat_batch_ms=100", "timer.wheel_window_ms=1000",
    "timer.load_interval_ms=100", "store.queue_flush_interval_ms=100",
)
FAR_S = 25  # far messages are due this long after they are sent


def _departed(root: Path) -> int:
    """Broker A's tier and ledger; returns when its last message is due."""
    a = ServerProcess(root / "a", *SETTINGS, "tier.broker_name=a", "store.node_id=1")
    ledger = Ledger(root / "ledger" / "workload.jsonl")
    try:
        with ChronomqClient(a.target, timeout_s=30) as client:
            lc = LedgeredClient(client, ledger, "w", pad_bytes=256)
            client.create_topic(TOPIC, queue_count=2)
            lc.send([lc.draft(TOPIC, delay_ms=12_000 + 100 * i) for i in range(40)])
            far = lc.send([lc.draft(TOPIC, delay_ms=FAR_S * 1000 + 50 * i) for i in range(60)])
            wait_until(lambda: client.stats()["timer.parked_unwritten"] == 0, 10,
                       "A's far messages in its TimerFlatFiles")
            for outcome in far[:3]:  # later, into another bucket: only in A's RocksDB now
                moved = client.reschedule(outcome.message_id, delay_ms=(FAR_S + 6) * 1000)
                assert moved.outcome == "RESCHEDULED"
            assert client.stats()["timer.flat_objects"] >= 1
        horizon_ms = lc.horizon_ms + 6_000
    finally:
        ledger.close()
        a.kill9()
    shutil.rmtree(root / "a")  # the machine is gone
    return horizon_ms


@pytest.mark.slow
@pytest.mark.parametrize("label", ["timer.after_flat_write", "timer.after_add"])
def test_a_takeover_killed_in_its_timer_step_keeps_every_promise(
        tmp_path: Path, label: str) -> None:
    horizon_ms = _departed(tmp_path)
    b_settings = (*SETTINGS, "tier.broker_name=b", "store.node_id=2")
    b = ServerProcess(tmp_path / "b", *b_settings, f"server.crash_at={label}:1")
    try:
        with ChronomqClient(b.target, timeout_s=60) as client, pytest.raises(RpcError):
            client.takeover("a", force=True)
        code = b.proc.wait(10)
    finally:
        b.kill9()  # gone already (closes its pipe), or never to be left running
    assert code == CRASH_EXIT_CODE, f"{label} not reached:\n" + "\n".join(_tail(b.output))
    assert now_ms() < horizon_ms - (FAR_S - 12) * 1000, "too slow: the far ones came near"

    b = ServerProcess(tmp_path / "b", *b_settings)
    try:
        with ChronomqClient(b.target, timeout_s=60) as client:
            result = client.takeover("a", force=True)
            assert result.pending == 100
        drain(b.target, tmp_path / "ledger", TOPIC, GROUP,
              max(horizon_ms, now_ms()) + REVIVE_SLACK_MS, grace_s=8)
    finally:
        code = b.terminate()
    report = check_ledgers(tmp_path / "ledger", GROUP)
    assert report.ok, "\n".join([report.summary(), *_tail(b.output)])
    assert code == 0
