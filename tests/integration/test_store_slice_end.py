"""How a slice hands back: fail_slice verdicts (invariant 3), yield (invariant 6),
release_lease (invariant 11)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durable_jobs import store
from durable_jobs.states import VERDICT_CODES, Delivery
from tests.factories import JobFactory, reload, running
from tests.integration.support import (
    DEFAULT_SCOPE,
    claim,
    db_now,
    delivery_of,
    fail,
    lease_of,
    snapshot,
)

# ---------------------------------------------------------------------------------------
# fail_slice (invariant 3: the verdict is decided in the UPDATE that counts)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_fail_slice__the_nth_consecutive_failure_is_retry_exhausted():
    """Invariant 3: N failed slices of the same delivery; only the N-th is a verdict.

    Each failure releases the lease and keeps the job running, so the same
    ``(seq, redrives)`` claims again (DESIGN §4)."""
    job = JobFactory()
    replies = []
    for attempt in range(1, 5):
        claimed, lease = claim(job, owner=f"worker-{attempt}")
        assert claimed is not None, f"attempt {attempt} could not claim its retry"
        replies.append(fail(lease, max_failures=4, code="flaky"))
        row = reload(job)
        assert (row.status, row.lease_owner, row.continuation_seq) == ("running", None, 0)

    assert [r.consecutive_failures for r in replies] == [1, 2, 3, 4]
    assert [r.verdict for r in replies] == [None, None, None, "retry_exhausted"]
    assert [r.error_code for r in replies[:3]] == ["flaky"] * 3
    assert reload(job).error_code == "retry_exhausted"


@pytest.mark.django_db
@pytest.mark.parametrize("error_class", ["unrecoverable", "terminal"])
def test_fail_slice__a_non_transient_class_is_a_verdict_on_the_first_failure(error_class):
    """Invariant 3: the class decides inside the UPDATE; no counter needed."""
    job = running()
    reply = fail(lease_of(job), error_class=error_class, code="whatever", max_failures=50)

    assert reply.consecutive_failures == 1
    assert reply.verdict == error_class
    row = reload(job)
    assert (row.error_code, row.error_class) == (error_class, error_class)


@pytest.mark.django_db
def test_fail_slice__a_committed_heartbeat_earlier_in_the_slice_resets_the_count():
    """Invariants 3 and 7: the verdict reads the counter the UPDATE increments, after the
    same slice's committed heartbeat reset it; a stale count would have exhausted it."""
    job = running(consecutive_failures=4)
    lease = lease_of(job)

    store.heartbeat(lease, committed=True)
    reply = fail(lease, max_failures=5)

    assert reply.consecutive_failures == 1
    assert reply.verdict is None


@pytest.mark.django_db
def test_fail_slice__without_a_committed_unit_the_count_carries_on():
    """Invariants 3 and 7, the control for the test above: an uncommitted heartbeat forgives
    nothing."""
    job = running(consecutive_failures=4)
    lease = lease_of(job)

    store.heartbeat(lease, processed=3)
    reply = fail(lease, max_failures=5)

    assert (reply.consecutive_failures, reply.verdict) == (5, "retry_exhausted")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("error_class", "failures_before"), [("transient", 4), ("terminal", 0), ("unrecoverable", 0)]
)
def test_fail_slice__a_verdict_is_deliverable_at_once(error_class, failures_before):
    """Invariant 3: a verdict row must be re-deliverable immediately: if its terminal transaction
    never commits, the next claim finds the verdict and records it."""
    job = running(consecutive_failures=failures_before)
    reply = fail(lease_of(job), error_class=error_class, max_failures=5, backoff_base_ms=60_000)

    assert reply.verdict is not None
    row = reload(job)
    assert row.next_run_at <= db_now()
    assert row.lease_owner is None and row.status == "running"
    [dequeued] = store.dequeue(["default"], "host-1", 30_000, kinds=None)
    assert dequeued.id == job.id and dequeued.error_code == reply.verdict


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("failures_before", "ceiling_ms"),
    [(0, 1_000), (1, 2_000), (3, 8_000), (10, 60_000)],
    ids=["first", "second", "fourth", "capped"],
)
def test_fail_slice__a_retry_is_scheduled_within_the_backoff_bounds(failures_before, ceiling_ms):
    """Invariant 3: the backoff is drawn in SQL from the counter the UPDATE increments:
    Capped exponential in the failure count with jitter on the upper half:
    ``next_run_at ∈ [now + ceiling/2, now + ceiling]``, ceiling = min(max, base·2^(n-1))."""
    job = running(consecutive_failures=failures_before)
    before = db_now()

    reply = fail(lease_of(job), max_failures=100, backoff_base_ms=1_000, backoff_max_ms=60_000)

    after = db_now()
    assert reply.verdict is None
    row = reload(job)
    assert before + timedelta(milliseconds=ceiling_ms / 2) <= row.next_run_at
    assert row.next_run_at <= after + timedelta(milliseconds=ceiling_ms)
    assert store.dequeue(["default"], "host-1", 30_000, kinds=None) == []  # not deliverable yet


