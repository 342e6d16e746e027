"""The live workers, as operators and ``explain`` see them: who is up, what each serves,
and what each runs now.

A worker is live while its beat is younger than ``LEASE_TTL`` (see
``runtime.registration``); what it runs now is read from the job table itself (the
running jobs whose lease owner is one of its slots), so the answer never depends on the
worker having reported it.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS
from django.db.models.functions import Now

from durable_jobs import conf
from durable_jobs.models import Job, WorkerProcess
from durable_jobs.states import Status


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LiveWorker:
    identity: str
    host: str
    pid: int
    version: str
    queues: list[str]
    kinds: list[str]
    slots: int
    execution: str
    started_at: datetime
    beat_at: datetime
    #: Kinds of the jobs it holds a lease on now, each with how many.
    running: dict[str, int]


def live_workers(*, using: str = DEFAULT_DB_ALIAS) -> list[LiveWorker]:
    """Every worker whose beat is younger than LEASE_TTL, with what it runs now."""
    ttl = timedelta(seconds=conf.get().LEASE_TTL)
    rows = list(
        WorkerProcess.objects.using(using).filter(beat_at__gte=Now() - ttl).order_by("host", "pid")
    )
    running: dict[str, dict[str, int]] = {row.identity: {} for row in rows}
    if rows:
        held = (
            Job.objects.using(using)
            .filter(status=Status.RUNNING.value, lease_owner__isnull=False)
            .values_list("lease_owner", "kind")
        )
        for owner, kind in held:
            if owner is None:  # excluded by the filter; the type says it may be
                continue
            identity = owner.split("/", 1)[0]  # a slot's owner is identity/slot, then :job id
            if identity in running:
                running[identity][kind] = running[identity].get(kind, 0) + 1
    return [
        LiveWorker(
            identity=row.identity,
            host=row.host,
            pid=row.pid,
            version=row.version,
            queues=list(row.queues),
            kinds=list(row.kinds),
            slots=row.slots,
            execution=row.execution,
            started_at=row.started_at,
            beat_at=row.beat_at,
            running=running[row.identity],
        )
        for row in rows
    ]


def who_serves(job: Job, workers: list[LiveWorker]) -> str | None:
    """Why no live worker would claim ``job`` (its queue or its kind), or None when one would."""
    if not workers:
        return "No live worker is running (none has beaten within LEASE_TTL): start durable_worker."
    serving = [w for w in workers if job.queue_name in w.queues]
    if not serving:
        queues = sorted({q for w in workers for q in w.queues})
        return (
            f"No live worker serves queue {job.queue_name!r}; workers serve "
            + ", ".join(repr(q) for q in queues)
            + "."
        )
    if not any(job.kind in w.kinds for w in serving):
        return (
            f"No live worker serving {job.queue_name!r} can run kind {job.kind!r} (it is not "
            "registered in any of them: an older deploy?); it waits, uncharged, for one that can."
        )
    return None
