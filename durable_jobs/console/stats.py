"""Read-only figures for operators: the ``durable_jobs stats`` command and the admin."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Case, Count, F, QuerySet, Value, When

from durable_jobs import conf, store
from durable_jobs.console import live as console
from durable_jobs.console import queries, workers
from durable_jobs.limits import claims
from durable_jobs.models import Job
from durable_jobs.states import Scope
from durable_jobs.transports import publishing

WINDOWS = (1, 5, 15)  # minutes, for throughput


#: Below this many rows (the planner's estimate of the whole table) every count is exact;
#: above it, finished jobs are counted from the planner's statistics instead of read. The
#: exact count reads the whole table: 50-140 ms at 85,000 rows on a loaded 2-core machine
#: (benchmarks/scale_bench.py), so about a tenth of that here. Up to 30,000 rows ANALYZE's
#: sample is the whole table: just past the threshold the estimate is the count as of the
#: last ANALYZE.
EXACT_BELOW = 10_000


def collect(
    *, tenant: str | None = None, scope: Scope | None = None, using: str = DEFAULT_DB_ALIAS
) -> dict[str, Any]:
    """Counts by kind and status, the pending backlog's age, expired leases, parked jobs, rates.

    Statuses are as the console shows them: a ``running`` row without a lease is
    ``waiting`` (queries.SHOWN_STATUS), so monitors never count it as running.

    ``scope`` counts that scope's jobs only (a None organization is tenant-wide, as
    everywhere); ``tenant`` counts a whole tenant; neither counts every job. Every age is
    measured on the database's clock.

    The cost follows the live backlog, not the history: pending, running and parked jobs
    are counted exactly through partial indexes; finished jobs are counted exactly only
    while the table is small (EXACT_BELOW), and beyond that estimated from ANALYZE's joint
    (kind, status) statistics (``"estimated": true`` in the answer).
    """
    jobs = Job.objects.using(using)
    if tenant is not None:
        jobs = jobs.filter(tenant_id=tenant)
    if scope is not None:
        jobs = jobs.filter(tenant_id=scope.tenant)
        jobs = (
            jobs.filter(organization_id=scope.organization)
            if scope.organization is not None
            else jobs.filter(organization_id__isnull=True)
        )
    table_rows, _ = console.estimate_count(Job.objects.using(using), exact_below=0)
    estimated = table_rows >= EXACT_BELOW
    by_kind: dict[str, dict[str, int]] = {}
    if estimated:
        for kind, status, n in queries.live_counts(tenant=tenant, scope=scope, using=using):
            by_kind.setdefault(kind, {})[status] = n
        _add_finished_estimates(
            by_kind, jobs, table_rows, whole_table=tenant is None and scope is None, using=using
        )
        by_kind = {kind: dict(sorted(counts.items())) for kind, counts in sorted(by_kind.items())}
    else:
        shown = jobs.annotate(
            shown=Case(
                When(status="running", lease_owner__isnull=True, then=Value("waiting")),
                default=F("status"),
            )
        )
        for row in shown.values("kind", "shown").annotate(n=Count("id")).order_by("kind", "shown"):
            by_kind.setdefault(row["kind"], {})[row["shown"]] = row["n"]
    # The clock, the backlog's figures, held jobs and the throughput windows: one statement.
    figures = queries.stats_figures(WINDOWS, tenant=tenant, scope=scope, using=using)
    parked = queries.parked_counts(tenant=tenant, scope=scope, using=using)
    now, oldest = figures["now"], figures["oldest_pending"]
    throughput = {f"{minutes}m": counts for minutes, counts in figures["finished"].items()}
    live = {status: 0 for status in ("pending", "waiting", "running")}
    for counts in by_kind.values():
        for status in live:
            live[status] += counts.get(status, 0)
    # Kinds with live jobs that no live worker can run (invariant 14b: they wait, uncharged).
    known = {kind for worker in workers.live_workers(using=using) for kind in worker.kinds}
    unserved = {
        kind: counts.get("pending", 0) + counts.get("waiting", 0)
        for kind, counts in by_kind.items()
        if kind != "*" and kind not in known and counts.get("pending", 0) + counts.get("waiting", 0)
    }
    return {
        "database_time": now.isoformat(),
        "estimated": estimated,
        "by_kind": by_kind,
        "pending": live["pending"],
        "oldest_pending_seconds": round((now - oldest).total_seconds(), 1) if oldest else None,
        # Holding a live lease. A running row without one is "waiting" (handed back
        # unstarted, or a failed slice waiting out its retry backoff), never counted here.
        "running": live["running"],
        "waiting": live["waiting"],
        "running_expired_leases": figures["expired"],
        # The waiting rows whose failed slice waits out its backoff (a subset of waiting).
        "retrying": figures["retrying"],
        # Kinds with pending or waiting jobs that no live worker can run, and how many.
        "unserved_kinds": unserved,
        # Held by a wait condition (a subset of pending): read off durable_jobs_held.
        "held": figures["held"],
        "parked_by_reason": parked,
        # Invariant 27: queues no worker claims from until an operator resumes them.
        "paused_queues": {
            pause.queue: {
                "paused_at": pause.paused_at.isoformat(),
                "paused_by": pause.paused_by,
                "reason": pause.reason,
            }
            for pause in store.list_paused_queues(using=using)
        },
        # Invariant 26: every flow key's limits in force and its occupancy.
        "flow_keys": {
            key.key: {
                "running": key.running,
                "concurrency": key.concurrency,
                "recent_starts": key.recent_starts,
                "rate": key.rate,
                "waiting": key.waiting,
            }
            for key in store.list_flow_keys(flow=claims.claim_settings(), using=using)
        },
        # The oldest open transaction in the database (queries.OLDEST_TRANSACTION): one
        # that lasts minutes pins what vacuum may remove, and every claim slows down.
        "oldest_transaction": figures["oldest_transaction"],
        "finished_last": throughput,
        # Windows past queries.FINISHED_SAMPLE rows are the newest rows' rate, not a count.
        "finished_last_estimated": [f"{minutes}m" for minutes in figures["finished_estimated"]],
        # Each broker queue's health (docs/transports.rst); empty when every queue is on
        # the database, and then no broker is asked anything.
        "transports": [dataclasses.asdict(found) for found in publishing.health()],
    }


FINISHED = ("completed", "failed", "cancelled")

#: An open transaction older than this is named as pinning the horizon: at a thousand jobs
#: a second, a minute leaves some 120,000 dead row versions for every claim to step over
#: (docs/performance.rst, "A pinned horizon").
PINNED_AFTER_SECONDS = 60.0


def describe_oldest_transaction(found: dict[str, Any] | None) -> str:
    """One line on the oldest open transaction, saying so when it pins the horizon."""
    if not found:
        return "oldest open transaction: none"
    line = (
        f"oldest open transaction: {float(found['age_seconds']):.1f}s "
        f"(pid {found['pid']}, {found['application_name'] or '-'}, {found['state'] or '-'})"
    )
    if float(found["age_seconds"]) >= PINNED_AFTER_SECONDS:
        line += (
            " - it pins the horizon: no dead job row can be vacuumed and the job table grows"
            " until it ends"
        )
    return line


def _add_finished_estimates(
    by_kind: dict[str, dict[str, int]],
    jobs: QuerySet[Job],
    table_rows: int,
    *,
    whole_table: bool,
    using: str,
) -> None:
    """Add estimated counts of finished jobs: by kind from the joint statistics when they
    cover the whole table, else per status under the kind ``"*"`` (the planner's estimate)."""
    frequencies = queries.kind_status_frequencies(using=using) if whole_table else []
    finished = [(kind, status, share) for kind, status, share in frequencies if status in FINISHED]
    if finished:
        for kind, status, share in finished:
            by_kind.setdefault(kind, {})[status] = round(share * table_rows)
        return
    for status in FINISHED:
        n, _ = console.estimate_count(jobs.filter(status=status), exact_below=0)
        if n > 1:  # the planner never estimates fewer than one row: 1 means "none seen"
            by_kind.setdefault("*", {})[status] = n


def queues(*, using: str = DEFAULT_DB_ALIAS) -> list[dict[str, Any]]:
    """Every known queue, with its pause (invariant 27) and its backlog, by name.

    Known: the declared ``QUEUES`` (or the default queue), the queues live workers serve,
    those with jobs waiting to be claimed, and the paused ones. ``backlog`` counts the
    jobs a claim could take (pending, handed back or waiting out a retry), ``due`` those
    whose run time has come; a paused queue's backlog grows until it is resumed.
    """
    settings = conf.get()
    backlogs = queries.queue_backlogs(using=using)
    paused = {pause.queue: pause for pause in store.list_paused_queues(using=using)}
    served = {queue for worker in workers.live_workers(using=using) for queue in worker.queues}
    names = set(settings.QUEUES or (settings.DEFAULT_QUEUE,)) | served | set(backlogs) | set(paused)
    answer = []
    for name in sorted(names):
        pause = paused.get(name)
        backlog, due = backlogs.get(name, (0, 0))
        answer.append(
            {
                "queue": name,
                "paused": pause is not None,
                "paused_at": None if pause is None else pause.paused_at.isoformat(),
                "paused_by": None if pause is None else pause.paused_by,
                "reason": None if pause is None else pause.reason,
                "backlog": backlog,
                "due": due,
                "served_by_a_live_worker": name in served,
            }
        )
    return answer
