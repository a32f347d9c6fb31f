"""Where QueryRoute sends a RocketMQ client: this broker, the broker that took it over,
or the broker that owns the topic.

A route lists one queue per chronomq queue of the topic, all on one broker (broker id 0,
READ_WRITE, NORMAL and DELAY messages: ``queues_pb``).  A topic of this broker routes
here.  Once this broker was taken over (``tier.failover``), every topic routes to the
broker serving its topics now, through a chain of takeovers (``successor_of``,
``moved_route``); a topic missing here that another broker owns (``tier.claim_topics``)
routes to that broker's front, when it runs one (``owner_elsewhere``).  The front
(``chronomq.rocketmq.front``) answers with the route.

Thread-safe: no state of its own; it reads the broker's lease, topics and owners.
"""

from __future__ import annotations

from typing import Any

from chronomq.broker import Broker
from chronomq.rocketmq.codec import Refused, endpoints_pb
from chronomq.rocketmq.pb import definition as rd
from cluster.lease import LeaseView, successor
from cluster.ownership import Owner
from store.errors import ChronomqError

Code = rd.Code


def queues_pb(topic: Any, queue_count: int, broker: Any) -> list[Any]:
    """The route's queues of ``topic`` (a RocketMQ Resource), all on ``broker``."""
    return [rd.MessageQueue(topic=topic, id=qid, permission=rd.READ_WRITE, broker=broker,
                            accept_message_types=[rd.NORMAL, rd.DELAY])
            for qid in range(queue_count)]


def successor_of(broker: Broker) -> LeaseView | None:
    """The broker that took ``broker`` over (``tier.failover``), through a chain of
    takeovers; None while ``broker`` holds its topics."""
    lease = broker.lease
    if lease is None or not lease.taken_by:
        return None
    return successor(broker.tier, lease.broker)


def moved_route(broker: Broker, name: str, to: LeaseView) -> tuple[int, Any]:
    """QueryRoute of topic ``name`` at a broker taken over: the queue count (as known
    here, else the default) and the broker ``to`` serving its topics now."""
    if not name:
        raise Refused(Code.ILLEGAL_TOPIC, "the request names no topic")
    if not to.rocketmq_address:
        raise Refused(Code.BAD_REQUEST, f"this broker was taken over by {to.broker}, "
                      "which runs no RocketMQ front")
    topic = broker.topic(name)
    queue_count = (topic.queue_count if topic is not None
                   else broker.config.store.default_queue_count)
    return queue_count, rd.Broker(name=to.broker, id=0,
                                  endpoints=endpoints_pb(to.rocketmq_address))


def owner_elsewhere(broker: Broker, topic: str, refused: Refused) -> Owner | None:
    """The other broker that owns a topic missing here (``tier.claim_topics``), when it
    runs a RocketMQ front: QueryRoute sends the client there."""
    owners = broker.mounts.owners
    if owners is None or refused.code != Code.TOPIC_NOT_FOUND:
        return None
    try:
        owner = owners.owner(topic)
    except ChronomqError:  # a bad name, or the tier cannot tell: the refusal stands
        return None
    if owner is None or owner.broker == owners.me.broker or not owner.rocketmq_address:
        return None
    return owner
