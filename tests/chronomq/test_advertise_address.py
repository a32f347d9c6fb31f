"""With ``tier.claim_topics`` a broker records, in the shared tier, the address other
brokers' clients are sent to.  A wildcard ``server.host`` (0.0.0.0) is no address anyone
can dial, and a loopback one reaches only this machine: the broker warns at start and
names the fix, ``server.advertise_address``, which is then what the owner records hold."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from chronomq.config import BrokerConfig, TierConfig, load_config
from chronomq.listeners import unreachable
from store.errors import InvalidArgument
from tests.conftest import RunningServer, broker_config


def _config(tmp_path: Path, name: str, host: str, advertise: str = "") -> BrokerConfig:
    config = broker_config(tmp_path / name, host=host, advertise_address=advertise)
    return dataclasses.replace(config, tier=TierConfig(
        provider="local", local_dir=str(tmp_path / "tier"), broker_name=name,
        claim_topics=True))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.name == "chronomq.server"]


def test_a_wildcard_host_warns_with_the_fix(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    # Given a broker with claim_topics bound to every interface and nothing advertised
    caplog.set_level(logging.WARNING)
    s = RunningServer(_config(tmp_path, "broker-a", "0.0.0.0"))
    try:
        # Then its start warns: the recorded address cannot be dialled, and how to fix it
        [line] = _warnings(caplog)
        assert f"0.0.0.0:{s.port}" in line and "server.host 0.0.0.0" in line, line
        assert 'server.advertise_address = "HOST:PORT"' in line, line
    finally:
        s.stop()


def test_the_advertised_address_is_recorded_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    s = RunningServer(_config(tmp_path, "broker-a", "0.0.0.0", "10.1.2.3:7600"))
    try:
        with s.client() as c:
            assert c.create_topic("orders")
        assert s.server.broker.mounts.owners is not None
        assert s.server.broker.mounts.owners.owner("orders").address == "10.1.2.3:7600"
        assert _warnings(caplog) == []
    finally:
        s.stop()


def test_loopback_warns_only_when_another_broker_records_topics(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # Given broker-a alone on loopback: nobody else to reach it, no warning
    a = RunningServer(_config(tmp_path, "broker-a", "127.0.0.1"))
    b = None
    try:
        assert _warnings(caplog) == []
        with a.client() as c:
            assert c.create_topic("orders")
        # When broker-b starts on loopback beside it in the same tier
        b = RunningServer(_config(tmp_path, "broker-b", "127.0.0.1"))
        # Then b warns that its recorded address reaches only this machine
        [line] = _warnings(caplog)
        assert f"127.0.0.1:{b.port}" in line and "broker broker-a" in line, line
        assert "server.advertise_address" in line, line
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_the_advertised_address_must_be_host_port() -> None:
    with pytest.raises(InvalidArgument, match=r"server\.advertise_address must be host:port"):
        load_config(None, ["server.advertise_address=10.1.2.3"])


@pytest.mark.parametrize(("address", "why"), [
    ("0.0.0.0:7600", "any"), ("[::]:7600", "any"), (":7600", "any"),
    ("127.0.0.1:7600", "loopback"), ("127.8.0.1:7600", "loopback"),
    ("[::1]:7600", "loopback"), ("localhost:7600", "loopback"),
    ("10.0.0.5:7600", ""), ("broker-a.internal:7600", ""),
])
def test_unreachable(address: str, why: str) -> None:
    assert unreachable(address) == why
