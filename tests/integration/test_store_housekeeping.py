"""Housekeeping statements: retention (delete_finished), the stale-pending count, and the
testing helpers' fast-forward (make_due)."""

from __future__ import annotations

import pytest
from django.db import transaction

from durable_jobs import store
from durable_jobs.models import Job
from tests.factories import JobFactory, reload, running
from tests.integration.support import (  # noqa: F401  (other_connection: fixture override)
    db_now,
    other_connection_fixture,
    snapshot,
)

DAY = 24 * 3600


def _finished(status="completed", age=2 * DAY, **fields):
    return JobFactory(status=status, next_run_at=None, finished_at=-age, **fields)


# ---------------------------------------------------------------------------------------
# delete_finished
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_delete_finished__deletes_old_finished_unparked_jobs_only():
    """Invariant 13: retention removes finished rows only, never parked or live ones."""
    old = {_finished(status).id for status in ("completed", "failed", "cancelled")}
    kept = [
        _finished(age=60),  # finished recently
        _finished(
            "failed", parked_at=-2 * DAY, error_code="poison"
        ),  # parked: waits for an operator
        JobFactory(),  # live
        running(finished_at=-2 * DAY),  # running, whatever its stamps say
    ]

    deleted = store.delete_finished(older_than_ms=DAY * 1000, limit=100)

    assert deleted == 3
    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {j.id for j in kept}
    assert remaining.isdisjoint(old)


@pytest.mark.django_db
def test_delete_finished__deletes_at_most_the_limit_and_honours_the_tenant_filter():
    """Invariant 14: bounded batches, sharded by tenant."""
    for _ in range(3):
        _finished()
    theirs = _finished(tenant_id="tenant-b")

    assert store.delete_finished(older_than_ms=DAY * 1000, limit=2, tenant="default") == 2
    assert store.delete_finished(older_than_ms=DAY * 1000, limit=10, tenant="default") == 1
    assert store.delete_finished(older_than_ms=DAY * 1000, limit=10, tenant="default") == 0
    assert reload(theirs) is not None


@pytest.mark.django_db(transaction=True)
def test_delete_finished__skips_rows_another_transaction_holds(other_connection):
    """Invariant 14: SKIP LOCKED; retention never waits on (or races) anyone."""
    held = _finished()
    free = _finished()
    with other_connection.transaction():
        other_connection.execute(
            "SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [held.id]
        )
        with transaction.atomic():
            assert store.delete_finished(older_than_ms=DAY * 1000, limit=10) == 1
    assert reload(held) is not None and reload(free) is None


# ---------------------------------------------------------------------------------------
# count_stale_pending
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_count_stale_pending__counts_what_select_stale_pending_would_select():
    """DESIGN §6: the stale-pending warning counts exactly the stale-pending candidates."""
    JobFactory(pending_since=-300, next_run_at=-300)
    JobFactory(pending_since=-300, next_run_at=-300, tenant_id="tenant-b")
    JobFactory(pending_since=-300, next_run_at=-5)  # due recently
    JobFactory(pending_since=-300, next_run_at=-300, cancel_requested_at=-1)

    assert store.count_stale_pending(pending_ttl_ms=60_000) == 2
    assert store.count_stale_pending(pending_ttl_ms=60_000, tenant="tenant-b") == 1
    with transaction.atomic():
        assert (
            len(store.select_stale_pending(queues=["default"], pending_ttl_ms=60_000, limit=10))
            == 2
        )


# ---------------------------------------------------------------------------------------
# make_due
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_make_due__brings_a_scheduled_job_forward():
    """Invariant 2: the fast-forward uses the database clock."""
    job = JobFactory(next_run_at=3600)
    assert store.dequeue(["default"], "host", 30_000, kinds=None) == []

    row = store.make_due(job.id)

    assert row.next_run_at <= db_now()
    assert [j.id for j in store.dequeue(["default"], "host", 30_000, kinds=None)] == [job.id]


@pytest.mark.django_db
def test_make_due__brings_a_backing_off_retry_forward():
    """DESIGN §6: a released retry is brought forward too."""
    job = running(lease_owner=None, lease_expires_at=-1, next_run_at=600, consecutive_failures=1)
    assert store.make_due(job.id) is not None
    assert reload(job).next_run_at <= db_now()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "build",
    [
        lambda: running(next_run_at=600),  # under a live claim
        lambda: JobFactory(status="completed", next_run_at=600, finished_at=-1),
        lambda: JobFactory(next_run_at=-5),  # already due
    ],
    ids=["leased", "finished", "already-due"],
)
def test_make_due__does_not_apply(build):
    """Invariant 4: never under a live claim, never a finished row."""
    job = build()
    before = snapshot(job)
    assert store.make_due(job.id) is None
    assert snapshot(job) == before
