"""A record forged inside a message body is never served as a message: a client that
predicts the CommitLog offset where its body lands, and asks for the broker-assigned id
that names that offset, gets NOT_FOUND from QueryMessages and nothing from the console's
message page.  Real broker, real gRPC and HTTP over 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.client import ChronomqClient
from store.message import FLAG_DELAYED, HEADER, Message, MessageIdFormat, encode_record
from tests.conftest import RunningServer
from tests.console.conftest import Browser, console_server

PAD = 40  # bytes of the carrier's body before each forged record


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningServer]:
    s = console_server(tmp_path / "data")
    yield s
    s.stop()


def _offset(message_id: str) -> int:
    offset = MessageIdFormat(int(message_id[12:16], 16)).locate(message_id)
    assert offset is not None
    return offset


def _forged(message_id: str, flags: int = 0) -> bytes:
    """A well-formed record (valid header and CRC) naming another client's topic."""
    return encode_record(Message(message_id, "secret-topic", b"FORGED BODY", flags=flags,
                                 queue_id=0, queue_offset=0, born_at_ms=1, store_at_ms=1,
                                 deliver_at_ms=1))


def test_an_id_naming_a_record_forged_in_a_body_is_not_found(broker: RunningServer) -> None:
    with broker.client(token="console-test-token") as c:
        c.create_topic("secret-topic", 1)
        real = c.send_one("secret-topic", b"the real secret")
        c.create_topic("mine", 1)
        # Given: the attacker learns the next offset from two probes of equal size
        first, second = (_offset(c.send_one("mine", b"probe")) for _ in range(2))
        carrier_at = second + (second - first)
        body_at = carrier_at + HEADER.size + 32 + len("mine")  # id, topic; no key/tag/props
        prefix = f"{0:012X}{int(real[12:16], 16):04X}"
        at_1 = body_at + PAD
        id_1 = f"{prefix}{at_1:016X}"
        forged_1 = _forged(id_1)
        at_2 = at_1 + len(forged_1) + PAD
        id_2 = f"{prefix}{at_2:016X}"
        forged_2 = _forged(id_2, FLAG_DELAYED)  # one a timer would hold
        body = b"p" * PAD + forged_1 + b"q" * PAD + forged_2 + b"r" * PAD
        # When: it sends them inside a body to its own topic, as the prediction said
        carrier = c.send_one("mine", body)
        assert _offset(carrier) == carrier_at
        _wait_visible(broker)
        # Then: neither id names a message; the real one is still found
        assert c.query(message_id=id_1) == []
        assert c.query(message_id=id_2) == []
        assert c.query(message_id=id_1, topic="secret-topic") == []
        assert [m.body for m in c.query(message_id=real)] == [b"the real secret"]
        assert [m.body for m in c.query(message_id=carrier)] == [body]
    # and the console's message page shows nothing for them either
    browser = Browser(broker.server.console_port)
    browser.login()
    for mid in (id_1, id_2):
        status, _, text = browser.get(f"/api/messages?id={mid}")
        assert status == 200 and json.loads(text)["messages"] == []
    status, _, text = browser.get(f"/api/messages?id={real}")
    assert [m["topic"] for m in json.loads(text)["messages"]] == ["secret-topic"]


def test_legit_ids_are_still_found(broker: RunningServer) -> None:
    """Normal, delayed-pending, delivered-delayed, client-chosen, retried and
    dead-lettered messages."""
    with broker.client(token="console-test-token") as c:
        c.create_topic("t", 2)
        normal = c.send_one("t", b"now", key="k")
        pending = c.send_one("t", b"later", delay_ms=3_600_000)
        soon = c.send_one("t", b"soon", delay_ms=1)
        chosen = c.send_one("t", b"replayed", message_id="replay-1")
        assert [m.body for m in c.query(message_id=normal)] == [b"now"]
        assert [m.body for m in c.query(message_id=pending)] == [b"later"]
        assert [m.body for m in c.query(message_id=chosen)] == [b"replayed"]
        _wait_delivered(c, soon)
        assert [m.body for m in c.query(message_id=soon)] == [b"soon"]
        # a cancelled delayed message is no longer held by anyone: not found
        assert c.cancel(pending).outcome == "CANCELLED"
        assert c.query(message_id=pending) == []
        # retried: the copy in the group's retry topic, once redelivered
        c.create_topic("r", 1)
        retried = c.send_one("r", b"retry me")
        (m,) = c.pop("r", "g", wait_ms=5000)
        assert c.nack("g", [m.receipt_handle], delay_ms=1) == [""]
        _wait_popped(c, "r", retried)
        (copy,) = c.query(message_id=retried)
        assert copy.body == b"retry me" and copy.topic.startswith("%RETRY%")
        # dead-lettered: the copy in the group's dead-letter topic
        dead = c.send_one("r", b"dead")
        (m,) = c.pop("r", "g2", max_messages=1, wait_ms=5000)
        assert m.message_id == retried  # g2 starts at the oldest
        (m,) = c.pop("r", "g2", max_messages=1, wait_ms=5000)
        assert m.message_id == dead
        assert c.dead_letter("g2", [m.receipt_handle]) == [""]
        assert broker.server.broker.store.wait_visible(10)
        (copy,) = c.query(message_id=dead)
        assert copy.body == b"dead" and copy.topic.startswith("%DLQ%")


def _wait_visible(broker: RunningServer) -> None:
    store = broker.server.broker.store
    assert store.wait_visible(10)


def _wait_delivered(c: ChronomqClient, message_id: str) -> None:
    _wait_popped(c, "t", message_id)


def _wait_popped(c: ChronomqClient, topic: str, message_id: str) -> None:
    """Pop until the message arrives (the timer delivers it on its own thread)."""
    for _ in range(20):
        got = c.pop(topic, "g", wait_ms=500)
        if any(m.message_id == message_id for m in got):
            return
    raise AssertionError(f"{message_id} was not popped from {topic} within 10 s")
