"""The attempt rows behind TaskResult.attempts and .errors: written only under the lease,
never for ordinary jobs, and gone with their job."""

from __future__ import annotations

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import store, testing
from durable_jobs.models import TaskAttempt
from durable_jobs.states import Lease
from testproject.demo import tasks
from tests.factories import running

pytestmark = pytest.mark.django_db


def lease_of(job, **changes) -> Lease:
    fields = {
        "job_id": job.id,
        "owner": job.lease_owner,
        "epoch": job.lease_epoch,
        "ttl_ms": 60_000,
        **changes,
    }
    return Lease(**fields)


def test_begin_and_end__record_one_attempt_per_claim():
    job = running(kind="django.tasks", lease_owner="worker-a:x", lease_epoch=4)
    assert store.begin_task_attempt(lease_of(job), "worker-a") is not None
    assert store.begin_task_attempt(lease_of(job), "worker-a") is not None, (
        "the same claim again: same row"
    )
    assert store.end_task_attempt(
        lease_of(job), exception_class_path="builtins.KeyError", traceback="tb"
    )
    assert not store.end_task_attempt(lease_of(job)), "an attempt ends once"
    [attempt] = TaskAttempt.objects.filter(job_id=job.id)
    assert (attempt.epoch, attempt.worker_id, attempt.exception_class_path, attempt.traceback) == (
        4,
        "worker-a",
        "builtins.KeyError",
        "tb",
    )
    assert attempt.finished_at >= attempt.started_at


@pytest.mark.parametrize("stale", [{"epoch": 3}, {"owner": "worker-b"}])
def test_begin_and_end__write_nothing_without_the_lease(stale):
    job = running(kind="django.tasks", lease_epoch=4)
    assert store.begin_task_attempt(lease_of(job, **stale), "w") is None
    assert not TaskAttempt.objects.filter(job_id=job.id).exists()
    assert store.begin_task_attempt(lease_of(job), "w") is not None
    assert not store.end_task_attempt(
        lease_of(job, **stale), exception_class_path="x.Y", traceback="t"
    )
    assert TaskAttempt.objects.get(job_id=job.id).finished_at is None


def test_ordinary_jobs__write_no_attempt_rows():
    durable.start("demo.sleep", input={"seconds": 0})
    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    assert not TaskAttempt.objects.exists()


def test_attempts__go_with_their_job():
    result = tasks.explode.enqueue("x")
    testing.run_jobs()
    assert TaskAttempt.objects.filter(job_id=result.id).count() == 1
    with connection.cursor() as cursor:  # what retention's bulk DELETE does
        cursor.execute("DELETE FROM durable_jobs_job WHERE id = %s", [result.id])
    assert not TaskAttempt.objects.filter(job_id=result.id).exists()


def test_attempt_rows__refuse_orm_writes():
    from durable_jobs.models import ReadOnlyJobRow

    with pytest.raises(ReadOnlyJobRow):
        TaskAttempt.objects.create(
            job_id=running().id, epoch=1, worker_id="w", started_at="2026-01-01T00:00Z"
        )
