"""Build job rows in any state, directly, so tests never sleep to make a row stale.

These write with raw SQL on purpose: they fabricate states (an expired lease, a job
parked an hour ago) that the store would only reach through time. Tests may do this;
the library may not (invariant 1).
"""

from __future__ import annotations

import uuid

import factory
from django.db import connection

from durable_jobs import conf, db, reads, store
from durable_jobs.models import Job

_TIME_COLUMNS = {
    "lease_expires_at",
    "heartbeat_at",
    "next_run_at",
    "pending_since",
    "started_at",
    "finished_at",
    "parked_at",
    "cancel_requested_at",
    "last_committed_at",
    "held_since",
    "wait_satisfied_at",
}


class JobFactory(factory.Factory):
    """``JobFactory(status="running", lease_owner="w", lease_epoch=3, lease_expires_at=-60)``.

    A time column given as a number means "that many seconds from the database's now"
    (negative is the past), so every stamp comes from the database clock.
    """

    class Meta:
        model = Job

    id = factory.LazyFunction(uuid.uuid4)
    tenant_id = "default"
    organization_id = None
    kind = "tests.noop"
    status = "pending"
    queue_name = "default"
    priority = 0
    next_run_at = 0
    pending_since = 0

    @classmethod
    def _create(cls, model_class, **fields):
        for name in ("input", "checkpoint", "meta", "result", "wait_for"):
            if name in fields:
                fields[name] = db.dump_json(fields[name])
        columns, values, params = [], [], {}
        for name, value in fields.items():
            columns.append(name)
            if name in _TIME_COLUMNS and isinstance(value, (int, float)):
                values.append(f"clock_timestamp() + %({name})s * interval '1 second'")
            elif name in ("input", "checkpoint", "meta", "result", "wait_for"):
                values.append(f"%({name})s::jsonb")
            else:
                values.append(f"%({name})s")
            params[name] = value
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO durable_jobs_job ({', '.join(columns)}, created_at, updated_at) "
                f"VALUES ({', '.join(values)}, now(), now())",
                params,
            )
        return reads.get_job_unscoped(fields["id"])


def running(**fields) -> Job:
    """A job under a live claim (lease valid for a minute unless told otherwise)."""
    defaults = dict(
        status="running",
        lease_owner="worker-a",
        lease_epoch=1,
        lease_expires_at=60,
        heartbeat_at=0,
        next_run_at=None,
        pending_since=None,
        started_at=0,
    )
    defaults.update(fields)
    return JobFactory(**defaults)


def shift(job_id, column: str, seconds: float) -> None:
    """Move a time column of a row by ``seconds`` (negative: into the past)."""
    assert column in _TIME_COLUMNS
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE durable_jobs_job SET {column} = {column} + %s * interval '1 second'"
            " WHERE id = %s",
            [seconds, job_id],
        )


def reload(job: Job | uuid.UUID) -> Job:
    return reads.get_job_unscoped(getattr(job, "id", job))


def live_worker(
    identity: str = "host:1:abcdef",
    *,
    queues: tuple[str, ...] = ("default",),
    kinds: tuple[str, ...] = (),
    slots: int = 1,
) -> str:
    """Register a live worker process (as a worker's registration thread would); its identity."""
    store.register_worker(
        identity,
        host=identity.split(":", 1)[0],
        pid=int(identity.split(":")[1]),
        version="0.1.0",
        queues=list(queues),
        kinds=list(kinds),
        slots=slots,
        execution="process",
        ttl_ms=conf.ms(conf.get().LEASE_TTL),  # what a worker prunes dead rows by
    )
    return identity
