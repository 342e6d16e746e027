"""The service's cancel (invariant 8) and redrive (invariant 13)."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.exceptions import WrongState
from tests.factories import JobFactory, reload, running
from tests.integration.support import db_now, lease_of

KIND = "tests.ops"


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    return KIND


def _finished(status, **fields):
    return JobFactory(kind=KIND, status=status, next_run_at=None, finished_at=-1, **fields)


# ---------------------------------------------------------------------------------------
# cancel
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel__of_a_pending_job_is_a_request_the_reconciler_ends(kind):
    """Invariant 8: cancel writes the request, never the status."""
    job = durable.start(kind)
    asked = durable.cancel(job.id, by="alice")

    assert asked.status == "pending"
    assert asked.cancel_requested_at is not None and asked.cancelled_by == "alice"
    assert store.dequeue(["default"], "host", 60_000) == []
    assert store.cancel_pending(job.id).status == "cancelled"


@pytest.mark.django_db
def test_cancel__of_a_running_job_is_seen_at_its_next_heartbeat(kind):
    """Invariant 8."""
    job = running(kind=KIND)
    asked = durable.cancel(job.id)

    assert asked.status == "running"
    assert store.heartbeat(lease_of(job)) is True
    assert store.cancel(lease_of(job)).status == "cancelled"


@pytest.mark.django_db
def test_cancel__twice_keeps_the_first_request(kind):
    """Invariant 8."""
    job = durable.start(kind)
    first = durable.cancel(job.id, by="alice")
    second = durable.cancel(job.id, by="bob")
    assert (second.cancelled_by, second.cancel_requested_at) == ("alice", first.cancel_requested_at)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_cancel__of_a_finished_job_is_wrong_state(kind, status):
    """Invariants 8 and 13."""
    job = _finished(status)
    with pytest.raises(WrongState) as caught:
        durable.cancel(job.id, by="alice")
    assert (caught.value.status, caught.value.operation) == (status, "cancel")
    assert reload(job).cancel_requested_at is None


# ---------------------------------------------------------------------------------------
# redrive
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_redrive__reissues_a_failed_job_with_fresh_budgets(kind):
    """Invariant 13: budgets reset, identity kept."""
    job = _finished(
        "failed",
        parked_at=-1,
        error_code="poison",
        error_class="terminal",
        redrives=1,
        redrives_since_commit=5,
        consecutive_failures=2,
        lease_epoch=4,
    )
    redriven = durable.redrive(job.id)

    assert redriven.status == "pending"
    assert (redriven.redrives, redriven.lease_epoch) == (2, 5)
    assert (redriven.redrives_since_commit, redriven.consecutive_failures) == (0, 0)
    assert redriven.parked_at is None and redriven.error_code is None
    assert redriven.next_run_at <= db_now()
    [claimed] = store.dequeue(["default"], "host", 60_000)
    assert claimed.id == job.id


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_redrive__completed_and_cancelled_are_final(kind, status):
    """Invariant 13: even with force."""
    job = _finished(status)
    for force in (False, True):
        with pytest.raises(WrongState) as caught:
            durable.redrive(job.id, force=force)
        assert "final" in str(caught.value)
    assert reload(job).status == status


@pytest.mark.django_db
def test_redrive__unrecoverable_needs_force(kind):
    """Invariant 13."""
    job = _finished("failed", error_code="unrecoverable", error_class="unrecoverable")
    with pytest.raises(WrongState) as caught:
        durable.redrive(job.id)
    assert "force" in str(caught.value)
    assert reload(job).status == "failed"
    assert durable.redrive(job.id, force=True).status == "pending"


@pytest.mark.django_db
def test_redrive__a_running_job_only_once_its_lease_expired_past_the_grace(kind):
    """Invariants 4 and 13 (the orphan grace in the test settings is 0.5 s)."""
    live = running(kind=KIND, lease_expires_at=30)
    with pytest.raises(WrongState) as caught:
        durable.redrive(live.id)
    assert "still live" in str(caught.value)

    dead = running(kind=KIND, lease_expires_at=-60)
    taken = durable.redrive(dead.id)
    assert (taken.status, taken.lease_epoch) == ("pending", dead.lease_epoch + 1)
    assert store.heartbeat(lease_of(dead)) is None


@pytest.mark.django_db
def test_redrive__a_pending_job_is_wrong_state(kind):
    """Invariant 13: a live pending job is not re-driven."""
    job = durable.start(kind)
    with pytest.raises(WrongState):
        durable.redrive(job.id)
    assert reload(job).redrives == 0


@pytest.mark.django_db
def test_redrive__refused_with_lock_key_held_when_a_live_job_took_the_key(kinds):
    """A failed job's lock key may have been taken since; re-driving it would make two
    live jobs on one key. The refusal names the holder and leaves the transaction usable."""
    from django.db import transaction

    from tests.factories import JobFactory, reload

    kinds.add("tests.keyed")
    failed = JobFactory(kind="tests.keyed", status="failed", lock_key="K", finished_at=-1, pending_since=None,
                        error_code="terminal", error_class="terminal")
    holder = durable.start("tests.keyed", lock_key="K")
    with transaction.atomic():
        with pytest.raises(durable.LockKeyHeld) as caught:
            durable.redrive(failed.id)
        assert caught.value.holder_id == holder.id
        durable.start("tests.keyed")  # the transaction is still usable
    assert reload(failed).status == "failed"
