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
* ``release_departed(departed, kept)``: a broker taking ``departed`` over deletes the
  records naming it for topics it does not take (``kept``): claimed by ``departed`` for a
  CreateTopic it never finished (not in its catalogue, ``cluster.catalogue``), or kept
  by a DeleteTopic cut short.  Otherwise the name could never be used again.

Every change of a record another broker may change too is conditional on the version
read (``Provider.swap``, ``Provider.delete_if``): a release or a take-over never removes
or overwrites a claim made meanwhile by someone else; it reads again and decides again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cluster.layout import OWNERS, owner_path
from store.names import check_name
from tiered.errors import TierError, TierNotFound, TierOutcomeUnknown
from tiered.provider import Provider

_ATTEMPTS = 4  # reads and conditional changes of one record, when it changes meanwhile


@dataclass(frozen=True, slots=True)
class Owner:
    broker: str  # tier.broker_name
    address: str  # host:port of its chronomq API
    rocketmq_address: str = ""  # host:port of its RocketMQ front ("" when off)
    claimed_at_ms: int = 0


def _path(topic: str) -> str:
    check_name(topic)
    return owner_path(topic)


def _decode(topic: str, raw: bytes) -> Owner:
    try:
        fields = json.loads(raw)
        return Owner(str(fields["broker"]), str(fields["address"]),
                     str(fields.get("rocketmq_address", "")),
                     int(fields.get("claimed_at_ms", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise TierError(f"the owner object of topic {topic!r} is damaged: {exc}") from exc


def _encode(owner: Owner) -> bytes:
    return json.dumps(asdict(owner), sort_keys=True).encode()


def owner_of(provider: Provider, topic: str) -> Owner | None:
    """The recorded owner of ``topic`` in the tier on ``provider`` (None: unclaimed)."""
    try:
        raw = provider.read(_path(topic))
    except TierNotFound:
        return None
    return _decode(topic, raw)


def versioned_owner(provider: Provider, topic: str) -> tuple[Owner, str] | None:
    """The recorded owner of ``topic`` and its record's version (None: unclaimed)."""
    try:
        raw, version = provider.read_versioned(_path(topic))
    except TierNotFound:
        return None
    return _decode(topic, raw), version


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
        for _ in range(_ATTEMPTS):
            if self._provider.create(_path(topic), _encode(mine)):
                return True
            current = versioned_owner(self._provider, topic)
            if current is None:  # released between our create and our read: again
                continue
            owner, version = current
            if owner.broker != self.me.broker:
                return False
            if (owner.address, owner.rocketmq_address) == (mine.address,
                                                           mine.rocketmq_address):
                return True
            # ours, from an earlier run at another address: point clients at this one
            if self._swap(topic, Owner(mine.broker, mine.address, mine.rocketmq_address,
                                       owner.claimed_at_ms), version):
                return True
        raise TierError(f"the owner record of topic {topic!r} kept changing: "
                        f"{_ATTEMPTS} attempts to claim it")

    def take_over(self, topic: str, departed: str, now_ms: int = 0) -> bool:
        """Own ``topic`` in place of broker ``departed`` (whose tier this broker mounted):
        True when it is this broker's now; a topic someone else owns is left alone."""
        for _ in range(_ATTEMPTS):
            current = versioned_owner(self._provider, topic)
            if current is None or current[0].broker == self.me.broker:
                return self.claim(topic, now_ms)
            owner, version = current
            if owner.broker != departed:
                return False
            if self._swap(topic, Owner(self.me.broker, self.me.address,
                                       self.me.rocketmq_address, now_ms), version):
                return True
        raise TierError(f"the owner record of topic {topic!r} kept changing: "
                        f"{_ATTEMPTS} attempts to take it over from {departed}")

    def release(self, topic: str) -> None:
        """Drop this broker's claim (its topic was deleted); another broker's is kept,
        even one made between our read and our delete."""
        self._release(topic, self.me.broker)

    def release_departed(self, departed: str, kept: set[str]) -> list[str]:
        """Delete the records naming broker ``departed`` for topics not in ``kept`` (a
        broker taking it over takes ``kept``): the topics it never finished creating,
        or whose deletion was cut short.  Returns the topics released."""
        released = []
        for topic, owner in self.topics().items():
            if owner.broker == departed and topic not in kept and \
                    self._release(topic, departed):
                released.append(topic)
        return released

    def _release(self, topic: str, broker: str) -> bool:
        """Delete ``topic``'s record while it names ``broker``, at the version read."""
        for _ in range(_ATTEMPTS):
            current = versioned_owner(self._provider, topic)
            if current is None or current[0].broker != broker:
                return False
            try:
                if self._provider.delete_if(_path(topic), current[1]):
                    return True
            except TierOutcomeUnknown:
                continue  # read it back: gone (ours), or changed (kept)
        raise TierError(f"the owner record of topic {topic!r} kept changing: "
                        f"{_ATTEMPTS} attempts to release it")

    def _swap(self, topic: str, owner: Owner, version: str) -> bool:
        """Replace the record at ``version`` with ``owner``; False: it changed."""
        try:
            return self._provider.swap(_path(topic), _encode(owner), version) is not None
        except TierOutcomeUnknown:
            current = versioned_owner(self._provider, topic)
            return current is not None and current[0] == owner

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
