"""A slot claims several quick jobs in one statement, and hands back what it did not start."""

from __future__ import annotations

import pytest
from django.db.models import Count

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.models import Job
from durable_jobs.worker import SlotState, Worker
from tests.factories import reload

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_of_quick_jobs_is_claimed_in_batches_and_all_complete():
    durable.start_many([{"kind": "demo.noop"} for _ in range(60)])
    worker = Worker(concurrency=1, burst=True)
    assert worker.run() == 0
    assert Job.objects.filter(status="completed").count() == 60
    claims = Job.objects.values("started_at").annotate(n=Count("id"))
    assert max(row["n"] for row in claims) > 1, "some jobs were claimed by one statement"
    assert all(job.lease_epoch == 1 and job.redrives == 0 for job in Job.objects.all()), "each row its own claim"


def test_claims_left_unstarted_at_shutdown_are_handed_back_without_spending_budget():
    durable.start_many([{"kind": "demo.noop"} for _ in range(3)])
    worker = Worker(concurrency=1)
    claimed = store.dequeue(["default"], "slot", 60_000, limit=3)
    worker.stopping.set()
    slot = SlotState(number=0, generation=0, owner="slot")
    assert worker._run_claimed(slot, claimed, 60_000, None) is False
    for job in claimed:
        after = reload(job)
        assert (after.status, after.lease_owner, after.redrives, after.consecutive_failures) == ("running", None, 0, 0)
    assert len(store.dequeue(["default"], "next", 60_000, limit=5)) == 3, "deliverable again at once"
