"""The public API of periodic jobs: sync from code, list, pause, resume, run now.

Code, the admin and ``manage.py durable_jobs schedules`` act through these functions;
every write is a statement of ``store.py`` and every instant the database's clock.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from durable_jobs import conf, db, ids, registry, service, store, validation
from durable_jobs.exceptions import ConfigurationError, ScheduleNotFound, ScheduleRemoved
from durable_jobs.models import Job, Schedule
from durable_jobs.schedules import declare, ticks

#: Tick keys: "schedule:<name>:<tick, UTC ISO-8601>"; a run now: "schedule:<name>:run:<id>".
KEY_PREFIX = "schedule:"


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of ``name``'s start at ``tick``: one job per tick (invariant 24)."""
    return f"{KEY_PREFIX}{name}:{ticks.utc_iso(tick)}"


def sync_schedules(*, using: str = DEFAULT_DB_ALIAS) -> tuple[int, int]:
    """Write every schedule code declares to the table; mark the others removed.

    Workers call it when they start. Returns ``(written, removed)``. A declaration the
    system check refuses raises ``ConfigurationError`` naming it, and nothing is written.
    """
    valid, problems = declare.checked(registry.kinds())
    if problems:
        raise ConfigurationError("; ".join(problems))
    now = db.database_now(using=using)
    rows = [
        {
            "name": entry.name,
            "kind": entry.kind,
            "expression": entry.expression,
            "zone": entry.zone,
            "input": entry.input_json,
            "queue": entry.queue,
            "priority": entry.priority,
            "catch_up": str(entry.catch_up),
            "next_tick_at": ticks.next_tick(entry.expression, entry.zone, now),
        }
        for entry in valid
    ]
    return store.sync_schedules(rows, notify_channel=conf.get().NOTIFY_CHANNEL, using=using)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleView:
    """What operators see of a schedule (``durable_jobs schedules``, the admin)."""

    name: str
    kind: str
    expression: str
    zone: str
    catch_up: str
    next_tick_at: datetime | None
    last_tick_at: datetime | None
    last_job_id: uuid.UUID | None
    last_job_status: str | None
    missed_ticks: int
    paused_at: datetime | None
    removed_at: datetime | None
    #: Its next tick is older than SCHEDULE_GRACE: no scheduler is firing it.
    overdue: bool

    @property
    def state(self) -> str:
        if self.removed_at is not None:
            return "removed"
        if self.paused_at is not None:
            return "paused"
        return "overdue" if self.overdue else "active"

    def as_dict(self) -> dict[str, Any]:
        """The view as JSON-ready values (``durable_jobs schedules --json``)."""
        values = {**dataclasses.asdict(self), "state": self.state}
        return {key: _plain(value) for key, value in values.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def list_schedules(*, using: str = DEFAULT_DB_ALIAS) -> list[ScheduleView]:
    """Every schedule in the table, removed ones included (their history stays), by name."""
    rows = list(Schedule.objects.using(using).order_by("name"))
    job_ids = [row.last_job_id for row in rows if row.last_job_id is not None]
    statuses = dict(Job.objects.using(using).filter(id__in=job_ids).values_list("id", "status"))
    now = db.database_now(using=using)
    grace = conf.get().SCHEDULE_GRACE
    return [
        _view(row, statuses.get(row.last_job_id) if row.last_job_id else None, now, grace)
        for row in rows
    ]


def _view(row: Schedule, status: str | None, now: datetime, grace: float) -> ScheduleView:
    active = row.paused_at is None and row.removed_at is None
    return ScheduleView(
        name=row.name,
        kind=row.kind,
        expression=row.expression,
        zone=row.zone,
        catch_up=row.catch_up,
        next_tick_at=row.next_tick_at if active else None,
        last_tick_at=row.last_tick_at,
        last_job_id=row.last_job_id,
        last_job_status=status,
        missed_ticks=row.missed_ticks,
        paused_at=row.paused_at,
        removed_at=row.removed_at,
        overdue=active and (now - row.next_tick_at).total_seconds() > grace,
    )


def _existing(name: str, operation: str, using: str) -> Schedule:
    validation.name("name", name)
    row = Schedule.objects.using(using).filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(name)
    if row.removed_at is not None:
        raise ScheduleRemoved(name, operation)
    return row


def pause_schedule(name: str, *, using: str = DEFAULT_DB_ALIAS) -> Schedule:
    """Stop ``name`` firing until it is resumed; pausing a paused schedule changes nothing.

    Its jobs already started are not touched: a pause stops new ticks only.
    """
    row = store.pause_schedule(validation.name("name", name), using=using)
    return row if row is not None else _existing(name, "pause", using)


def resume_schedule(name: str, *, using: str = DEFAULT_DB_ALIAS) -> Schedule:
    """Let ``name`` fire again from its first tick after now (database clock).

    Ticks that fell while it was paused are skipped, not caught up: the operator paused
    it so that they would not run. Resuming an active schedule changes nothing.
    """
    current = _existing(name, "resume", using)
    following = ticks.next_tick(current.expression, current.zone, db.database_now(using=using))
    row = store.resume_schedule(
        name, following=following, notify_channel=conf.get().NOTIFY_CHANNEL, using=using
    )
    return row if row is not None else _existing(name, "resume", using)


def run_schedule(name: str, *, using: str = DEFAULT_DB_ALIAS) -> Job:
    """Start one run of ``name`` now, as its tick would, under a key of its own.

    The key (``schedule:<name>:run:<id>``) never equals a tick's, so a run now neither
    takes a tick's place nor is taken by one. A paused schedule may be run by hand.
    """
    row = _existing(name, "run", using)
    with transaction.atomic(using=using):
        job = start_for(row, key=f"{KEY_PREFIX}{name}:run:{ids.uuid7()}", tick=None, using=using)
        store.record_schedule_job(name, job.id, using=using)
    return job


def start_for(row: Schedule, *, key: str, tick: datetime | None, using: str) -> Job:
    """Start ``row``'s job in the caller's transaction (a tick's, or a run now)."""
    meta: dict[str, Any] = {"schedule": row.name}
    if tick is not None:
        meta["tick"] = ticks.utc_iso(tick)
    return service.start(
        row.kind,
        input=row.input,
        queue=row.queue_name,
        priority=row.priority,
        idempotency_key=key,
        meta=meta,
        created_by=f"{KEY_PREFIX}{row.name}",
        using=using,
    )
