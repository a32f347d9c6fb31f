"""A typed, synchronous Python client for ``chronomq.v1.Broker`` (used by the CLI, the
tests and the benchmarks).

    with ChronomqClient("127.0.0.1:7600") as c:
        c.create_topic("orders")
        mid = c.send_one("orders", b"hello", delay_ms=0)
        for m in c.pop("orders", "billing", wait_ms=1000):
            c.ack("billing", [m.receipt_handle])

Thread-safe (a gRPC channel is).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc

from chronomq.client.errors import RpcError as RpcError  # re-exported: its old home
from chronomq.client.subscription import Subscription as Subscription  # re-exported
from chronomq.client.users import Users
from chronomq.v1 import broker_pb2 as pb
from chronomq.v1 import broker_pb2_grpc as pb_grpc


class TimerResult(NamedTuple):
    """What a Cancel or Reschedule did: ``outcome`` (CANCELLED, RESCHEDULED,
    ALREADY_DELIVERED, NOT_FOUND), how many pending messages it ``changed`` and, for a
    Reschedule, the new ``deliver_at_ms``."""

    outcome: str
    changed: int
    deliver_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class SendOutcome:
    message_id: str
    deliver_at_ms: int
    error_code: int = 0
    error: str = ""
    duplicate: bool = False  # sent before within the broker's dedupe window: not stored
    replaced: int = 0  # sent with ``replace``: the pending messages with its id it replaced
    # sent with ``replace``: the case it met, "REPLACED", "NONE_PENDING" (the id never
    # stored in the topic) or "ALREADY_DELIVERED" (delivered or in flight: stored under
    # a new id, ``message_id``, with ``if_delivered = "NEW_ID"``); "" without replace
    replace_outcome: str = ""

    @property
    def ok(self) -> bool:
        return not self.error_code


IF_DELIVERED = {"NEW_ID": pb.IF_DELIVERED_NEW_ID, "REFUSE": pb.IF_DELIVERED_REFUSE}


def replace_outcome(result: pb.SendResult) -> str:
    """``SendResult.replace_outcome`` by its name without the prefix ("" without
    replace; the number, for a case this client does not know)."""
    value = result.replace_outcome
    if not value:
        return ""
    try:
        return pb.ReplaceOutcome.Name(value).removeprefix("REPLACE_OUTCOME_")
    except ValueError:
        return str(value)


def message(topic: str, body: bytes, key: str = "", tag: str = "",
            properties: Mapping[str, str] | None = None, deliver_at_ms: int | None = None,
            delay_ms: int | None = None, message_id: str = "",
            replace: bool = False, if_delivered: str = "NEW_ID") -> pb.OutgoingMessage:
    """Build one outgoing message (``deliver_at_ms`` and ``delay_ms`` are exclusive).
    ``replace`` (with ``message_id``): replace the messages with that id still pending in
    the topic instead of being dropped as a duplicate (debounce).  ``if_delivered``
    (with ``replace``): when the id's message was already delivered or is in flight,
    "NEW_ID" stores this one under the id's next generation, ``<id>~<n>``; "REFUSE"
    stores nothing and answers FAILED_PRECONDITION."""
    if deliver_at_ms is not None and delay_ms is not None:
        raise ValueError("give deliver_at_ms or delay_ms, not both")
    if replace and not message_id:
        raise ValueError("replace needs the message_id of the message to replace")
    if if_delivered not in IF_DELIVERED:
        raise ValueError(f"if_delivered is one of {', '.join(IF_DELIVERED)}, not "
                         f"{if_delivered!r}")
    if if_delivered != "NEW_ID" and not replace:
        raise ValueError("if_delivered is a setting of replace")
    m = pb.OutgoingMessage(topic=topic, body=body, key=key, tag=tag,
                           properties=dict(properties or {}), message_id=message_id,
                           replace=replace, if_delivered=IF_DELIVERED[if_delivered])
    if deliver_at_ms is not None:
        m.deliver_at_ms = deliver_at_ms
    elif delay_ms is not None:
        m.delay_ms = delay_ms
    return m


def _outcomes(response: pb.SendResponse) -> list[SendOutcome]:
    out = []
    for r in response.results:
        if r.WhichOneof("outcome") == "error":
            out.append(SendOutcome("", 0, r.error.code, r.error.message))
        else:
            out.append(SendOutcome(r.message_id, r.deliver_at_ms, duplicate=r.duplicate,
                                   replaced=r.replaced, replace_outcome=replace_outcome(r)))
    return out


KEEPALIVE_S = 10.0  # the broker lets pings come every second (``chronomq.server``)


class ChronomqClient:
    def __init__(self, target: str = "127.0.0.1:7600", token: str = "",
                 tls_ca_file: str = "", timeout_s: float = 30.0,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        """``keepalive_s``: while a call is open, ping the broker after this long without
        a frame from it; no answer within as long again (at most 10 s) breaks the call
        with UNAVAILABLE (a paused or lost broker never closes its socket; 0: no pings)."""
        options = [("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20)]
        if keepalive_s > 0:
            ms = max(1000, int(keepalive_s * 1000))
            options += [("grpc.keepalive_time_ms", ms),
                        ("grpc.keepalive_timeout_ms", min(ms, 10_000)),
                        # any ping in flight, not only the keepalive's (its default: 60 s)
                        ("grpc.http2.ping_timeout_ms", min(ms, 10_000)),
                        ("grpc.keepalive_permit_without_calls", 0),
                        ("grpc.http2.max_pings_without_data", 0)]
        if tls_ca_file:
            with open(tls_ca_file, "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())
            self._channel = grpc.secure_channel(target, creds, options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        self._stub = pb_grpc.BrokerStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s

    def __enter__(self) -> ChronomqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    @property
    def users(self) -> Users:
        """User management (``chronomq.client.users``): add, grant, revoke, list, ..."""
        return Users(self)

    @property
    def stub(self) -> pb_grpc.BrokerStub:
        """The generated stub (for streams the typed methods do not cover)."""
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the bearer token, when one is set."""
        return self._metadata

    def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """One unary call by method name (errors as ``RpcError``)."""
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise RpcError(exc.code(), exc.details() or "") from exc

    # ------------------------------------------------------------------ topics

    def create_topic(self, name: str, queue_count: int = 0, retention_ms: int = 0,
                     retention_bytes: int = 0, tier_retention_ms: int = 0) -> bool:
        """Create a topic; True if created, False if it already existed the same."""
        topic = pb.Topic(name=name, queue_count=queue_count, retention_ms=retention_ms,
                         retention_bytes=retention_bytes, tier_retention_ms=tier_retention_ms)
        resp = self.call("CreateTopic", pb.CreateTopicRequest(topic=topic))
        return bool(resp.created)

    def list_topics(self) -> list[pb.Topic]:
        return list(self.call("ListTopics", pb.ListTopicsRequest()).topics)

    def delete_topic(self, name: str) -> None:
        self.call("DeleteTopic", pb.DeleteTopicRequest(name=name))

    # ------------------------------------------------------------------ send

    def send(self, messages: Iterable[pb.OutgoingMessage]) -> list[SendOutcome]:
        """One unary Send; one outcome per message, in order."""
        return _outcomes(self.call("Send", pb.SendRequest(messages=list(messages))))

    def send_one(self, topic: str, body: bytes, **kw: Any) -> str:
        """Send one message; return its id or raise ``RpcError`` with its error."""
        (outcome,) = self.send([message(topic, body, **kw)])
        if not outcome.ok:
            raise RpcError(status_by_number(outcome.error_code), outcome.error)
        return outcome.message_id

    def send_stream(self, batches: Iterable[list[pb.OutgoingMessage]]
                    ) -> Iterator[list[SendOutcome]]:
        """Stream batches over SendStream; yields each batch's outcomes once durable."""
        requests = (pb.SendRequest(messages=b) for b in batches)
        try:
            for response in self._stub.SendStream(requests, metadata=self._metadata):
                yield _outcomes(response)
        except grpc.RpcError as exc:
            raise RpcError(exc.code(), exc.details() or "") from exc

    def send_stream_encoded(self, requests: Iterable[bytes]) -> Iterator[list[SendOutcome]]:
        """``send_stream`` for requests already encoded as ``SendRequest`` wire bytes
        (``chronomq.api.wire.encode_send_request``): no protobuf objects per message."""
        call = self._channel.stream_stream(
            "/chronomq.v1.Broker/SendStream", request_serializer=None,
            response_deserializer=pb.SendResponse.FromString)
        try:
            for response in call(iter(requests), metadata=self._metadata):
                yield _outcomes(response)
        except grpc.RpcError as exc:
            raise RpcError(exc.code(), exc.details() or "") from exc

    # ------------------------------------------------------------------ consume

    def pop(self, topic: str, group: str, max_messages: int = 32, invisible_time_s: int = 30,
            wait_ms: int = 0, tag_expression: str = "") -> list[pb.ReceivedMessage]:
        request = pb.PopRequest(topic=topic, group=group, max_messages=max_messages,
                                invisible_time_s=invisible_time_s, wait_ms=wait_ms,
                                tag_expression=tag_expression)
        resp = self.call("Pop", request, timeout_s=self.timeout_s + wait_ms / 1000)
        return list(resp.messages)

    def ack(self, group: str, receipt_handles: Iterable[str]) -> list[str]:
        """Ack handles; returns one error string per handle ("" = acknowledged)."""
        resp = self.call("Ack", pb.AckRequest(group=group,
                                               receipt_handles=list(receipt_handles)))
        return _errors(resp)

    def nack(self, group: str, receipt_handles: Iterable[str],
             delay_ms: int | None = None) -> list[str]:
        """Give messages back: visible again after ``delay_ms`` (None: the group's
        back-off); one error string per handle ("" = released)."""
        request = pb.NackRequest(group=group, receipt_handles=list(receipt_handles))
        if delay_ms is not None:
            request.delay_ms = delay_ms
        return _errors(self.call("Nack", request))

    def dead_letter(self, group: str, receipt_handles: Iterable[str],
                    reason: str = "") -> list[str]:
        """Move messages to the group's dead-letter topic now."""
        return _errors(self.call("DeadLetter", pb.DeadLetterRequest(
            group=group, receipt_handles=list(receipt_handles), reason=reason)))

    def change_invisible_time(self, group: str, receipt_handle: str,
                              invisible_time_s: int) -> str:
        """Move a lease's deadline to now + ``invisible_time_s``; returns the new handle."""
        resp = self.call("ChangeInvisibleTime", pb.ChangeInvisibleTimeRequest(
            group=group, receipt_handle=receipt_handle, invisible_time_s=invisible_time_s))
        return str(resp.receipt_handle)

    def subscribe(self, topic: str, group: str, invisible_time_s: int = 30,
                  max_outstanding: int = 256, tag_expression: str = "") -> Subscription:
        """Open a Subscribe stream (streaming pull); see ``Subscription``."""
        return Subscription(self._stub, self._metadata, pb.SubscribeRequest(
            topic=topic, group=group, invisible_time_s=invisible_time_s,
            max_outstanding=max_outstanding, tag_expression=tag_expression))

    # ------------------------------------------------------------------ schedules

    def create_schedule(self, name: str, topic: str, body: bytes, *, cron: str = "",
                        every_s: int = 0, time_zone: str = "UTC", key: str = "",
                        tag: str = "", properties: Mapping[str, str] | None = None,
                        start_ms: int = 0, end_ms: int = 0, misfire: str = "once",
                        misfire_bound: int = 0, upsert: bool = False, jitter_ms: int = 0
                        ) -> tuple[pb.Schedule, bool]:
        """Create a recurring schedule (``cron`` or ``every_s``); the schedule as stored
        (with its next fire time) and whether it is new (an identical one is kept).  With
        ``upsert``, one of that name with other settings is updated in place (refused
        otherwise)."""
        r = self.put_schedule(pb.Schedule(
            name=name, topic=topic, body=body, cron=cron, every_s=every_s,
            time_zone=time_zone, key=key, tag=tag, properties=dict(properties or {}),
            start_ms=start_ms, end_ms=end_ms, misfire=misfire,
            misfire_bound=misfire_bound, jitter_ms=jitter_ms), upsert)
        return r.schedule, r.created

    def put_schedule(self, schedule: pb.Schedule, upsert: bool = False
                     ) -> pb.CreateScheduleResponse:
        """CreateSchedule as it answers: the schedule, ``created``, ``updated``."""
        r: pb.CreateScheduleResponse = self.call("CreateSchedule", pb.CreateScheduleRequest(
            schedule=schedule, upsert=upsert))
        return r

    def update_schedule(self, name: str, *, topic: str | None = None,
                        cron: str | None = None, every_s: int | None = None,
                        time_zone: str | None = None, body: bytes | None = None,
                        key: str | None = None, tag: str | None = None,
                        properties: Mapping[str, str] | None = None,
                        start_ms: int | None = None, end_ms: int | None = None,
                        misfire: str | None = None, misfire_bound: int | None = None,
                        jitter_ms: int | None = None) -> tuple[pb.Schedule, bool]:
        """Change the settings given (not None) of a schedule in place: ticks sent stay
        sent, the next follows the new rule (a cron clears the interval and the other way
        round).  The schedule as stored and whether anything changed."""
        given: dict[str, Any] = {
            k: v for k, v in (("topic", topic), ("cron", cron), ("every_s", every_s),
                              ("time_zone", time_zone), ("body", body), ("key", key),
                              ("tag", tag), ("start_ms", start_ms), ("end_ms", end_ms),
                              ("misfire", misfire), ("misfire_bound", misfire_bound),
                              ("jitter_ms", jitter_ms))
            if v is not None}
        mask = [*given, *(["properties"] if properties is not None else [])]
        r = self.call("UpdateSchedule", pb.UpdateScheduleRequest(schedule=pb.Schedule(
            name=name, properties=dict(properties or {}), **given), update_mask=mask))
        return r.schedule, r.updated

    def list_schedules(self, prefix: str = "", limit: int = 0) -> list[pb.Schedule]:
        """The schedules whose names start with ``prefix``, by name: every one (limit 0,
        page after page), or the first ``limit``."""
        if limit:
            return self.list_schedules_page(prefix, limit)[0]
        return list(self.iter_schedules(prefix))

    def list_schedules_page(self, prefix: str = "", limit: int = 0, page_token: str = ""
                            ) -> tuple[list[pb.Schedule], str]:
        """One page (``limit`` 0: the broker's most, 1,000) after ``page_token``; with
        the token of the next page ("": none)."""
        r = self.call("ListSchedules", pb.ListSchedulesRequest(
            prefix=prefix, limit=limit, page_token=page_token))
        return list(r.schedules), r.next_page_token

    def iter_schedules(self, prefix: str = "", page_size: int = 0, page_token: str = ""
                       ) -> Iterator[pb.Schedule]:
        """Every schedule whose name starts with ``prefix`` (after ``page_token``), by
        name, a page of ``page_size`` (0: 1,000) at a time."""
        token = page_token
        while True:
            page, token = self.list_schedules_page(prefix, page_size, token)
            yield from page
            if not token:
                return

    def pause_schedule(self, name: str) -> pb.Schedule:
        r: pb.ScheduleResponse = self.call("PauseSchedule", pb.ScheduleNameRequest(name=name))
        return r.schedule

    def resume_schedule(self, name: str) -> pb.Schedule:
        r: pb.ScheduleResponse = self.call("ResumeSchedule",
                                           pb.ScheduleNameRequest(name=name))
        return r.schedule

    def delete_schedule(self, name: str) -> None:
        self.call("DeleteSchedule", pb.ScheduleNameRequest(name=name))

    def trigger_schedule(self, name: str) -> pb.TriggerScheduleResponse:
        """Send one tick of the schedule now (id ``<name>!<now ms>``): its message id,
        its time and the schedule as it stands after it."""
        r: pb.TriggerScheduleResponse = self.call("TriggerSchedule",
                                                  pb.ScheduleNameRequest(name=name))
        return r

    def next_fires(self, name: str, count: int = 10) -> list[int]:
        """The schedule's next ``count`` fire times (epoch ms)."""
        return list(self.call("NextFires", pb.NextFiresRequest(name=name,
                                                               count=count)).fire_ms)

    # ------------------------------------------------------------------ timer control

    def cancel(self, message_id: str, topic: str = "") -> TimerResult:
        """Cancel every pending delayed message with this id (only that ``topic``'s, if
        given)."""
        resp = self.call("Cancel", pb.CancelRequest(message_id=message_id, topic=topic))
        return TimerResult(str(pb.TimerOutcome.Name(resp.outcome)), int(resp.changed))

    def reschedule(self, message_id: str, deliver_at_ms: int | None = None,
                   delay_ms: int | None = None, topic: str = "") -> TimerResult:
        """Move the delivery time of every pending message with this id (only that
        ``topic``'s, if given)."""
        request = pb.RescheduleRequest(message_id=message_id, topic=topic)
        if deliver_at_ms is not None:
            request.deliver_at_ms = deliver_at_ms
        elif delay_ms is not None:
            request.delay_ms = delay_ms
        resp = self.call("Reschedule", request)
        return TimerResult(str(pb.TimerOutcome.Name(resp.outcome)), int(resp.changed),
                           int(resp.deliver_at_ms))

    # ------------------------------------------------------------------ query / stats

    def query(self, topic: str = "", key: str = "", message_id: str = "",
              max_messages: int = 32) -> list[pb.ReceivedMessage]:
        request = pb.QueryMessagesRequest(topic=topic, max_messages=max_messages)
        if message_id:
            request.message_id = message_id
        elif key:
            request.key = key
        return list(self.call("QueryMessages", request).messages)

    def mount(self, broker: str) -> list[str]:
        """Serve ``broker``'s topics read-only from the shared tier; returns them."""
        return list(self.call("Mount", pb.MountRequest(broker=broker)).topics)

    def takeover(self, broker: str, force: bool = False, timeout_s: float = 3600.0
                 ) -> pb.TakeoverResponse:
        """Take over a departed broker's topics, positions and pending delayed messages
        from the shared tier (may take a while: ``timeout_s``)."""
        resp: pb.TakeoverResponse = self.call(
            "Takeover", pb.TakeoverRequest(broker=broker, force=force), timeout_s)
        return resp

    def unmount(self, broker: str) -> list[str]:
        return list(self.call("Unmount", pb.UnmountRequest(broker=broker)).topics)

    def stats(self) -> dict[str, float]:
        resp = self.call("Stats", pb.StatsRequest())
        figures: dict[str, float] = json.loads(resp.json)
        return figures


def _errors(resp: pb.AckResponse | pb.NackResponse | pb.DeadLetterResponse) -> list[str]:
    return [r.error.message if r.HasField("error") else "" for r in resp.results]


def status_by_number(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
