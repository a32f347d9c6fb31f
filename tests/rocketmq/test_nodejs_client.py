"""The official RocketMQ 5 Node.js client (rocketmq-client-nodejs from npm) against the
RocketMQ front, when Node.js is installed: ``tests/rocketmq/nodejs/scenario.js`` runs in
lockstep with this test, which owns the broker's manual clock."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from store.topics import Topic
from tests.rocketmq.conftest import RocketMQEnv

HERE = Path(__file__).parent / "nodejs"


@pytest.fixture(scope="session")
def node_client() -> Path:
    """``npm ci`` once per session (the lock file pins the client and its dependencies)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed: the Node.js client check needs node and npm")
    installed = HERE / "node_modules" / "rocketmq-client-nodejs" / "package.json"
    lock = HERE / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=HERE, check=True, timeout=300)
    return HERE / "scenario.js"


def _run(env: RocketMQEnv, script: Path) -> dict[str, Any]:
    with subprocess.Popen(["node", str(script), env.endpoint, "--clock-on-stdin"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=script.parent) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stderr is not None
        try:
            for line in proc.stdout:
                step = json.loads(line)
                if "advance_ms" in step:
                    env.tick(step["advance_ms"])
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                elif "result" in step:
                    assert proc.wait(timeout=30) == 0, proc.stderr.read()
                    return step["result"]  # type: ignore[no-any-return]
            raise AssertionError(f"the Node.js scenario ended without a result (exit "
                                 f"{proc.wait(timeout=30)}): {proc.stderr.read()}")
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.slow
def test_nodejs_producer_simple_and_push_consumer(rmq: RocketMQEnv, node_client: Path) -> None:
    r = _run(rmq, node_client)
    (first,) = r["first"]
    assert (first["id"], first["body"], first["tag"], first["keys"], first["attempt"]) == (
        r["sent"], "hello from node", "paid", ["order-7"], 1)
    assert not first["corrupted"] and r["handleChanged"]
    assert [(m["id"], m["attempt"]) for m in r["leased"]] == [(r["unacked"], 1)]
    assert [(m["id"], m["attempt"]) for m in r["again"]] == [(r["unacked"], 2)]
    assert r["recallReturned"] == r["recalled"]
    assert r["early"] == []  # nothing delivered before its time
    (due,) = r["due"]  # the recalled one never arrives
    assert (due["id"], due["body"]) == (r["delayed"], "one minute later")
    assert 0 < due["deliveryTimestamp"] <= rmq.clock.now_ms()
    assert r["afterwards"] == []
    # the PushConsumer group sees the whole topic; the ten sent for it arrive once each
    pushed = [m["id"] for m in r["pushed"] if m["id"] in r["pushSent"]]
    assert sorted(pushed) == sorted(r["pushSent"])
    assert all(m["attempt"] == 1 for m in r["pushed"])


@pytest.mark.parametrize("topics", [1, 9])
def test_nodejs_producer_with_many_topics_starts(tmp_path: Path, node_client: Path,
                                                 topics: int) -> None:
    """The Node.js Producer fetches each topic's route before it listens for its settings
    answer; with 9 topics it used to wait for the next settings exchange (5 minutes)."""
    env = RocketMQEnv(tmp_path)
    try:
        for i in range(topics):
            env.broker.create_topic(Topic(f"t{i}", 4))
        done = subprocess.run(["node", str(node_client.parent / "startup_topics.js"),
                               env.endpoint, str(topics)], capture_output=True, text=True,
                              timeout=60, cwd=node_client.parent)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert done.returncode == 0 and result["started"] is True, (result, done.stderr)
        assert result["sent"]
    finally:
        env.running.stop()
