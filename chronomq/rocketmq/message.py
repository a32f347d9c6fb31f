"""A RocketMQ 5 message on its way in and out of chronomq.

``draft_of`` turns a message of SendMessage into a chronomq ``Draft``, with every check a
send makes and the RocketMQ status code of the first that fails (``Refused``): message
type (FIFO, transactional, lite and priority are not supported), GZIP bodies inflated
with a bound, body size, the client's message id, delivery time, tag, keys (several keys
kept in one property), properties and born timestamp, then the broker's own checks.
``message_pb`` turns a popped message back into the RocketMQ message ReceiveMessage
answers with (MD5 digest, DELAY type for a first timer delivery, the lease's handle and
invisible duration).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc

from chronomq.broker import Broker
from chronomq.rocketmq.codec import (
    PROP_KEYS,
    UNSUPPORTED_TYPES,
    Refused,
    code_of,
    duration_pb,
    inflate,
    timestamp_ms,
    timestamp_pb,
)
from chronomq.rocketmq.pb import definition as rd
from pop.service import (
    PoppedMessage,
)
from store.errors import (
    ChronomqError,
    InvalidArgument,
)
from store.message import (
    FLAG_TIMER_DELIVERY,
    MAX_KEY_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TAG_BYTES,
    MAX_TIME_MS,
    Draft,
    Message,
    encode_properties,
    validate_message_id,
)
from store.topics import Topic

Context: TypeAlias = grpc.ServicerContext
Code = rd.Code


def draft_of(m: Any, now: int, broker: Broker, topic_of: Callable[[str], Topic]) -> Draft:
    """The Draft a RocketMQ message becomes, after every check a send makes; ``Refused``
    with the RocketMQ code of the first that fails.  ``topic_of`` looks the topic up (or
    creates it) once the message type is known to be supported."""
    sp = m.system_properties
    if sp.message_type in UNSUPPORTED_TYPES or sp.message_group:
        kind = UNSUPPORTED_TYPES.get(sp.message_type, "FIFO")
        raise Refused(Code.UNSUPPORTED if kind != "FIFO"
                       else Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED,
                       f"{kind} messages are not supported by chronomq; send NORMAL or "
                       "DELAY messages")
    topic = topic_of(m.topic.name)
    limit = broker.config.store.max_body_bytes
    body = bytes(m.body)
    if sp.body_encoding == rd.GZIP:
        body = inflate(body, limit)
    if not body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > limit:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE,
                       f"the body is {len(body)} bytes, over the maximum of {limit} "
                       "(store.max_body_bytes)")
    try:
        validate_message_id(sp.message_id)
    except InvalidArgument as exc:
        raise Refused(Code.ILLEGAL_MESSAGE_ID, str(exc)) from exc
    due, flags = now, 0
    if sp.HasField("delivery_timestamp"):
        try:
            due, flags = broker.sender.resolve_deliver_at(
                timestamp_ms(sp.delivery_timestamp), 0, now)
        except ChronomqError as exc:
            raise Refused(Code.ILLEGAL_DELIVERY_TIME, str(exc)) from exc
    elif sp.message_type == rd.DELAY:
        raise Refused(Code.ILLEGAL_DELIVERY_TIME,
                       "a DELAY message needs system_properties.delivery_timestamp")
    if len(sp.tag.encode()) > MAX_TAG_BYTES or "|" in sp.tag:
        raise Refused(Code.ILLEGAL_MESSAGE_TAG,
                       f"a tag has at most {MAX_TAG_BYTES} bytes and no '|'")
    keys = list(sp.keys)
    if any(not k or k.split() != [k] for k in keys):
        raise Refused(Code.ILLEGAL_MESSAGE_KEY, "a key is empty or contains whitespace")
    if len(" ".join(keys).encode()) > MAX_KEY_BYTES:
        raise Refused(Code.ILLEGAL_MESSAGE_KEY,
                       f"the keys are longer than {MAX_KEY_BYTES} bytes together")
    props = dict(m.user_properties)
    if len(keys) > 1:
        props[PROP_KEYS] = " ".join(keys)
    try:
        encoded = encode_properties(props, MAX_PROPERTIES_BYTES)
    except InvalidArgument as exc:
        raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, str(exc)) from exc
    born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now
    if not 0 <= born < MAX_TIME_MS:
        raise Refused(Code.BAD_REQUEST, f"born_timestamp is out of range ({born} ms)")
    draft = Draft(sp.message_id, topic.name, keys[0] if keys else "", sp.tag, body,
                  encoded, born or now, due, flags)
    try:
        broker.sender.check(draft)
    except ChronomqError as exc:
        raise Refused(code_of(exc), str(exc)) from exc
    return draft


def message_pb(p: PoppedMessage, queue: Any, invisible_s: int) -> Any:
    m: Message = p.message
    props = dict(m.properties)
    keys = props.pop(PROP_KEYS, "").split() or ([m.key] if m.key else [])
    delayed = bool(m.flags & FLAG_TIMER_DELIVERY) and m.delivery_attempt == 0
    sp = rd.SystemProperties(
        keys=keys, message_id=m.message_id,
        body_digest=rd.Digest(type=rd.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
        body_encoding=rd.IDENTITY, message_type=rd.DELAY if delayed else rd.NORMAL,
        born_timestamp=timestamp_pb(m.born_at_ms), store_timestamp=timestamp_pb(m.store_at_ms),
        receipt_handle=p.receipt_handle, queue_id=m.queue_id, queue_offset=m.queue_offset,
        invisible_duration=duration_pb(invisible_s * 1000),
        delivery_attempt=p.delivery_attempt)
    if m.tag:
        sp.tag = m.tag
    if delayed:
        sp.delivery_timestamp.CopyFrom(timestamp_pb(m.deliver_at_ms))
    return rd.Message(topic=rd.Resource(resource_namespace=queue.topic.resource_namespace,
                                        name=m.topic),
                      user_properties=props, system_properties=sp, body=m.body)
