"""Which broker owns a topic, recorded in the shared tier itself.

Several brokers may share one tier (one S3 bucket, each broker under its own
``<broker_name>/`` prefix).  A topic lives on one broker: its owner.  The owner is one
small object per topic, ``owners/<topic>.json`` at the top of the tier (beside the
brokers' prefixes), holding the owner's broker name and the addresses clients reach it
at.  It is created with a conditional put (``Provider.create``: S3's ``If-None-Match:
*``, ``link(2)`` on a local directory), so when two brokers claim the same topic at
once exactly one wins; the other learns the winner by reading the object.  S3 is the
coordination point: no election, no leases, no home-made consensus.

* ``claim(topic)``: own it (True), or it was already ours (True, addresses refreshed),
  or it belongs to another broker (False; ``owner`` says which).
* ``owner(topic)`` / ``owner_of(provider, topic)``: the recorded owner, or None (what a
  client that reads the bucket uses to find a topic's broker).
* ``release(topic)``: the owner deletes the object when its topic is deleted.
* ``take_over(topic, departed)``: a broker that mounts a departed broker's tier
  (``tiered.mount``) records itself as the owner of the departed broker's topics, so
  clients that look owners up are sent to it.  Until then ``owner`` names a broker that
  may not answer, which clients report as such.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cluster.layout import OWNERS, owner_path
from store.names import check_name
from tiered.errors import TierError, TierNotFound
from tiered.provider import Provider


@dataclass(frozen=True, slots=True)
class Owner:
    broker: str  # tier.broker_name
    address: str  # host:port of its chronomq API
    rocketmq_address: str = ""  # host:port of its RocketMQ front ("" when off)
    claimed_at_ms: int = 0


def _path(topic: str) -> str:
    check_name(topic)
    return owner_path(topic)


def owner_of(provider: Provider, topic: str) -> Owner | None:
    """The recorded owner of ``topic`` in the tier on ``provider`` (None: unclaimed)."""
    try:
        raw = provider.read(_path(topic))
    except TierNotFound:
        return None
    try:
        fields = json.loads(raw)
        return Owner(str(fields["broker"]), str(fields["address"]),
                     str(fields.get("rocketmq_address", "")),
                     int(fields.get("claimed_at_ms", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise TierError(f"the owner object of topic {topic!r} is damaged: {exc}") from exc


class TopicOwners:
    """Claims and looks up topic owners on ``provider`` for the broker ``me``."""

    def __init__(self, provider: Provider, me: Owner) -> None:
        self._provider = provider
        self.me = me

    def owner(self, topic: str) -> Owner | None:
        return owner_of(self._provider, topic)

    def claim(self, topic: str, now_ms: int = 0) -> bool:
        """Own ``topic``: True when this broker owns it (now or already)."""
        mine = Owner(self.me.broker, self.me.address, self.me.rocketmq_address, now_ms)
        data = json.dumps(asdict(mine), sort_keys=True).encode()
        if self._provider.create(_path(topic), data):
            return True
        current = self.owner(topic)
        if current is None:  # released between our create and our read: try once more
            return self._provider.create(_path(topic), data)
        if current.broker != self.me.broker:
            return False
        if (current.address, current.rocketmq_address) != (mine.address,
                                                           mine.rocketmq_address):
            # ours, from an earlier run at another address: point clients at this one
            self._provider.write(_path(topic), json.dumps(asdict(
                Owner(mine.broker, mine.address, mine.rocketmq_address,
                      current.claimed_at_ms)), sort_keys=True).encode())
        return True

    def take_over(self, topic: str, departed: str, now_ms: int = 0) -> bool:
        """Own ``topic`` in place of broker ``departed`` (whose tier this broker mounted):
        True when it is this broker's now; a topic someone else owns is left alone."""
        current = self.owner(topic)
        if current is None:
            return self.claim(topic, now_ms)
        if current.broker == self.me.broker:
            return self.claim(topic, now_ms)
        if current.broker != departed:
            return False
        self._provider.write(_path(topic), json.dumps(asdict(Owner(
            self.me.broker, self.me.address, self.me.rocketmq_address, now_ms)),
            sort_keys=True).encode())
        return True

    def release(self, topic: str) -> None:
        """Drop this broker's claim (its topic was deleted); another broker's is kept."""
        current = self.owner(topic)
        if current is not None and current.broker == self.me.broker:
            self._provider.delete(_path(topic))

    def topics(self) -> dict[str, Owner]:
        """Every recorded owner, by topic."""
        out: dict[str, Owner] = {}
        for path in self._provider.list(OWNERS):
            name = path[len(OWNERS):]
            if name.endswith(".json"):
                owner = self.owner(name[:-len(".json")])
                if owner is not None:
                    out[name[:-len(".json")]] = owner
        return out
