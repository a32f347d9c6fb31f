from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IfDelivered(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IF_DELIVERED_NEW_ID: _ClassVar[IfDelivered]
    IF_DELIVERED_REFUSE: _ClassVar[IfDelivered]

class ReplaceOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLACE_OUTCOME_UNSPECIFIED: _ClassVar[ReplaceOutcome]
    REPLACE_OUTCOME_REPLACED: _ClassVar[ReplaceOutcome]
    REPLACE_OUTCOME_NONE_PENDING: _ClassVar[ReplaceOutcome]
    REPLACE_OUTCOME_ALREADY_DELIVERED: _ClassVar[ReplaceOutcome]

class TimerOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMER_OUTCOME_UNSPECIFIED: _ClassVar[TimerOutcome]
    CANCELLED: _ClassVar[TimerOutcome]
    RESCHEDULED: _ClassVar[TimerOutcome]
    ALREADY_DELIVERED: _ClassVar[TimerOutcome]
    NOT_FOUND: _ClassVar[TimerOutcome]
IF_DELIVERED_NEW_ID: IfDelivered
IF_DELIVERED_REFUSE: IfDelivered
REPLACE_OUTCOME_UNSPECIFIED: ReplaceOutcome
REPLACE_OUTCOME_REPLACED: ReplaceOutcome
REPLACE_OUTCOME_NONE_PENDING: ReplaceOutcome
REPLACE_OUTCOME_ALREADY_DELIVERED: ReplaceOutcome
TIMER_OUTCOME_UNSPECIFIED: TimerOutcome
CANCELLED: TimerOutcome
RESCHEDULED: TimerOutcome
ALREADY_DELIVERED: TimerOutcome
NOT_FOUND: TimerOutcome

class Topic(_message.Message):
    __slots__ = ("name", "queue_count", "retention_ms", "retention_bytes", "tier_retention_ms", "mounted_from", "taken_over_from")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    MOUNTED_FROM_FIELD_NUMBER: _ClassVar[int]
    TAKEN_OVER_FROM_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    retention_ms: int
    retention_bytes: int
    tier_retention_ms: int
    mounted_from: str
    taken_over_from: str
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., retention_ms: _Optional[int] = ..., retention_bytes: _Optional[int] = ..., tier_retention_ms: _Optional[int] = ..., mounted_from: _Optional[str] = ..., taken_over_from: _Optional[str] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic", "created")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    created: bool
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    def __init__(self, topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class OutgoingMessage(_message.Message):
    __slots__ = ("topic", "key", "tag", "body", "properties", "deliver_at_ms", "delay_ms", "message_id", "replace", "if_delivered")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    IF_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    tag: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    deliver_at_ms: int
    delay_ms: int
    message_id: str
    replace: bool
    if_delivered: IfDelivered
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., tag: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., deliver_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., message_id: _Optional[str] = ..., replace: _Optional[bool] = ..., if_delivered: _Optional[_Union[IfDelivered, str]] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[OutgoingMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[OutgoingMessage, _Mapping]]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("message_id", "error", "deliver_at_ms", "duplicate", "replaced", "replace_outcome")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    REPLACE_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    error: Error
    deliver_at_ms: int
    duplicate: bool
    replaced: int
    replace_outcome: ReplaceOutcome
    def __init__(self, message_id: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., deliver_at_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ..., replaced: _Optional[int] = ..., replace_outcome: _Optional[_Union[ReplaceOutcome, str]] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class ReceivedMessage(_message.Message):
    __slots__ = ("message_id", "topic", "queue_id", "queue_offset", "key", "tag", "body", "properties", "born_at_ms", "deliver_at_ms", "delivery_attempt", "receipt_handle")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    key: str
    tag: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    born_at_ms: int
    deliver_at_ms: int
    delivery_attempt: int
    receipt_handle: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., key: _Optional[str] = ..., tag: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_at_ms: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., delivery_attempt: _Optional[int] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class PopRequest(_message.Message):
    __slots__ = ("topic", "group", "max_messages", "invisible_time_s", "wait_ms", "tag_expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TAG_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    max_messages: int
    invisible_time_s: int
    wait_ms: int
    tag_expression: str
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., max_messages: _Optional[int] = ..., invisible_time_s: _Optional[int] = ..., wait_ms: _Optional[int] = ..., tag_expression: _Optional[str] = ...) -> None: ...

class PopResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("group", "receipt_handles")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: Error
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class ChangeInvisibleTimeRequest(_message.Message):
    __slots__ = ("group", "receipt_handle", "invisible_time_s")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    group: str
    receipt_handle: str
    invisible_time_s: int
    def __init__(self, group: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_time_s: _Optional[int] = ...) -> None: ...

class ChangeInvisibleTimeResponse(_message.Message):
    __slots__ = ("receipt_handle",)
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    def __init__(self, receipt_handle: _Optional[str] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("group", "receipt_handles", "delay_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    delay_ms: int
    def __init__(self, group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class DeadLetterRequest(_message.Message):
    __slots__ = ("group", "receipt_handles", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class DeadLetterResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class NackItem(_message.Message):
    __slots__ = ("receipt_handle", "delay_ms", "dead_letter", "reason")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    delay_ms: int
    dead_letter: bool
    reason: str
    def __init__(self, receipt_handle: _Optional[str] = ..., delay_ms: _Optional[int] = ..., dead_letter: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class InvisibleTimeChange(_message.Message):
    __slots__ = ("receipt_handle", "invisible_time_s")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    invisible_time_s: int
    def __init__(self, receipt_handle: _Optional[str] = ..., invisible_time_s: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("topic", "group", "invisible_time_s", "max_outstanding", "tag_expression", "ack", "nack", "change", "settle_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    TAG_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    SETTLE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    invisible_time_s: int
    max_outstanding: int
    tag_expression: str
    ack: _containers.RepeatedScalarFieldContainer[str]
    nack: _containers.RepeatedCompositeFieldContainer[NackItem]
    change: _containers.RepeatedCompositeFieldContainer[InvisibleTimeChange]
    settle_id: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., invisible_time_s: _Optional[int] = ..., max_outstanding: _Optional[int] = ..., tag_expression: _Optional[str] = ..., ack: _Optional[_Iterable[str]] = ..., nack: _Optional[_Iterable[_Union[NackItem, _Mapping]]] = ..., change: _Optional[_Iterable[_Union[InvisibleTimeChange, _Mapping]]] = ..., settle_id: _Optional[int] = ...) -> None: ...

class SettleError(_message.Message):
    __slots__ = ("receipt_handle", "error")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    error: Error
    def __init__(self, receipt_handle: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class HandleChange(_message.Message):
    __slots__ = ("old_receipt_handle", "receipt_handle", "error")
    OLD_RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    old_receipt_handle: str
    receipt_handle: str
    error: Error
    def __init__(self, old_receipt_handle: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("messages", "errors", "changed", "settled_through")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    SETTLED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    errors: _containers.RepeatedCompositeFieldContainer[SettleError]
    changed: _containers.RepeatedCompositeFieldContainer[HandleChange]
    settled_through: int
    def __init__(self, messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[SettleError, _Mapping]]] = ..., changed: _Optional[_Iterable[_Union[HandleChange, _Mapping]]] = ..., settled_through: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("message_id", "topic")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("outcome", "changed")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    outcome: TimerOutcome
    changed: int
    def __init__(self, outcome: _Optional[_Union[TimerOutcome, str]] = ..., changed: _Optional[int] = ...) -> None: ...

class RescheduleRequest(_message.Message):
    __slots__ = ("message_id", "deliver_at_ms", "delay_ms", "topic")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    deliver_at_ms: int
    delay_ms: int
    topic: str
    def __init__(self, message_id: _Optional[str] = ..., deliver_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class RescheduleResponse(_message.Message):
    __slots__ = ("outcome", "deliver_at_ms", "changed")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    outcome: TimerOutcome
    deliver_at_ms: int
    changed: int
    def __init__(self, outcome: _Optional[_Union[TimerOutcome, str]] = ..., deliver_at_ms: _Optional[int] = ..., changed: _Optional[int] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("topic", "key", "message_id", "max_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    message_id: str
    max_messages: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., message_id: _Optional[str] = ..., max_messages: _Optional[int] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MountRequest(_message.Message):
    __slots__ = ("broker",)
    BROKER_FIELD_NUMBER: _ClassVar[int]
    broker: str
    def __init__(self, broker: _Optional[str] = ...) -> None: ...

class MountResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class UnmountRequest(_message.Message):
    __slots__ = ("broker",)
    BROKER_FIELD_NUMBER: _ClassVar[int]
    broker: str
    def __init__(self, broker: _Optional[str] = ...) -> None: ...

class UnmountResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class TakeoverRequest(_message.Message):
    __slots__ = ("broker", "force")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    broker: str
    force: bool
    def __init__(self, broker: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class TakeoverResponse(_message.Message):
    __slots__ = ("topics", "pending", "groups", "seconds", "accepting_after_seconds")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTING_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    pending: int
    groups: int
    seconds: float
    accepting_after_seconds: float
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., pending: _Optional[int] = ..., groups: _Optional[int] = ..., seconds: _Optional[float] = ..., accepting_after_seconds: _Optional[float] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "topic", "cron", "every_s", "time_zone", "body", "key", "tag", "properties", "start_ms", "end_ms", "misfire", "misfire_bound", "paused", "next_fire_ms", "fired", "last_error", "generation", "jitter_ms", "recent_ticks")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    EVERY_S_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_BOUND_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_MS_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    RECENT_TICKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic: str
    cron: str
    every_s: int
    time_zone: str
    body: bytes
    key: str
    tag: str
    properties: _containers.ScalarMap[str, str]
    start_ms: int
    end_ms: int
    misfire: str
    misfire_bound: int
    paused: bool
    next_fire_ms: int
    fired: int
    last_error: str
    generation: int
    jitter_ms: int
    recent_ticks: _containers.RepeatedCompositeFieldContainer[RecentTick]
    def __init__(self, name: _Optional[str] = ..., topic: _Optional[str] = ..., cron: _Optional[str] = ..., every_s: _Optional[int] = ..., time_zone: _Optional[str] = ..., body: _Optional[bytes] = ..., key: _Optional[str] = ..., tag: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., misfire: _Optional[str] = ..., misfire_bound: _Optional[int] = ..., paused: _Optional[bool] = ..., next_fire_ms: _Optional[int] = ..., fired: _Optional[int] = ..., last_error: _Optional[str] = ..., generation: _Optional[int] = ..., jitter_ms: _Optional[int] = ..., recent_ticks: _Optional[_Iterable[_Union[RecentTick, _Mapping]]] = ...) -> None: ...

class RecentTick(_message.Message):
    __slots__ = ("tick_ms", "message_id")
    TICK_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    tick_ms: int
    message_id: str
    def __init__(self, tick_ms: _Optional[int] = ..., message_id: _Optional[str] = ...) -> None: ...

class TriggerScheduleResponse(_message.Message):
    __slots__ = ("message_id", "tick_ms", "schedule")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TICK_MS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    tick_ms: int
    schedule: Schedule
    def __init__(self, message_id: _Optional[str] = ..., tick_ms: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "upsert")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPSERT_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    upsert: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., upsert: _Optional[bool] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule", "created", "updated")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    created: bool
    updated: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., created: _Optional[bool] = ..., updated: _Optional[bool] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "update_mask")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    update_mask: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., update_mask: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateScheduleResponse(_message.Message):
    __slots__ = ("schedule", "updated")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    updated: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., updated: _Optional[bool] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("prefix", "limit", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    limit: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "total", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    total: int
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., total: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ScheduleNameRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class NextFiresRequest(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class NextFiresResponse(_message.Message):
    __slots__ = ("fire_ms",)
    FIRE_MS_FIELD_NUMBER: _ClassVar[int]
    fire_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fire_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("figures", "json")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    figures: _containers.ScalarMap[str, float]
    json: str
    def __init__(self, figures: _Optional[_Mapping[str, float]] = ..., json: _Optional[str] = ...) -> None: ...

class Permission(_message.Message):
    __slots__ = ("effect", "action", "pattern")
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    effect: str
    action: str
    pattern: str
    def __init__(self, effect: _Optional[str] = ..., action: _Optional[str] = ..., pattern: _Optional[str] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("name", "permissions", "created_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    permissions: _containers.RepeatedCompositeFieldContainer[Permission]
    created_ms: int
    def __init__(self, name: _Optional[str] = ..., permissions: _Optional[_Iterable[_Union[Permission, _Mapping]]] = ..., created_ms: _Optional[int] = ...) -> None: ...

class AddUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class AddUserResponse(_message.Message):
    __slots__ = ("user", "token", "rocketmq_access_key", "rocketmq_secret_key")
    USER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROCKETMQ_ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    ROCKETMQ_SECRET_KEY_FIELD_NUMBER: _ClassVar[int]
    user: User
    token: str
    rocketmq_access_key: str
    rocketmq_secret_key: str
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., token: _Optional[str] = ..., rocketmq_access_key: _Optional[str] = ..., rocketmq_secret_key: _Optional[str] = ...) -> None: ...

class GrantPermissionRequest(_message.Message):
    __slots__ = ("user", "permission")
    USER_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    user: str
    permission: Permission
    def __init__(self, user: _Optional[str] = ..., permission: _Optional[_Union[Permission, _Mapping]] = ...) -> None: ...

class RevokePermissionRequest(_message.Message):
    __slots__ = ("user", "action", "pattern")
    USER_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    user: str
    action: str
    pattern: str
    def __init__(self, user: _Optional[str] = ..., action: _Optional[str] = ..., pattern: _Optional[str] = ...) -> None: ...

class UserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class RemoveUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveUserResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("user", "all_topics")
    USER_FIELD_NUMBER: _ClassVar[int]
    ALL_TOPICS_FIELD_NUMBER: _ClassVar[int]
    user: User
    all_topics: bool
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., all_topics: _Optional[bool] = ...) -> None: ...