@pytest.mark.django_db
def test_fail_slice__records_the_error_and_releases_the_lease_keeping_the_epoch():
    """Invariant 4: a failed slice releases the lease but keeps the epoch (the terminal CAS needs
    it)."""
    job = running(lease_epoch=7)
    fail(lease_of(job), code="io_error", message="disk on fire")
    row = reload(job)
    assert (row.error_class, row.error_code, row.error_message) == (
        "transient",
        "io_error",
        "disk on fire",
    )
    assert (row.lease_owner, row.lease_epoch, row.status) == (None, 7, "running")
    assert row.lease_expires_at <= db_now()


@pytest.mark.django_db
@pytest.mark.parametrize("code", ["retry_exhausted", "unrecoverable", "terminal"])
def test_fail_slice__a_transient_failure_cannot_forge_a_verdict_through_its_code(code):
    """Invariant 3: only the error class and the counter decide a verdict; a handler's own
    code that happens to spell one is recorded as something else."""
    job = running()
    reply = fail(lease_of(job), error_class="transient", code=code, max_failures=5)
    assert reply.verdict is None
    row = reload(job)
    assert row.error_code not in VERDICT_CODES
    assert store.take_orphan(job.id, grace_ms=0, backoff_ms=0) is None  # released, not orphaned
    assert claim(job)[0] is not None  # the retry runs


# ---------------------------------------------------------------------------------------
# yield_slice (invariant 6)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_yield_slice__mints_the_next_delivery_and_spends_nothing():
    """Invariant 6: yield bumps continuation_seq and touches no failure budget."""
    job = running(continuation_seq=2, redrives=1, consecutive_failures=2, redrives_since_commit=1)

    delivery = store.yield_slice(lease_of(job))

    assert delivery == Delivery(seq=3, redrives=1)
    row = reload(job)
    assert (row.status, row.lease_owner, row.continuation_seq) == ("pending", None, 3)
    assert (row.consecutive_failures, row.redrives_since_commit, row.interruptions) == (2, 1, 0)
    assert row.error_code is None
    assert row.next_run_at <= db_now() and row.pending_since is not None


@pytest.mark.django_db
def test_yield_slice__interrupted_counts_interruptions_only():
    """Invariant 6: a shutdown is counted on its own counter, which no verdict reads."""
    job = running(consecutive_failures=2, redrives_since_commit=1, interruptions=4)

    store.yield_slice(lease_of(job), interrupted=True)

    row = reload(job)
    assert (row.interruptions, row.consecutive_failures, row.redrives_since_commit) == (5, 2, 1)
    assert row.error_code is None and row.parked_at is None


@pytest.mark.django_db
def test_yield_slice__many_interruptions_never_make_a_verdict():
    """Invariant 6: deploys never park a healthy job (claim → interrupted yield, again and again).
    Invariant 6: deploys never park a healthy job (claim → interrupted yield, again and again)."""
    job = JobFactory()
    for _ in range(8):
        claimed, lease = claim(job)
        assert claimed is not None
        store.yield_slice(lease, interrupted=True)
    row = reload(job)
    assert (row.status, row.interruptions, row.consecutive_failures, row.error_code) == (
        "pending",
        8,
        0,
        None,
    )


@pytest.mark.django_db
def test_yield_slice__the_old_delivery_can_no_longer_claim_the_new_one_can():
    """Invariants 4 and 6: the yield retires the delivery it was running under."""
    job = running(continuation_seq=0, redrives=0, lease_expires_at=-1)
    old = delivery_of(job)

    new = store.yield_slice(lease_of(job))

    assert store.claim(job.id, DEFAULT_SCOPE, old, "straggler", 30_000) is None
    assert store.claim(job.id, DEFAULT_SCOPE, new, "worker-b", 30_000) is not None


@pytest.mark.django_db
def test_yield_slice__a_delay_schedules_the_next_slice_later():
    """Invariants 2 and 6: the delay is a duration added on the database clock."""
    job = running()
    before = db_now()
    store.yield_slice(lease_of(job), delay_ms=5_000)
    assert reload(job).next_run_at >= before + timedelta(seconds=5)
    assert store.dequeue(["default"], "host-1", 30_000, kinds=None) == []


# ---------------------------------------------------------------------------------------
# release_lease (invariant 11)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_release_lease__gives_the_lease_back_counting_nothing():
    """Invariant 11: a rolled-back terminal transaction is not a slice failure."""
    job = running(consecutive_failures=1, cancel_requested_at=-1, lease_epoch=4)
    before = db_now()

    released = store.release_lease(lease_of(job), delay_ms=2_000)

    assert released.status == "running" and released.lease_owner is None
    assert released.lease_epoch == 4
    assert released.consecutive_failures == 1
    assert released.cancel_requested_at is not None
    assert released.next_run_at >= before + timedelta(seconds=2)


@pytest.mark.django_db
def test_release_lease__the_same_delivery_may_claim_again():
    """Invariants 4 and 11: nothing was spent; the same ``(seq, redrives)`` claims again."""
    job = running(lease_epoch=4)
    store.release_lease(lease_of(job), delay_ms=0)
    again = store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000)
    assert again is not None and again.lease_epoch == 5


@pytest.mark.django_db
def test_release_lease__refused_for_a_stale_epoch():
    """Invariant 4."""
    job = running(lease_epoch=4)
    before = snapshot(job)
    assert store.release_lease(lease_of(job, epoch=3), delay_ms=0) is None
    assert snapshot(job) == before
