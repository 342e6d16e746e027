"""Invariant 4 (fences) and invariant 5 (the fenced domain write's row lock).

Every lease-holder write requires ``status = 'running'``, ``lease_owner`` and
``lease_epoch``; the terminal CAS requires the epoch alone. Each refusal is shown to
leave the row exactly as it was.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import transaction

from durable_jobs import store
from tests.factories import reload, running
from tests.integration.support import (  # noqa: F401  (other_connection: fixture override)
    db_now,
    fail,
    lease_of,
    other_connection_fixture,
    snapshot,
)

# A lease-holder write per store function; each answers whether it applied (the store
# reports a refusal as None, or False for the boolean ones; heartbeat's False is "applied,
# no cancel requested").
HOLDER_WRITES = {
    "heartbeat": lambda lease: store.heartbeat(lease, processed=7) is not None,
    "write_checkpoint": lambda lease: (
        store.write_checkpoint(lease, {"cursor": 9}, processed=9) is True
    ),
    "yield_slice": lambda lease: store.yield_slice(lease) is not None,
    "fail_slice": lambda lease: fail(lease) is not None,
    "release_lease": lambda lease: store.release_lease(lease, delay_ms=0) is not None,
    # The wait gate's statements (invariant 4 holds before the first slice too).
    "hold_job": lambda lease: store.hold_job(lease, delay_ms=30_000, checks=1) is not None,
    "count_wait_fault": lambda lease: (
        store.count_wait_fault(lease, checks=1, max_faults=5) is not None
    ),
    "count_wait_checks": lambda lease: store.count_wait_checks(lease, checks=1) is not None,
    "satisfy_wait": lambda lease: store.satisfy_wait(lease, checks=1) is not None,
}

TERMINAL_WRITES = {
    "complete": lambda lease: store.complete(lease, result={"ok": True}),
    "fail_terminal": lambda lease: store.fail_terminal(
        lease, code="terminal", error_class="terminal"
    ),
    "cancel": lambda lease: store.finish_cancelled(lease),
}


# ---------------------------------------------------------------------------------------
# Lease-holder writes: owner + epoch + running
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("write", HOLDER_WRITES.values(), ids=HOLDER_WRITES.keys())
def test_holder_write__applies_for_the_current_lease(write):
    """Invariant 4: the holder of (owner, epoch) on a running row may write."""
    job = running(lease_epoch=3)
    assert write(lease_of(job)) is True


@pytest.mark.django_db
@pytest.mark.parametrize("write", HOLDER_WRITES.values(), ids=HOLDER_WRITES.keys())
def test_holder_write__refused_for_a_stale_epoch(write):
    """Invariant 4: an older epoch is a lost lease, even under the same owner name."""
    job = running(lease_epoch=3)
    before = snapshot(job)

    assert write(lease_of(job, epoch=2)) is False
    assert snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize("write", HOLDER_WRITES.values(), ids=HOLDER_WRITES.keys())
def test_holder_write__refused_for_the_wrong_owner(write):
    """Invariant 4: the right epoch is not enough; the owner is half the lease."""
    job = running(lease_epoch=3)
    before = snapshot(job)

    assert write(lease_of(job, owner="worker-impostor")) is False
    assert snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize("write", HOLDER_WRITES.values(), ids=HOLDER_WRITES.keys())
@pytest.mark.parametrize("status", ["pending", "completed", "failed", "cancelled"])
def test_holder_write__refused_unless_running(write, status):
    """Invariant 4: ``status = 'running'`` is part of the fence (owner and epoch kept equal)."""
    job = running(status=status, lease_epoch=3)
    before = snapshot(job)

    assert write(lease_of(job)) is False
    assert snapshot(job) == before


@pytest.mark.django_db
def test_holder_write__refused_after_the_lease_was_released():
    """Invariant 4: after fail_slice released the lease, the releasing slice writes nothing."""
    job = running()
    lease = lease_of(job)
    assert fail(lease) is not None

    assert store.heartbeat(lease) is None
    assert store.write_checkpoint(lease, {"late": True}) is False
    assert store.yield_slice(lease) is None
    assert store.release_lease(lease, delay_ms=0) is None
    assert reload(job).checkpoint is None


# ---------------------------------------------------------------------------------------
# Terminal CAS: the epoch alone
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("write", TERMINAL_WRITES.values(), ids=TERMINAL_WRITES.keys())
def test_terminal_cas__refused_for_a_stale_epoch(write):
    """Invariant 4: a takeover bumped the epoch; the old slice cannot end the job."""
    job = running(lease_epoch=5)
    before = snapshot(job)

    assert write(lease_of(job, epoch=4)) is None
    assert snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize("write", TERMINAL_WRITES.values(), ids=TERMINAL_WRITES.keys())
def test_terminal_cas__applies_to_a_released_owner_with_the_right_epoch(write):
    """Invariant 4: the terminal CAS is fenced on the epoch alone, because fail_slice has
    already cleared ``lease_owner`` when a verdict is recorded."""
    job = running(lease_epoch=5)
    lease = lease_of(job)
    reply = fail(lease, error_class="unrecoverable")
    assert reply is not None and reply.verdict == "unrecoverable"
    assert reload(job).lease_owner is None

    ended = write(lease)

    assert ended is not None
    assert ended.status in ("completed", "failed", "cancelled")
    assert ended.finished_at is not None and ended.lease_owner is None and ended.next_run_at is None


@pytest.mark.django_db
def test_terminal_cas__applies_for_another_owner_name_with_the_right_epoch():
    """Invariant 4: the owner is not part of the terminal fence (a later claim that found a
    verdict records it under its own owner, with the epoch it holds)."""
    job = running(lease_epoch=5)
    ended = store.complete(lease_of(job, owner="someone-else"), result=[1])
    assert ended is not None and ended.status == "completed" and ended.result == [1]


@pytest.mark.django_db
@pytest.mark.parametrize("write", TERMINAL_WRITES.values(), ids=TERMINAL_WRITES.keys())
@pytest.mark.parametrize("status", ["pending", "completed", "failed", "cancelled"])
def test_terminal_cas__refused_unless_running(write, status):
    """Invariant 4 / 13: a yielded (pending) or finished row cannot be ended by an old slice."""
    job = running(status=status, lease_epoch=5)
    before = snapshot(job)

    assert write(lease_of(job)) is None
    assert snapshot(job) == before


@pytest.mark.django_db
def test_complete__records_result_and_progress():
    """Invariant 4: the terminal CAS writes the outcome and clears the error."""
    job = running(processed_count=3, total_count=10, error_code="boom", error_class="transient")
    ended = store.complete(lease_of(job), result={"rows": 10}, processed=10)

    assert ended.status == "completed"
    assert ended.result == {"rows": 10}
    assert (ended.processed_count, ended.total_count) == (10, 10)
    assert ended.error_code is None and ended.error_class is None


@pytest.mark.django_db
def test_fail_terminal__records_the_verdict():
    """Invariant 3: the verdict found by fail_slice is what the terminal CAS records."""
    job = running()
    ended = store.fail_terminal(
        lease_of(job), code="retry_exhausted", error_class="transient", message="gave up"
    )
    assert (ended.status, ended.error_code, ended.error_class, ended.error_message) == (
        "failed",
        "retry_exhausted",
        "transient",
        "gave up",
    )


@pytest.mark.django_db
def test_cancel__ends_a_running_job():
    """Invariant 8: a running slice that saw the request ends itself through the cancel CAS."""
    job = running(cancel_requested_at=-1)
    ended = store.finish_cancelled(lease_of(job))
    assert ended.status == "cancelled" and ended.finished_at is not None


# ---------------------------------------------------------------------------------------
# The mirror stamp, bump_mirror_attempts (invariant 11, fenced on the epoch)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("end", ["complete", "fail_terminal", "finish_cancelled"])
def test_terminal_cas__stamps_the_mirror_as_landed_with_the_transition(end):
    """Invariant 11: the stamp is part of the terminal CAS, so it commits exactly when the
    mirror that runs in the same transaction does."""
    job = running(lease_epoch=2)
    kwargs = {"code": "terminal", "error_class": "terminal"} if end == "fail_terminal" else {}
    ended = getattr(store, end)(lease_of(job), **kwargs)
    assert (
        ended.domain_mirrored_at is not None
        and reload(job).domain_mirrored_at == ended.domain_mirrored_at
    )


@pytest.mark.django_db
def test_terminal_cas__a_stale_epoch_stamps_nothing():
    """Invariants 4 and 11."""
    job = running(lease_epoch=2)
    assert store.complete(lease_of(job, epoch=1)) is None
    assert reload(job).domain_mirrored_at is None


def _bump(lease, *, max_attempts=3, delay_ms=0):
    return store.bump_mirror_attempts(
        lease, max_attempts=max_attempts, delay_ms=delay_ms, message="mirror broke"
    )


@pytest.mark.django_db
def test_bump_mirror_attempts__counts_and_releases_the_lease_without_spending_retry_budget():
    """Invariant 11: a failed mirror is counted and the lease given back; the job stays
    running for another attempt, and its slice-failure budget is untouched."""
    job = running(lease_epoch=2, consecutive_failures=1)
    before = db_now()

    row = _bump(lease_of(job), delay_ms=10_000)

    assert row.mirror_attempts == 1
    assert row.status == "running" and row.lease_owner is None and row.parked_at is None
    assert row.consecutive_failures == 1
    assert row.next_run_at >= before + timedelta(seconds=10)
    assert row.lease_epoch == 2  # the same delivery may claim again


@pytest.mark.django_db
def test_bump_mirror_attempts__parks_mirror_failed_once_the_budget_is_spent():
    """Invariant 11 (and 3: decided from the counter the statement increments)."""
    job = running(lease_epoch=2, mirror_attempts=1)
    lease = lease_of(job)

    second = _bump(lease)
    third = _bump(lease)

    assert (second.mirror_attempts, second.status) == (2, "running")
    assert third.mirror_attempts == 3
    assert (third.status, third.error_code) == ("failed", "mirror_failed")
    assert (
        third.parked_at is not None and third.finished_at is not None and third.next_run_at is None
    )
    assert third.error_message == "mirror broke"


@pytest.mark.django_db
def test_bump_mirror_attempts__applies_to_a_released_owner_with_the_right_epoch():
    """Invariants 4 and 11: fenced on the epoch alone, like the terminal CAS it follows."""
    job = running(lease_epoch=2)
    fail(lease_of(job), error_class="terminal")
    assert _bump(lease_of(job, owner="anyone")).mirror_attempts == 1


@pytest.mark.django_db
def test_bump_mirror_attempts__refused_for_a_stale_epoch_or_a_finished_job():
    """Invariants 4 and 11: a stale epoch or a finished job counts nothing."""
    job = running(lease_epoch=2)
    before = snapshot(job)
    assert _bump(lease_of(job, epoch=1)) is None
    assert snapshot(job) == before
    done = running(status="completed", lease_epoch=2)
    assert _bump(lease_of(done)) is None
    assert reload(done).mirror_attempts == 0


# ---------------------------------------------------------------------------------------
# assert_lease (invariant 5)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_assert_lease__holds_for_the_holder_only():
    """Invariant 5: the fenced write's check is owner + epoch + running."""
    job = running(lease_epoch=3)
    assert store.assert_lease(lease_of(job)) is True
    assert store.assert_lease(lease_of(job, epoch=2)) is False
    assert store.assert_lease(lease_of(job, owner="other")) is False
    yielded = running(status="pending", lease_epoch=3)
    assert store.assert_lease(lease_of(yielded)) is False


