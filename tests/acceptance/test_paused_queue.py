"""Invariant 27 across processes: two real worker processes (process execution) and an
operator's ``manage.py durable_jobs pause`` from a third. A long job's running slice ends
as it would have, nothing it wrote is lost or written twice, nothing is charged, no worker
claims from the paused queue while the other queue is served, and after the resume the
job runs to its end."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

import durable_jobs as durable
from testproject.demo.models import Effect
from tests.acceptance.harness import wait_until
from tests.factories import reload

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

ROWS = 60


def done_rows(job) -> int:
    return (reload(job).checkpoint or {}).get("next", 0)


def test_two_workers_honour_a_pause_and_a_resume_from_the_command_line(processes):
    job = durable.start(
        "demo.import", input={"rows": ROWS, "batch": 1, "delay": 0.05}, queue="slow"
    )
    env = {"DURABLE_JOBS_SLICE_BUDGET": "0.25", "DURABLE_JOBS_POLL_INTERVAL": "0.2"}
    for n in (1, 2):
        processes.worker("--queues", "slow,default", app_name=f"durable-pause-{n}", env=env)
    wait_until(lambda: done_rows(job) >= 8, message="the job to run a few slices")

    call_command("durable_jobs", "pause", "slow", "--reason", "test", stdout=io.StringIO())
    wait_until(
        lambda: reload(job).status == "pending" and reload(job).lease_owner is None,
        message="the running slice to hand the job back",
    )
    held_at = done_rows(job)
    epoch = reload(job).lease_epoch
    time.sleep(1.5)  # several poll intervals of both workers
    row = reload(job)
    assert (row.status, done_rows(job), row.lease_epoch) == ("pending", held_at, epoch), (
        "no worker claimed from the paused queue"
    )
    assert (row.consecutive_failures, row.interruptions, row.redrives) == (0, 0, 0)
    assert Effect.objects.filter(job_id=job.id).count() == held_at, "nothing lost or doubled"

    other = durable.start("demo.noop")  # the default queue is served meanwhile
    wait_until(lambda: reload(other).status == "completed", message="the other queue's job")

    call_command("durable_jobs", "resume", "slow", stdout=io.StringIO())
    wait_until(lambda: reload(job).status == "completed", timeout=60, message="the job to end")
    row = reload(job)
    assert (row.consecutive_failures, row.interruptions, row.redrives) == (0, 0, 0)
    assert sorted(Effect.objects.filter(job_id=job.id).values_list("item", flat=True)) == list(
        range(ROWS)
    )
