"""The scoped reads of job rows behind ``durable.get()`` and ``durable.list_jobs()``.

Reads only: every statement that writes a job row is in ``store``. Each read by id
carries the scope predicate (``store.SCOPE``), so tenant A's job is simply absent to
tenant B (invariant 10); ``get_job_unscoped`` is for the worker, the reconciler and the
testing helpers, which act system-wide.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import QuerySet

from durable_jobs.db import JOB_COLUMNS as COLUMNS
from durable_jobs.db import execute, fetch_job, fetch_jobs, fetch_value, job_from_row
from durable_jobs.models import TABLE, Job
from durable_jobs.states import Scope
from durable_jobs.store import QUEUE_NOT_PAUSED, SCOPE, scope_params

GET_JOB_ANY_SCOPE = f"SELECT {COLUMNS} FROM {TABLE} WHERE id = %(id)s"


def get_job_unscoped(job_id: object, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Return a job by id alone: for the worker and reconciler, which act system-wide."""
    return fetch_job(using, GET_JOB_ANY_SCOPE, {"id": job_id})


MAX_PAGE_SIZE = 200


ENDED_AT_EPOCH = f"""
SELECT id FROM {TABLE}
 WHERE id = ANY(%(ids)s::uuid[]) AND status = %(status)s AND lease_epoch = %(epoch)s
"""


def ended_at_epoch(
    leases: list[tuple[object, int]], status: str, *, using: str = DEFAULT_DB_ALIAS
) -> set[Any]:
    """Return the ids, of ``(job id, epoch)`` pairs, whose job ended ``status`` at that epoch.

    For a terminal write retried after its connection was cut: its first try may have
    committed with the reply lost. The terminal statements keep the epoch, and any other
    hand that ends a running job first takes it over (a new epoch), so a row ended
    ``status`` at the writer's own epoch is the writer's own landed write.
    """
    found: set[Any] = set()
    for epoch in {epoch for _, epoch in leases}:
        ids = [str(job_id) for job_id, at in leases if at == epoch]
        with execute(using, ENDED_AT_EPOCH, {"ids": ids, "status": status, "epoch": epoch}) as cur:
            found.update(row[0] for row in cur)
    return found


def list_jobs(
    scope: Scope,
    *,
    kind: str | None = None,
    status: str | None = None,
    subject: tuple[str, str] | None = None,
    page: int = 1,
    page_size: int = 20,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[list[Job], int]:
    """Return one page of the scope's jobs, newest first, and the total matching count."""
    page = max(1, int(page))
    page_size = min(MAX_PAGE_SIZE, max(1, int(page_size)))
    where = [SCOPE]
    params: dict[str, Any] = scope_params(scope)
    if kind is not None:
        where.append("kind = %(kind)s")
        params["kind"] = kind
    if status is not None:
        where.append("status = %(status)s")
        params["status"] = status
    if subject is not None:
        where.append("subject_type = %(subject_type)s AND subject_id = %(subject_id)s")
        params["subject_type"], params["subject_id"] = subject
    clause = " AND ".join(where)
    total = fetch_value(using, LIST_COUNT.format(clause=clause), params)
    offset = (page - 1) * page_size
    params.update(limit=page_size, offset=offset, reach=offset + page_size)
    jobs = fetch_jobs(using, LIST_PAGE.format(clause=clause), params)
    return jobs, int(total or 0)


# The tenant's newest-first index leaves running rows out (migration 0017), so a scope
# alone implies no predicate of it: each statement reads the rows not running through it
# and the few running ones apart (models.newest_first, in SQL). Each part of the page is
# cut at the page's end on its own, so the index walk stops there whatever the planner
# makes of the merge.
LIST_COUNT = f"""
SELECT (SELECT count(*) FROM {TABLE} WHERE {{clause}} AND status <> 'running')
     + (SELECT count(*) FROM {TABLE} WHERE {{clause}} AND status = 'running')
"""
LIST_PAGE = f"""
(SELECT {COLUMNS} FROM {TABLE} WHERE {{clause}} AND status <> 'running'
  ORDER BY created_at DESC, id DESC LIMIT %(reach)s)
UNION ALL
(SELECT {COLUMNS} FROM {TABLE} WHERE {{clause}} AND status = 'running'
  ORDER BY created_at DESC, id DESC LIMIT %(reach)s)
ORDER BY created_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
"""


#: A job waiting out a backoff: a failed slice waiting for its retry (running, its lease
#: released) or a re-driven one held back by the re-drive backoff; not a wait condition's
#: hold and not a start scheduled with run_after; not on a paused queue (invariant 27:
#: nothing would claim it, so a burst run must not wait for it). ``slack_ms``: a broker
#: queue's retry is still on its way a moment past its run time (its delay rounded up, a
#: read cycle).
WAITING_OUT_A_BACKOFF = f"""
SELECT count(*), extract(epoch FROM min(next_run_at) - clock_timestamp())
  FROM {TABLE}
 WHERE queue_name = ANY(%(queues)s::text[]) AND kind = ANY(%(kinds)s::text[])
   AND status IN ('pending', 'running') AND lease_owner IS NULL
   AND next_run_at > clock_timestamp() - (%(slack_ms)s::bigint * interval '1 millisecond')
   AND held_since IS NULL
   AND (status = 'running' OR redrives_since_commit > 0 OR consecutive_failures > 0)
   AND {QUEUE_NOT_PAUSED}
"""


def waiting_out_a_backoff(
    queues: list[str], kinds: list[str], *, slack_ms: int = 0, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, float | None]:
    """How many jobs of ``kinds`` in ``queues`` wait out a retry backoff, and in how many
    seconds the first is due (None when none waits)."""
    params = {"queues": queues, "kinds": kinds, "slack_ms": slack_ms}
    with execute(using, WAITING_OUT_A_BACKOFF, params) as cursor:
        count, seconds = cursor.fetchone()
    return int(count), (None if seconds is None else float(seconds))


# A row a worker just ended a slice of, if it now awaits a new delivery (a yield, a
# failed slice's retry, a hold, a lease handed back), with how far ahead it is due by the
# database's clock: what a broker transport publishes next (invariant 31).
AWAITING_DELIVERY = f"""
SELECT {COLUMNS}, greatest(0, (extract(epoch FROM next_run_at - clock_timestamp()) * 1000))::bigint
  FROM {TABLE}
 WHERE id = %(id)s AND status IN ('pending', 'running') AND lease_owner IS NULL
   AND next_run_at IS NOT NULL AND cancel_requested_at IS NULL
"""


def awaiting_delivery(job_id: object, *, using: str = DEFAULT_DB_ALIAS) -> tuple[Job, int] | None:
    """The job and its delay in milliseconds when it awaits a delivery; None otherwise."""
    with execute(using, AWAITING_DELIVERY, {"id": job_id}) as cursor:
        row = cursor.fetchone()
    if row is None:
        return None
    return job_from_row(row[:-1], using), int(row[-1])


def children_of(
    parent_id: uuid.UUID, scope: Scope, *, using: str = DEFAULT_DB_ALIAS
) -> QuerySet[Job]:
    """The jobs ``parent_id`` spawned, in its scope only (invariant 10), in spawn-key order."""
    return (
        Job.objects.using(using)
        .filter(parent_id=parent_id, tenant_id=scope.tenant, organization_id=scope.organization)
        .order_by("spawn_key")
    )
