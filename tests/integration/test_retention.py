"""Retention as the reconciler runs it (issue 14): batches until none is full or the pass's
share of RECONCILE_INTERVAL is spent, so it keeps up with thousands of jobs per second
instead of stopping at a fixed row count per pass."""

from __future__ import annotations

import pytest
from django.db import connection

from durable_jobs.models import Job
from durable_jobs.runtime import reconciler as reconciler_module
from durable_jobs.runtime.reconciler import PassReport, Reconciler
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

DAY = 24 * 3600

OLD_FINISHED = """
INSERT INTO durable_jobs_job (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                              started_at, finished_at, domain_mirrored_at)
SELECT gen_random_uuid(), 'default', 'demo.noop', 'completed', t, t, 'default', t, t, t
  FROM (SELECT now() - interval '40 days' - n * interval '1 second' AS t
          FROM generate_series(1, %s) AS n) AS rows
"""


def _old_finished(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(OLD_FINISHED, [n])


def test_one_pass_deletes_past_the_old_cap_and_keeps_parked_and_young_jobs(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "RETENTION": 30 * DAY}
    _old_finished(12_500)  # the old pass stopped at 10 x 1,000 rows
    parked = [
        JobFactory(
            status="failed",
            next_run_at=None,
            finished_at=-40 * DAY,
            parked_at=-40 * DAY,
            error_code="poison",
        )
        for _ in range(2)
    ]
    young = [JobFactory(status="completed", next_run_at=None, finished_at=-DAY) for _ in range(2)]
    live = JobFactory(status="pending")
    report = PassReport()
    Reconciler().apply_retention(report)
    assert report.deleted == 12_500
    assert set(Job.objects.values_list("id", flat=True)) == {j.id for j in (*parked, *young, live)}


def test_a_pass_stops_at_its_share_of_the_interval_and_the_next_pass_goes_on(settings, monkeypatch):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "RETENTION": 30 * DAY}
    monkeypatch.setattr(reconciler_module, "RETENTION_BATCH", 10)
    monkeypatch.setattr(reconciler_module, "RETENTION_SHARE", 0.0)  # spent after the first batch
    _old_finished(35)
    first = PassReport()
    Reconciler().apply_retention(first)
    assert first.deleted == 10, "one full batch, then the budget is spent"
    passes = [first.deleted]
    while Job.objects.exists():
        report = PassReport()
        Reconciler().apply_retention(report)
        passes.append(report.deleted)
    assert passes == [10, 10, 10, 5]
