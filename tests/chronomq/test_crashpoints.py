"""Crash the broker at every named crash point in turn, then check what it kept.

For each label of ``store.crashpoint.LABELS`` (the takeover's: test_takeover_crashpoints.py;
the timer snapshot's and tier retention's: test_timer_snapshot_crashpoints.py; the
debounce's: test_debounce.py; the schedules': test_schedules.py; CreateTopic's and
DeleteTopic's: test_topic_changes.py),
at its first hit and at its third, a broker
process armed with ``server.crash_at=<label>:<N>`` runs one scripted, ledgered workload
that reaches every label: immediate sends (unary and streamed, keyed, enough bytes to
roll 32 KiB CommitLog segments), near and far delayed sends (RocksDB and the wheel;
TimerFlatFiles in four buckets, then preload), pops, acks, ChangeInvisibleTime, Nack,
leases left to run out (revive), timer deliveries, tier uploads in the background, and
780 single-message sends (the CommitLog checkpoint is written every 256 batches); the
ConsumeQueue checkpoint every 100 ms, so a 2 s workload reaches it many times over.
The broker must leave with ``CRASH_EXIT_CODE`` (the label was reached, while starting,
working or stopping); then a restart without the crash point, a drain of the group, and
the ledger checker must find no violation; SIGTERM must exit 0.

The workload stops at the first failed call (the broker is gone), so an early label
costs little: a run takes 2-9 s.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient, RpcError
from store.crashpoint import CRASH_EXIT_CODE, LABELS
from testkit.checker import Report, check_ledgers
from testkit.ledger import (
    Ledger,
    LedgeredClient,
    drain,
    now_ms,
)
from testkit.process import ServerProcess
from testkit.wait import wait_until

TOPIC, GROUP = "cp", "g"
BUCKET_MS = 300  # timer.bucket_ms
CRASHPOINT_SETTINGS = (
    "tier.upload=true", "tier.upload_batch_ms=100", "store.segment_bytes=32768",
    "timer.rocks_horizon_ms=600", f"timer.bucket_ms={BUCKET_MS}", "timer.preload_ahead_ms=300",
    "timer.wheel_window_ms=300", "timer.preload_interval_ms=50", "timer.flat_batch_ms=50",
    "timer.load_interval_ms=50", "store.queue_flush_interval_ms=100",
    "tier.journal_snapshot_records=20",  # snapshots of the groups' state in the journal, often
)
REVIVE_SLACK_MS = 1000
SINGLE_SENDS = 780  # with the workload's other batches, past 3 x 256 CommitLog batches


def scripted_workload(lc: LedgeredClient) -> None:
    """Every step at least three times, in separate calls; raises ``RpcError`` when the
    broker is gone."""
    lc.client.create_topic(TOPIC, queue_count=2)
    # immediate, keyed: CommitLog, ConsumeQueue, key index, segment rolls, tier uploads
    for i in range(3):
        lc.send([lc.draft(TOPIC, key=f"k{i}-{j % 5}") for j in range(24)])
    for _ in lc.send_stream([lc.draft(TOPIC, key=f"s{i}-{j % 5}") for j in range(24)]
                            for i in range(3)):
        pass
    # delayed: near ones through RocksDB and the wheel; far ones (beyond the 600 ms
    # rocks horizon) parked, each round in a 300 ms bucket of its own, taken for its
    # TimerFlatFile (once flat_batch_ms old) before the next round comes, preloaded
    # 300 ms before the bucket starts, then deleted
    first_ms = now_ms() + 900
    first_ms += BUCKET_MS - first_ms % BUCKET_MS  # the start of a bucket
    for i in range(4):
        far_ms = first_ms + BUCKET_MS * i + 100  # both inside the round's bucket
        lc.send([*(lc.draft(TOPIC, delay_ms=200 + 100 * j) for j in range(3)),
                 *(lc.draft(TOPIC, deliver_at_ms=far_ms + 20 * j) for j in range(2))])
        wait_until(lambda: lc.client.stats()["timer.parked_unwritten"] == 0, 10,
                   f"round {i}'s parked messages to be taken for their TimerFlatFile",
                   show=lambda: lc.client.stats()["timer.parked_unwritten"], poll_s=0.02)
    for _ in range(3):
        lc.ack(GROUP, lc.pop(TOPIC, GROUP, 8, invisible_time_s=1))
    got = lc.pop(TOPIC, GROUP, 9, invisible_time_s=1)
    for item in got[:3]:  # a longer lease, then acked under the new handle
        lc.ack(GROUP, [lc.change_invisible_time(GROUP, item, 2)])
    for n, item in enumerate(got[3:6]):  # released: now, or later through the timer
        lc.nack(GROUP, [item], delay_ms=200 * n)
    # got[6:] are never acked: revived when their 1 s lease runs out.  While the timer
    # delivers and leases revive, single-message sends (one CommitLog batch each: the
    # CommitLog checkpoint is written every 256 batches), popped and acked now and then
    until_ms, singles = lc.horizon_ms + 300, 0
    while now_ms() < until_ms or singles < SINGLE_SENDS:
        if singles < SINGLE_SENDS:
            lc.send([lc.draft(TOPIC)])
            singles += 1
        if singles % 50 == 0 or singles == SINGLE_SENDS:
            lc.ack(GROUP, lc.pop(TOPIC, GROUP, 16, invisible_time_s=1, wait_ms=50))


@dataclass(frozen=True, slots=True)
class CrashRun:
    exit_code: int | None  # None: still running after the workload and a SIGTERM grace
    where: str  # "starting", "working" or "stopping"
    output: list[str]
    horizon_ms: int


def crash_run(data: Path, ledgers: Path, label: str, nth: int) -> CrashRun:
    """Run the workload on a broker armed to crash at the ``nth`` hit of ``label``."""
    armed = (*CRASHPOINT_SETTINGS, f"server.crash_at={label}:{nth}")
    try:
        srv = ServerProcess(data, *armed)
    except RuntimeError as exc:  # it left before listening: recovery reached the label
        crashed = f"crash point {label} reached" in str(exc)
        return CrashRun(CRASH_EXIT_CODE if crashed else None, "starting", [str(exc)], 0)
    ledger = Ledger(ledgers / "workload.jsonl")
    failure: RpcError | None = None
    with ChronomqClient(srv.target, timeout_s=10) as client:
        lc = LedgeredClient(client, ledger, "w", pad_bytes=1024)
        try:
            scripted_workload(lc)
        except RpcError as exc:
            failure = exc
    ledger.close()
    try:  # a crash in a background thread may come a moment after the last call
        code: int | None = srv.proc.wait(5 if failure else 1)
        where = "working"
        srv.kill9()  # already gone: this only closes its pipe
    except subprocess.TimeoutExpired:
        if failure is not None:
            srv.kill9()
            raise AssertionError(f"the workload failed, the broker did not crash: {failure}"
                                 "\n" + "".join(srv.output)) from failure
        code, where = srv.terminate(), "stopping"
    return CrashRun(code, where, srv.output, lc.horizon_ms)


@pytest.mark.slow
@pytest.mark.parametrize("nth", [1, 3])
@pytest.mark.parametrize("label", sorted(la for la in LABELS  # (their own tests)
                                         if not la.startswith(("takeover.", "timer_snapshot.",
                                                               "tier_retention.",
                                                               "tier_fold.",
                                                               "debounce.",
                                                               "schedule.", "topic.",
                                                               "tier.after_commit_record"))))
def test_crash_point_keeps_the_durability_contract(tmp_path: Path, label: str,
                                                   nth: int) -> None:
    data, ledgers = tmp_path / "data", tmp_path / "ledger"
    # When: the broker crashes at the nth hit of the label
    run = crash_run(data, ledgers, label, nth)
    assert run.exit_code == CRASH_EXIT_CODE, (
        f"crash point {label} ({LABELS[label]}) was not reached {nth} time(s): the broker "
        + ("ran the whole workload and stopped with exit code 0" if run.exit_code == 0 else
           f"exited with code {run.exit_code} while {run.where}")
        + "\n" + "\n".join(_tail(run.output)))
    # Then: restarted without it, the group drains with no violation of the contract
    report, code, output = restart_and_drain(data, ledgers, run.horizon_ms,
                                             CRASHPOINT_SETTINGS)
    evidence = "\n".join([report.summary(), f"ledger: {ledgers}", f"crashed {run.where}:",
                          *_tail(run.output), "after the restart:", *_tail(output)])
    assert report.ok, evidence
    assert code == 0, evidence


def restart_and_drain(data: Path, ledgers: Path, horizon_ms: int, settings: tuple[str, ...]
                      ) -> tuple[Report, int, list[str]]:
    """Start a broker on ``data``, drain the group until every due message and lease has
    had its time, stop it; the ledger checker's report, the exit code and the output."""
    srv = ServerProcess(data, *settings)
    try:
        drain(srv.target, ledgers, TOPIC, GROUP, max(horizon_ms, now_ms()) +
              REVIVE_SLACK_MS, grace_s=8)
    except RpcError as exc:  # (once in CI: refused, the restarted broker gone): its output
        code = srv.terminate()
        raise AssertionError(f"the drain failed ({exc}); the restarted broker exited with "
                             f"{code}:\n" + "\n".join(_tail(srv.output, 60))) from exc
    code = srv.terminate()
    return check_ledgers(ledgers, GROUP), code, srv.output


def _tail(output: list[str], lines: int = 25) -> list[str]:
    return [line.rstrip() for line in output[-lines:]]
