"""Issue 9 item 4: `manage.py durable_worker` alone recovers a crashed worker's jobs.

Two workers started the plain way (no reconcile flag, no separate reconciler). The one
running a long job, which also leads the reconciler, is SIGKILLed mid-job; its leader
lease expires, the other worker takes leadership, re-drives the orphan and finishes it
from its checkpoint. No third process.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection
from django.db.models import Count

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Effect, Report
from tests.acceptance.harness import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = {"DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"}
ROWS = 24  # 7 s of work: time for a second worker to start beside it on a slow machine
TAKEN = "reconciler leadership reconciler taken"


def leader() -> tuple[str | None, int | None]:
    """The reconciler leader's owner and epoch (the owner is the worker's host:pid:token)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT owner, epoch FROM durable_jobs_leader WHERE name = 'reconciler'")
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (None, None)


def pid_of(owner: str | None) -> int | None:
    return int(owner.split(":")[1]) if owner else None


def test_two_plain_workers__the_survivor_resumes_the_job_of_the_one_killed_mid_job(processes):
    first = processes.worker(app_name="durable-test-first", env=FAST)
    wait_until(
        lambda: pid_of(leader()[0]) == first.pid, message="the first worker to lead the reconciler"
    )

    report = Report.objects.create(name="long")
    job = durable.start(
        "demo.import", input={"rows": ROWS, "batch": 1, "delay": 0.3}, subject=report
    )
    wait_until(
        lambda: Job.objects.get(id=job.id).processed_count >= 2, message="the job to be under way"
    )
    assert pid_of(Job.objects.get(id=job.id).lease_owner) == first.pid

    second = processes.worker(app_name="durable-test-second", env=FAST)
    wait_until(lambda: "starting" in second.output(), message="the second worker to start")
    time.sleep(1.5)  # five reconcile intervals: the second tries for leadership and is refused
    assert pid_of(leader()[0]) == first.pid, "one leader at a time"
    assert TAKEN not in second.output(), "the second worker runs no pass while the first leads"
    assert Job.objects.get(id=job.id).status == "running"

    first.signal(signal.SIGKILL)
    first.wait()
    wait_until(
        lambda: Job.objects.get(id=job.id).status == "completed",
        timeout=60,
        message="the survivor to finish the job",
    )

    owner, epoch = leader()
    assert pid_of(owner) == second.pid and epoch == 2, "leadership moved to the survivor"
    assert TAKEN in second.output()
    done = Job.objects.get(id=job.id)
    assert done.redrives == 1, "re-driven once, by the survivor's reconciler"
    assert done.processed_count == ROWS and done.domain_mirrored_at is not None
    assert Report.objects.get(pk=report.pk).status == "completed", "the mirror told the subject"
    effects = Effect.objects.filter(job_id=job.id)
    assert effects.count() == ROWS
    assert not effects.values("item").annotate(n=Count("id")).filter(n__gt=1).exists(), (
        "no item written twice"
    )
    assert effects.values("epoch").distinct().count() == 2, (
        "resumed from the checkpoint under a new lease"
    )

    second.signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0
    assert leader() == (None, 2), "a worker that stops gracefully resigns at once"
