"""durable_jobs.testing: run handlers in-process inside a test's transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable_jobs as durable
from durable_jobs import store, testing
from durable_jobs.limits import claims
from testproject.demo.models import Effect, Report
from tests.factories import reload

pytestmark = pytest.mark.django_db


def test_run_jobs_runs_every_slice_until_idle():
    report = Report.objects.create(name="t")
    job = durable.start("demo.import", input={"rows": 5, "batch": 2}, subject=report)
    reports = testing.run_jobs()
    assert [r.outcome for r in reports] == ["completed"]
    assert reload(job).status == "completed"
    assert Effect.objects.filter(job_id=job.id).count() == 5
    report.refresh_from_db()
    assert report.status == "completed"


def test_fast_forward_runs_retries_and_scheduled_jobs_to_their_end(settings):
    # A minute's backoff: on a slow machine the default first retry (1-2 s) could come due
    # while run_jobs still runs, and this test is about what is not due.
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "RETRY_BACKOFF_BASE": 60.0,
        "RETRY_BACKOFF_MAX": 120.0,
    }
    flaky = durable.start("demo.flaky", input={"failures": 2})
    later = durable.start("demo.flaky", input={"failures": 0}, run_after=timedelta(hours=1))
    assert [r.outcome for r in testing.run_jobs()] == ["retrying"], (
        "the retry and the later job are not due"
    )
    outcomes = [r.outcome for r in testing.run_jobs(fast_forward=True)]
    assert outcomes.count("completed") == 2
    assert reload(flaky).result == {"attempts": 3} and reload(later).status == "completed"


def test_fast_forward_passes_over_a_due_job_it_cannot_claim_to_reach_the_scheduled_ones():
    """A due job its key's limit keeps from being claimed (two permits held by another
    worker) must not end the fast-forward: the job scheduled after it still runs."""
    for _ in range(2):
        durable.start("demo.limited", input={"account": 1, "seconds": 0})
    held = store.dequeue(
        ["default"], "another-worker", 60_000, kinds=None, limit=2, flow=claims.claim_settings()
    )
    assert len(held) == 2
    blocked = durable.start("demo.limited", input={"account": 1, "seconds": 0})
    later = durable.start("demo.brief", input={"seconds": 0}, run_after=timedelta(hours=1))

    assert [r.outcome for r in testing.run_jobs(fast_forward=True)] == ["completed"]
    assert reload(later).status == "completed"
    assert reload(blocked).lease_owner is None, "still waiting for a permit"


def test_max_slices_and_assert_started():
    durable.start("demo.import", input={"rows": 1})
    assert len(testing.run_jobs(max_slices=0)) == 0
    testing.assert_started("demo.import", input={"rows": 1}, count=1)
    with pytest.raises(AssertionError, match="no 'demo.flaky' job"):
        testing.assert_started("demo.flaky")


def test_fast_forward_one_job():
    job = durable.start("demo.flaky", input={"failures": 0}, run_after=timedelta(days=1))
    assert testing.run_jobs() == []
    testing.fast_forward(job)
    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
