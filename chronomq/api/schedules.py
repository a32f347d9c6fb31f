"""The recurring-schedule RPCs (``CreateSchedule``, ``ListSchedules``, ``PauseSchedule``,
``ResumeSchedule``, ``DeleteSchedule``, ``NextFires``) over the broker's schedule engine
(``chronomq.recurrence``).  Every field is checked before anything is stored; errors
raise (the servicer's handlers turn them into status codes)."""

from __future__ import annotations

from chronomq.broker import Broker
from chronomq.v1 import broker_pb2 as pb
from recurring.book import ScheduleState
from recurring.model import ScheduleSpec, fires, next_fire
from store.errors import InvalidArgument

MAX_LIST = 1_000
MAX_FIRES = 1_000


def schedule_pb(state: ScheduleState) -> pb.Schedule:
    s = state.spec
    return pb.Schedule(name=s.name, topic=s.topic, cron=s.cron, every_s=s.every_s,
                       time_zone=s.time_zone, body=s.body, key=s.key, tag=s.tag,
                       properties=s.properties, start_ms=s.start_ms, end_ms=s.end_ms,
                       misfire=s.misfire, misfire_bound=s.misfire_bound,
                       paused=state.paused, next_fire_ms=state.next_ms or 0,
                       fired=state.fired, last_error=state.last_error)


def spec_of(m: pb.Schedule, max_body_bytes: int) -> ScheduleSpec:
    spec = ScheduleSpec(name=m.name, topic=m.topic, cron=m.cron.strip(),
                        every_s=m.every_s, time_zone=m.time_zone or "UTC", body=m.body,
                        key=m.key, tag=m.tag, properties=dict(m.properties),
                        start_ms=m.start_ms, end_ms=m.end_ms, misfire=m.misfire or "once",
                        misfire_bound=m.misfire_bound or 100)
    spec.validate(max_body_bytes)
    return spec


def create(broker: Broker, request: pb.CreateScheduleRequest) -> pb.CreateScheduleResponse:
    spec = spec_of(request.schedule, broker.config.schedules.max_body_bytes)
    broker.store.topics.require(spec.topic)  # NOT_FOUND now, not at the first tick
    state, created = broker.schedules.book.create(spec, broker.clock.now_ms())
    broker.schedules.wake()
    broker.fence.confirm()  # (a create that found it there wrote nothing: the gate still)
    return pb.CreateScheduleResponse(schedule=schedule_pb(state), created=created)


def listing(broker: Broker, request: pb.ListSchedulesRequest) -> pb.ListSchedulesResponse:
    limit = min(request.limit or MAX_LIST, MAX_LIST)
    states = [s for s in broker.schedules.book.states()
              if s.spec.name.startswith(request.prefix)]
    return pb.ListSchedulesResponse(schedules=[schedule_pb(s) for s in states[:limit]],
                                    total=len(states))


def pause(broker: Broker, name: str, paused: bool) -> pb.ScheduleResponse:
    state = broker.schedules.book.set_paused(name, paused, broker.clock.now_ms())
    broker.schedules.wake()
    broker.fence.confirm()  # (already so: nothing written, the gate still)
    return pb.ScheduleResponse(schedule=schedule_pb(state))


def delete(broker: Broker, name: str) -> pb.DeleteScheduleResponse:
    broker.schedules.book.delete(name, broker.clock.now_ms())
    return pb.DeleteScheduleResponse(deleted=True)


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
