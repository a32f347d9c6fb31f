"""The recurring-schedule RPCs (``CreateSchedule``, ``UpdateSchedule``, ``ListSchedules``,
``PauseSchedule``, ``ResumeSchedule``, ``DeleteSchedule``, ``TriggerSchedule``,
``NextFires``) over the broker's schedule engine (``chronomq.recurrence``).  Every field
is checked before anything is stored; errors raise (the servicer's handlers turn them
into status codes).  Each change is one write of the schedule book, journaled
(``PopService.write_state``: ``Fence.check`` before the answer); one that wrote nothing
passes ``Fence.confirm``."""

from __future__ import annotations

from typing import Any

from chronomq.broker import Broker
from chronomq.v1 import broker_pb2 as pb
from recurring.book import ScheduleState
from recurring.model import ScheduleSpec, check_schedule_name, fires, next_fire
from store.errors import AlreadyExists, InvalidArgument, NotFound

MAX_LIST = 1_000
MAX_FIRES = 1_000
# the settings UpdateSchedule changes (its update_mask), as Schedule's fields
SETTINGS = ("topic", "cron", "every_s", "time_zone", "body", "key", "tag", "properties",
            "start_ms", "end_ms", "misfire", "misfire_bound", "jitter_ms")
_RULE = {"cron": "every_s", "every_s": "cron"}  # naming one clears the other


def schedule_pb(state: ScheduleState) -> pb.Schedule:
    s = state.spec
    return pb.Schedule(name=s.name, topic=s.topic, cron=s.cron, every_s=s.every_s,
                       time_zone=s.time_zone, body=s.body, key=s.key, tag=s.tag,
                       properties=s.properties, start_ms=s.start_ms, end_ms=s.end_ms,
                       misfire=s.misfire, misfire_bound=s.misfire_bound,
                       paused=state.paused, next_fire_ms=state.next_ms or 0,
                       fired=state.fired, last_error=state.last_error,
                       generation=state.generation, jitter_ms=s.jitter_ms,
                       recent_ticks=[pb.RecentTick(tick_ms=t, message_id=i)
                                     for t, i in state.recent])


def spec_of(m: pb.Schedule, max_body_bytes: int) -> ScheduleSpec:
    spec = ScheduleSpec(name=m.name, topic=m.topic, cron=m.cron.strip(),
                        every_s=m.every_s, time_zone=m.time_zone or "UTC", body=m.body,
                        key=m.key, tag=m.tag, properties=dict(m.properties),
                        start_ms=m.start_ms, end_ms=m.end_ms, misfire=m.misfire or "once",
                        misfire_bound=m.misfire_bound or 100, jitter_ms=m.jitter_ms)
    spec.validate(max_body_bytes)
    return spec


def create(broker: Broker, request: pb.CreateScheduleRequest) -> pb.CreateScheduleResponse:
    """A new schedule; with ``upsert`` one of that name with other settings is updated
    in place (a delete meanwhile: created after all)."""
    spec = spec_of(request.schedule, broker.config.schedules.max_body_bytes)
    broker.store.topics.require(spec.topic)  # NOT_FOUND now, not at the first tick
    book, updated = broker.schedules.book, False
    for _ in range(3):
        try:
            state, created = book.create(spec, broker.clock.now_ms())
            break
        except AlreadyExists:
            if not request.upsert:
                raise
        try:
            (state, updated), created = book.update(spec, broker.clock.now_ms()), False
            break
        except NotFound:
            continue  # deleted meanwhile: create it
    else:
        raise AlreadyExists(f"schedule {spec.name!r} is being created and deleted by "
                            "others: try again")
    broker.schedules.wake()
    broker.fence.confirm()  # (a create that found it there wrote nothing: the gate still)
    return pb.CreateScheduleResponse(schedule=schedule_pb(state), created=created,
                                     updated=updated)


