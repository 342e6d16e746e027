"""Invariant 27 with a real worker (thread execution): pausing a queue lets a long slicing
job's running slice end normally, charges it nothing and leaves it pending until the
resume, whose NOTIFY wakes the worker at once; a worker started while a queue is paused
claims nothing from it and still serves its other queues."""

from __future__ import annotations

import threading
import time

import pytest

import durable_jobs as durable
from durable_jobs.runtime.worker import Worker
from tests.factories import reload
from tests.integration.support import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)

POLL = 60.0  # far longer than the test: only the resume's NOTIFY explains a prompt claim


def slicing(job: durable.Slice):
    """A long job: one small step per slice, checkpointed, then handed back (a yield)."""
    steps = (job.checkpoint or {}).get("steps", 0) + 1
    time.sleep(0.05)
    job.save_checkpoint({"steps": steps}, processed=steps)
    return durable.YIELD


@pytest.fixture
def worker(settings, kinds):
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "POLL_INTERVAL": POLL,
        "NOTIFY_CHANNEL": "durable_jobs",
    }
    kinds.add("tests.slicing", slicing, queue="slow")
    kinds.add("tests.quick", queue="default")
    started: list[tuple[Worker, threading.Thread]] = []

    def start() -> Worker:
        w = Worker(queues=["slow", "default"], concurrency=2, execution="thread", reconcile=False)
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        started.append((w, thread))
        return w

    yield start
    for w, thread in started:
        w.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def steps(job) -> int:
    return (reload(job).checkpoint or {}).get("steps", 0)


def test_pausing_lets_a_running_slicing_job_yield_uncharged_and_wait_until_resume(worker):
    job = durable.start("tests.slicing")
    worker()
    _wait(lambda: steps(job) >= 3, "the job to run a few slices")

    durable.pause_queue("slow", reason="test")
    # The slice running at the pause ends as it would have (a yield), then nobody claims it.
    # A claim already in flight when the pause committed (its statement's snapshot older
    # than the pause) may still take the job as it yields, and run one slice more: wait
    # out that slice before taking the count the job must then keep.
    _wait(lambda: reload(job).status == "pending", "the job to be handed back")
    time.sleep(0.3)
    _wait(lambda: reload(job).status == "pending", "the job to be handed back")
    held_at = steps(job)
    time.sleep(0.5)  # a claim of a paused queue would have run several slices by now
    row = reload(job)
    assert (row.status, row.lease_owner, steps(job)) == ("pending", None, held_at)
    assert (row.consecutive_failures, row.interruptions, row.redrives) == (0, 0, 0)
    assert row.redrives_since_commit == 0 and row.error_code is None

    quick = durable.start("tests.quick")  # the worker's other queue is served meanwhile
    _wait(lambda: reload(quick).status == "completed", "a job of another queue to run")
    assert steps(job) == held_at

    durable.resume_queue("slow")
    _wait(lambda: steps(job) > held_at + 2, "the job to run again after the resume", timeout=5)
    row = reload(job)
    assert (row.consecutive_failures, row.interruptions, row.redrives) == (0, 0, 0)


def test_a_worker_started_while_its_queue_is_paused_claims_nothing_from_it(worker):
    durable.pause_queue("slow")
    job = durable.start("tests.slicing")
    worker()
    quick = durable.start("tests.quick")
    _wait(lambda: reload(quick).status == "completed", "the worker to serve its other queue")
    time.sleep(0.3)
    row = reload(job)
    assert (row.status, row.started_at, row.lease_epoch) == ("pending", None, 0)

    durable.resume_queue("slow")
    _wait(lambda: steps(job) >= 1, "the first slice after the resume", timeout=5)
