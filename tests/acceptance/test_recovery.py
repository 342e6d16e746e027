"""Issue 4's promise: kill every worker mid-workload; a fresh worker with a reconciler
finishes everything, each job once, and `durable_jobs stats` shows it."""

from __future__ import annotations

import io
import json
import signal

import pytest
from django.core.management import call_command
from django.db.models import Count

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Effect
from tests.acceptance.harness import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST_RECONCILE = {
    "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3",
    "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "3",
}


def test_sigkill_every_worker_mid_workload_then_recover(processes):
    imports = [
        durable.start("demo.import", input={"rows": 8, "batch": 1, "delay": 0.15}) for _ in range(6)
    ]
    flaky = [durable.start("demo.flaky", input={"failures": 1}) for _ in range(3)]
    doomed = [durable.start("demo.always_fails") for _ in range(2)]
    sleepers = [durable.start("demo.sleep", input={"seconds": 0.5}) for _ in range(3)]
    everything = imports + flaky + doomed + sleepers

    first = [
        processes.worker(
            "--concurrency", "3", app_name=f"durable-test-doomed-{n}", env=FAST_RECONCILE
        )
        for n in range(2)
    ]
    wait_until(
        lambda: (
            Job.objects.filter(id__in=[j.id for j in imports], processed_count__gte=2).count() >= 3
        ),
        message="the imports to be under way",
    )
    for worker in first:
        worker.signal(signal.SIGKILL)
    for worker in first:
        worker.wait()
    assert Job.objects.filter(status="running", lease_owner__isnull=False).exists(), (
        "the kill left orphans"
    )

    survivor = processes.worker(
        "--concurrency", "3", "--reconcile", app_name="durable-test-survivor", env=FAST_RECONCILE
    )
    wait_until(
        lambda: (
            not Job.objects.filter(
                id__in=[j.id for j in everything], status__in=["pending", "running"]
            ).exists()
        ),
        timeout=90,
        message="every job to finish",
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0

    final = {job.id: job for job in Job.objects.filter(id__in=[j.id for j in everything])}
    for job in imports + flaky + sleepers:
        assert final[job.id].status == "completed", (final[job.id].kind, final[job.id].error_code)
        assert final[job.id].domain_mirrored_at is not None
    for job in doomed:
        assert (final[job.id].status, final[job.id].error_code) == ("failed", "retry_exhausted")
    duplicates = (
        Effect.objects.filter(job_id__in=[j.id for j in imports])
        .values("job_id", "item")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not duplicates.exists(), f"an effect was written twice: {list(duplicates)}"
    assert Effect.objects.filter(job_id__in=[j.id for j in imports]).count() == 6 * 8
    assert any(final[j.id].redrives >= 1 for j in imports), "the reconciler re-drove the orphans"

    out = io.StringIO()
    call_command("durable_jobs", "stats", "--json", stdout=out)
    stats = json.loads(out.getvalue())
    assert stats["pending"] == 0 and stats["running"] == 0
    assert stats["by_kind"]["demo.import"] == {"completed": 6}
    assert stats["by_kind"]["demo.always_fails"] == {"failed": 2}
