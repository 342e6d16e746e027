"""The chaos suite's invariants on each broker transport (invariant 31): workers consuming
from RabbitMQ or Redis Streams are SIGKILLed at named points, or stopped past their lease;
a rescuer on the same transport finishes the work; no job is lost, no effect lands twice,
no stale epoch writes."""

from __future__ import annotations

import signal

import pytest

import durable_jobs as durable
from durable_jobs.models import Job
from durable_jobs.transports import publishing
from tests.brokers.support import TRANSPORTS, URLS, delete_names, unique_prefix
from tests.chaos.conftest import assert_invariants
from tests.chaos.test_scenarios import (
    finish_with_rescuer,
    start_imports,
    stop_past_the_lease_and_resume,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=TRANSPORTS)
def on_a_broker(request, settings):
    """Every queue on the broker, here (the starts publish) and in the worker subprocesses."""
    transport, prefix = request.param, unique_prefix()
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "TRANSPORT": transport,
        "BROKER_URLS": {transport: URLS[transport]},
        "BROKER_PREFIX": prefix,
        "QUEUES": ["default"],
    }
    yield {
        "DURABLE_JOBS_TRANSPORT": transport,
        "DURABLE_JOBS_BROKER_URL": URLS[transport],
        "DURABLE_JOBS_BROKER_PREFIX": prefix,
    }
    publishing.close_all()
    delete_names(transport, prefix)


@pytest.mark.parametrize("point", ["after_claim", "domain_after_commit"])
def test_sigkill_at_a_named_point_on_a_broker(recorded, processes, on_a_broker, point):
    jobs = [
        durable.start("demo.import", input={"rows": 6, "batch": 1, "delay": 0.2}) for _ in range(3)
    ]
    victim = processes.worker(
        app_name="durable-victim",
        env={
            **on_a_broker,
            "DURABLE_JOBS_FAULTS": f"{point}=kill@2",
            "DURABLE_JOBS_EXECUTION": "thread",
        },
    )
    victim.wait(timeout=60)
    assert victim.popen.returncode == -signal.SIGKILL, victim.output()
    finish_with_rescuer(processes, jobs, env=on_a_broker)
    assert all(job.status == "completed" for job in Job.objects.filter(id__in=[j.id for j in jobs]))
    assert_invariants(recorded, processes)


def test_sigstop_past_the_lease_on_a_broker_lands_no_zombie_write(recorded, processes, on_a_broker):
    """A worker stopped mid-slice past its lease: the rescuer's reconciler takes both jobs
    back and publishes them under (seq, redrives + 1), the rescuer consumes and runs them;
    the stopped worker resumes and every fenced write it tries is refused."""
    jobs = start_imports(2, rows=8, delay=0.6)
    stop_past_the_lease_and_resume(processes, jobs, env=on_a_broker)
    ids = [job.id for job in jobs]
    assert all(job.status == "completed" for job in Job.objects.filter(id__in=ids))
    assert_invariants(recorded, processes)