@pytest.mark.django_db(transaction=True)
def test_assert_lease__locks_the_row_so_nobody_takes_the_job_over_meanwhile(other_connection):
    """Invariant 5: while a fenced transaction holds the row, an orphan take must wait, and
    once it has taken the job the old holder's next fenced transaction lands nothing."""
    job = running(lease_expires_at=-120)
    lease = lease_of(job)
    take = {
        "id": job.id,
        "grace_ms": 0,
        "backoff_ms": 0,
        "max_redrives": None,
        "reason": None,
        "keep": 20,
    }

    with transaction.atomic():
        assert store.assert_lease(lease) is True
        other_connection.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other_connection.execute(store.TAKE_ORPHAN, take)

    assert other_connection.execute(store.TAKE_ORPHAN, take).fetchone() is not None
    with transaction.atomic():
        assert store.assert_lease(lease) is False


@pytest.mark.django_db
def test_complete_many__fences_each_row_on_its_own_epoch():
    """Invariant 4, batched: a taken-over job in the batch is refused, the others complete."""
    jobs = [running(lease_epoch=3) for _ in range(3)]
    leases = [lease_of(jobs[0]), lease_of(jobs[1], epoch=2), lease_of(jobs[2])]
    applied = store.complete_many([(leases[0], '{"n":1}'), (leases[1], None), (leases[2], None)])
    assert applied == {jobs[0].id, jobs[2].id}
    assert reload(jobs[0]).status == "completed" and reload(jobs[0]).result == {"n": 1}
    assert reload(jobs[0]).domain_mirrored_at is not None
    assert reload(jobs[1]).status == "running", "the stale epoch completed nothing"
    assert store.complete_many([(leases[0], None)]) == set(), (
        "a completed job is never completed again"
    )
