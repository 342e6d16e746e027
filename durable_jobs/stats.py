"""Read-only figures for operators: the ``durable_jobs stats`` command and the admin."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Min, Q
from django.db.models.functions import Now

from durable_jobs import store
from durable_jobs.models import Job
from durable_jobs.states import Scope

WINDOWS = (1, 5, 15)  # minutes, for throughput


def collect(*, tenant: str | None = None, scope: Scope | None = None,
            using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """Counts by kind and status, the pending backlog's age, expired leases, parked jobs, throughput.

    ``scope`` counts that scope's jobs only (a None organization is tenant-wide, as
    everywhere); ``tenant`` counts a whole tenant; neither counts every job. Every age is
    measured on the database's clock.
    """
    jobs = Job.objects.using(using)
    if tenant is not None:
        jobs = jobs.filter(tenant_id=tenant)
    if scope is not None:
        jobs = jobs.filter(tenant_id=scope.tenant)
        jobs = jobs.filter(organization_id=scope.organization) if scope.organization is not None \
            else jobs.filter(organization_id__isnull=True)
    now = store.database_now(using=using)
    by_kind: dict[str, dict[str, int]] = {}
    for row in jobs.values("kind", "status").annotate(n=Count("id")).order_by("kind", "status"):
        by_kind.setdefault(row["kind"], {})[row["status"]] = row["n"]
    oldest = jobs.filter(status="pending").aggregate(at=Min("pending_since"))["at"]
    parked = {
        row["error_code"]: row["n"]
        for row in jobs.filter(status="failed", parked_at__isnull=False).values("error_code").annotate(n=Count("id"))
    }
    throughput = {}
    for minutes in WINDOWS:
        since = Now() - timedelta(minutes=minutes)
        finished = jobs.filter(finished_at__gte=since).aggregate(
            completed=Count("id", filter=Q(status="completed")),
            failed=Count("id", filter=Q(status="failed")),
            cancelled=Count("id", filter=Q(status="cancelled")),
        )
        throughput[f"{minutes}m"] = finished
    return {
        "database_time": now.isoformat(),
        "by_kind": by_kind,
        "pending": jobs.filter(status="pending").count(),
        "oldest_pending_seconds": round((now - oldest).total_seconds(), 1) if oldest else None,
        "running": jobs.filter(status="running").count(),
        "running_expired_leases": jobs.filter(
            status="running", lease_owner__isnull=False, lease_expires_at__lt=Now()
        ).count(),
        "retrying": jobs.filter(status="running", lease_owner__isnull=True).count(),
        # Held by a wait condition (a subset of pending): read off durable_jobs_held.
        "held": jobs.held().count(),
        "parked_by_reason": parked,
        "finished_last": throughput,
    }