def update(broker: Broker, request: pb.UpdateScheduleRequest) -> pb.UpdateScheduleResponse:
    """The named settings of ``request.schedule`` over the stored ones, checked as a
    create checks them, then ``ScheduleBook.update``."""
    given = request.schedule
    check_schedule_name(given.name)
    mask = list(request.update_mask) or [f for f in SETTINGS if _is_set(given, f)]
    unknown = sorted(set(mask) - set(SETTINGS))
    if unknown:
        raise InvalidArgument(f"update_mask: {', '.join(u[:64] for u in unknown[:5])} "
                              f"cannot be changed (one of {', '.join(SETTINGS)})")
    if not mask:
        raise InvalidArgument("nothing to change: name the settings in update_mask")
    old = broker.schedules.book.get(given.name)
    merged = schedule_pb(old)
    for f in mask:
        if f in _RULE and _RULE[f] not in mask:
            merged.ClearField(_RULE[f])
        if f == "properties":
            merged.properties.clear()
            merged.properties.update(given.properties)
        else:
            setattr(merged, f, getattr(given, f))
    spec = spec_of(merged, broker.config.schedules.max_body_bytes)
    if spec.topic != old.spec.topic:
        broker.store.topics.require(spec.topic)
    state, updated = broker.schedules.book.update(spec, broker.clock.now_ms())
    broker.schedules.wake()
    broker.fence.confirm()  # (an update to the same settings wrote nothing: the gate still)
    return pb.UpdateScheduleResponse(schedule=schedule_pb(state), updated=updated)


def _is_set(m: pb.Schedule, field: str) -> bool:
    value: Any = getattr(m, field)
    return bool(len(value)) if field == "properties" else bool(value)


def listing(broker: Broker, request: pb.ListSchedulesRequest) -> pb.ListSchedulesResponse:
    """A page by name: those after ``page_token`` (the last name of the page before)."""
    if request.page_token:
        check_schedule_name(request.page_token, "page_token")
    limit = min(request.limit or MAX_LIST, MAX_LIST)
    states, total, more = broker.schedules.book.page(request.prefix, request.page_token,
                                                     limit)
    return pb.ListSchedulesResponse(schedules=[schedule_pb(s) for s in states], total=total,
                                    next_page_token=states[-1].spec.name if more else "")


def pause(broker: Broker, name: str, paused: bool) -> pb.ScheduleResponse:
    state = broker.schedules.book.set_paused(name, paused, broker.clock.now_ms())
    broker.schedules.wake()
    broker.fence.confirm()  # (already so: nothing written, the gate still)
    return pb.ScheduleResponse(schedule=schedule_pb(state))


def delete(broker: Broker, name: str) -> pb.DeleteScheduleResponse:
    broker.schedules.book.delete(name, broker.clock.now_ms())
    return pb.DeleteScheduleResponse(deleted=True)


def trigger(broker: Broker, name: str) -> pb.TriggerScheduleResponse:
    """One tick now through the engine's send (the fence of any Send: ``Sender.stored``),
    then the book's write (``Fence.check``)."""
    check_schedule_name(name)
    broker.store.topics.require(broker.schedules.book.get(name).spec.topic)
    mid, tick_ms = broker.schedules.trigger(name, broker.clock.now_ms())
    return pb.TriggerScheduleResponse(message_id=mid, tick_ms=tick_ms,
                                      schedule=schedule_pb(broker.schedules.book.get(name)))


def next_fires(broker: Broker, request: pb.NextFiresRequest) -> pb.NextFiresResponse:
    """The next ``count`` ticks (a paused schedule's: those it would send if resumed
    now)."""
    if request.count > MAX_FIRES:
        raise InvalidArgument(f"count must be at most {MAX_FIRES}")
    state = broker.schedules.book.get(request.name)
    trigger = state.spec.trigger()
    first = next_fire(trigger, broker.clock.now_ms()) if state.paused else state.next_ms
    if first is None:
        return pb.NextFiresResponse()  # ended
    return pb.NextFiresResponse(fire_ms=[first, *fires(trigger, first,
                                                       (request.count or 10) - 1)])
