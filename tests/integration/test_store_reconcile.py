"""The reconciler's and the operator's statements: take_orphan, redrive_pending, park,
cancel_pending, request_cancel, operator_redrive, record_enqueue, and the candidate
selections (invariants 4, 8, 13, 14 and DESIGN §6)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from durable_jobs import store
from durable_jobs.states import Scope
from tests.factories import JobFactory, reload, running
from tests.integration.support import (  # noqa: F401  (other_connection: fixture override)
    DEFAULT_SCOPE,
    db_now,
    delivery_of,
    fail,
    lease_of,
    other_connection_fixture,
    snapshot,
)

GRACE_MS = 10_000


def take(job, *, grace_ms=GRACE_MS, backoff_ms=0):
    return store.take_orphan(job.id, grace_ms=grace_ms, backoff_ms=backoff_ms)


# ---------------------------------------------------------------------------------------
# take_orphan
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_take_orphan__takes_a_lease_expired_past_the_grace():
    """Invariants 4 and 7: a running job whose worker died gets a new delivery identity
    (epoch + 1, redrives + 1) and spends its poison budget."""
    job = running(
        lease_epoch=3, redrives=1, redrives_since_commit=2, continuation_seq=5, lease_expires_at=-11
    )
    before = db_now()

    taken = take(job, backoff_ms=4_000)

    assert taken is not None
    assert taken.status == "pending"
    assert taken.lease_owner is None
    assert taken.lease_epoch == 4
    assert (taken.redrives, taken.redrives_since_commit) == (2, 3)
    assert taken.continuation_seq == 5
    assert taken.next_run_at >= before + timedelta(seconds=4)
    assert taken.pending_since is not None


@pytest.mark.django_db
def test_take_orphan__the_old_holder_is_fenced_out():
    """Invariant 4: the epoch bump stops the old holder's every write."""
    job = running(lease_expires_at=-60)
    old = lease_of(job)
    take(job)

    assert store.heartbeat(old) is None
    assert store.write_checkpoint(old, {"late": 1}) is False
    assert store.complete(old) is None
    assert store.assert_lease(old) is False
    assert reload(job).checkpoint is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        dict(lease_expires_at=30),
        dict(lease_expires_at=-2),
        dict(lease_owner=None, lease_expires_at=-600, next_run_at=-600, consecutive_failures=1),
        dict(lease_expires_at=-600, error_code="retry_exhausted", error_class="transient"),
        dict(lease_expires_at=-600, error_code="unrecoverable", error_class="unrecoverable"),
        dict(lease_expires_at=-600, error_code="terminal", error_class="terminal"),
        dict(lease_expires_at=-600, cancel_requested_at=-700),
        dict(status="pending", lease_owner=None, lease_expires_at=-600),
        dict(status="completed", lease_expires_at=-600, finished_at=-600),
    ],
    ids=[
        "live-lease",
        "inside-grace",
        "released-lease-waiting-for-retry",
        "verdict-retry-exhausted",
        "verdict-unrecoverable",
        "verdict-terminal",
        "cancel-requested",
        "pending",
        "completed",
    ],
)
def test_take_orphan__does_not_apply(fields):
    """Invariant 4 / DESIGN §6: an orphan is a running job whose lease expired past the grace under
    a live claim, and nothing else. A failed slice waiting for its retry is merely queued;
    verdict rows are recorded and cancel-requested rows ended by the reconciler instead."""
    job = running(**fields)
    before = snapshot(job)

    assert take(job) is None
    assert snapshot(job) == before


# ---------------------------------------------------------------------------------------
# redrive_pending (broker transports only)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_redrive_pending__reissues_a_pending_job_past_the_ttl():
    """Invariant 4: a lost broker delivery is re-issued under a new identity (broker transports
    only, DESIGN §6)."""
    job = JobFactory(pending_since=-120, next_run_at=-100, lease_epoch=2)
    redriven = store.redrive_pending(job.id, pending_ttl_ms=60_000)

    assert redriven is not None
    assert (
        redriven.status,
        redriven.lease_epoch,
        redriven.redrives,
        redriven.redrives_since_commit,
    ) == (
        "pending",
        3,
        1,
        1,
    )
    assert redriven.next_run_at <= db_now()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        dict(pending_since=-30, next_run_at=-30),
        dict(
            pending_since=-300, next_run_at=-10
        ),  # scheduled recently: the TTL counts from the run time
        dict(pending_since=-300, next_run_at=-300, cancel_requested_at=-5),
        dict(
            status="running",
            lease_owner="w",
            lease_epoch=1,
            lease_expires_at=-300,
            pending_since=-300,
            next_run_at=-300,
        ),
    ],
    ids=["fresh", "recently-due", "cancel-requested", "running"],
)
def test_redrive_pending__does_not_apply(fields):
    """DESIGN §6: a fresh, recently due, cancel-requested or running job is not re-driven."""
    job = JobFactory(**fields)
    before = snapshot(job)
    assert store.redrive_pending(job.id, pending_ttl_ms=60_000) is None
    assert snapshot(job) == before


# ---------------------------------------------------------------------------------------
# park
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["pending", "running"])
def test_park__fails_a_live_job_with_its_reason(status):
    """Invariant 13 / DESIGN §4: park is ``failed`` with a reason only an operator re-drives."""
    job = running(status=status, lease_epoch=6, redrives_since_commit=5)
    parked = store.park(job.id, 6, "poison", "re-driven 5 times without progress")

    assert (parked.status, parked.error_code, parked.error_class) == (
        "failed",
        "poison",
        "terminal",
    )
    assert parked.parked_at is not None and parked.finished_at is not None
    assert parked.lease_owner is None and parked.next_run_at is None
    assert parked.error_message == "re-driven 5 times without progress"


@pytest.mark.django_db
def test_park__is_fenced_on_the_epoch_the_caller_saw():
    """Invariant 4: a job taken over since the reconciler looked is not parked by it."""
    job = running(lease_epoch=6)
    before = snapshot(job)
    assert store.park(job.id, 5, "poison", None) is None
    assert snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_park__refused_for_a_finished_job(status):
    """Invariant 13: terminal is terminal; parking does not rewrite it."""
    job = running(status=status, lease_epoch=6)
    assert store.park(job.id, 6, "poison", None) is None
    assert reload(job).parked_at is None


# ---------------------------------------------------------------------------------------
# Telling a parked job's subject: stamp_parked_mirrored, bump_park_mirror_attempts,
# select_parked_untold (issue 9 item 6)
# ---------------------------------------------------------------------------------------


def _parked(reason, **fields):
    """A job parked by the reconciler or the executor, whose domain row was never told."""
    defaults = {
        "status": "failed",
        "lease_owner": None,
        "lease_epoch": 4,
        "lease_expires_at": -60,
        "next_run_at": None,
        "pending_since": None,
        "finished_at": -30,
        "parked_at": -30,
        "error_code": reason,
        "error_class": "terminal",
        "error_message": f"parked: {reason}",
    }
    defaults.update(fields)
    return JobFactory(**defaults)


@pytest.mark.django_db
@pytest.mark.parametrize("reason", ["poison", "mirror_failed"])
def test_stamp_parked_mirrored__stamps_the_parked_job_and_returns_the_row_for_its_mirror(reason):
    """Invariant 4: fenced on the parked state and the epoch; the row keeps its park reason."""
    job = _parked(reason)
    stamped = store.stamp_parked_mirrored(job.id, epoch=4)

    assert stamped is not None and stamped.domain_mirrored_at is not None
    assert (stamped.status, stamped.error_code) == (
        "failed",
        reason,
    ) and stamped.parked_at is not None
    assert store.stamp_parked_mirrored(job.id, epoch=4) is None, "told once"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "build, epoch",
    [
        (lambda: _parked("poison"), 3),
        (lambda: _parked("poison", domain_mirrored_at=timezone.now()), 4),
        (
            lambda: JobFactory(
                status="failed", lease_epoch=4, finished_at=-5, error_code="terminal"
            ),
            4,
        ),
        (lambda: running(lease_epoch=4), 4),
        (lambda: _parked("poison", status="completed"), 4),
    ],
    ids=["older-epoch", "already-told", "failed-not-parked", "running", "completed"],
)
def test_stamp_parked_mirrored__does_not_apply(build, epoch):
    """Invariant 4: only a parked, untold job at the epoch the reconciler saw."""
    job = build()
    before = snapshot(job)
    assert store.stamp_parked_mirrored(job.id, epoch=epoch) is None
    assert store.bump_park_mirror_attempts(job.id, epoch=epoch) is None
    assert snapshot(job) == before


@pytest.mark.django_db
def test_bump_park_mirror_attempts__counts_on_the_row_and_changes_nothing_else():
    """Invariant 11: a failed attempt to tell the subject is counted by a statement of its own."""
    job = _parked("mirror_failed", mirror_attempts=5)
    assert store.bump_park_mirror_attempts(job.id, epoch=4) == 1
    assert store.bump_park_mirror_attempts(job.id, epoch=4) == 2
    after = reload(job)
    assert (after.status, after.error_code, after.mirror_attempts, after.domain_mirrored_at) == (
        "failed",
        "mirror_failed",
        5,
        None,
    )


@pytest.mark.django_db
def test_select_parked_untold__returns_parked_untold_jobs_of_known_kinds_under_their_bound():
    """Issue 9 item 6: a kind this process does not know waits for a reconciler that does; a job
    whose attempts reached its kind's bound is left alone."""
    poison = _parked("poison", kind="tests.a")
    mirror_failed = _parked("mirror_failed", kind="tests.b", park_mirror_attempts=1)
    _parked("poison", kind="tests.a", park_mirror_attempts=2)  # bound of tests.a reached
    _parked("poison", kind="tests.b", domain_mirrored_at=timezone.now())  # already told
    _parked("poison", kind="tests.unknown")
    _parked("poison", kind="tests.a", tenant_id="other")
    JobFactory(kind="tests.a", status="failed", finished_at=-5, error_code="terminal")  # not parked

    found = store.select_parked_untold({"tests.a": 2, "tests.b": 5}, limit=10, tenant="default")

    assert {job.id for job in found} == {poison.id, mirror_failed.id}
    only = store.select_parked_untold({"tests.a": 2, "tests.b": 5}, limit=10, job_id=poison.id)
    assert [job.id for job in only] == [poison.id]


@pytest.mark.django_db
def test_select_parked_untold__reads_its_partial_index():
    """DESIGN §3: the candidate query is proportional to its candidates, not to the table."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN " + store.SELECT_PARKED_UNTOLD,
            {"kinds": ["tests.a"], "bounds": [3], "limit": 10, "tenant": None, "job_id": None},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "durable_jobs_parked_untold" in plan, plan


# ---------------------------------------------------------------------------------------
# request_cancel and cancel_pending (invariant 8)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["pending", "running"])
def test_request_cancel__records_the_wish_and_writes_no_status(status):
    """Invariant 8: cancellation is a request; nobody writes ``status`` from outside."""
    job = running(status=status)
    asked = store.request_cancel(job.id, DEFAULT_SCOPE, by="alice")

    assert asked.cancel_requested_at is not None and asked.cancelled_by == "alice"
    assert asked.status == status


@pytest.mark.django_db
def test_request_cancel__keeps_the_first_requester_and_time():
    """Invariant 8: the first request's time and author are kept."""
    job = JobFactory(cancel_requested_at=-60, cancelled_by="alice")
    first_time = job.cancel_requested_at

    again = store.request_cancel(job.id, DEFAULT_SCOPE, by="bob")

    assert (again.cancelled_by, again.cancel_requested_at) == ("alice", first_time)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_request_cancel__refused_for_a_finished_job(status):
    """Invariants 8 and 13."""
    job = JobFactory(status=status, next_run_at=None, finished_at=-1)
    assert store.request_cancel(job.id, DEFAULT_SCOPE, by="alice") is None
    assert reload(job).cancel_requested_at is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("row_org", "scope"),
    [
        (None, Scope(tenant="tenant-b")),
        (None, Scope(tenant="default", organization="acme")),
        ("acme", Scope(tenant="default")),
    ],
    ids=["other-tenant", "org-scope-on-tenant-wide-row", "tenant-wide-scope-on-org-row"],
)
def test_request_cancel__refused_from_another_scope(row_org, scope):
    """Invariant 10."""
    job = JobFactory(organization_id=row_org)
    assert store.request_cancel(job.id, scope, by="mallory") is None
    assert reload(job).cancel_requested_at is None


@pytest.mark.django_db
def test_cancel_pending__ends_a_pending_job_whose_cancellation_was_requested():
    """Invariant 8: the reconciler ends a pending job whose cancellation was requested."""
    job = JobFactory(cancel_requested_at=-1)
    ended = store.cancel_pending(job.id)
    assert (
        ended.status == "cancelled" and ended.finished_at is not None and ended.next_run_at is None
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        dict(status="pending"),
        dict(status="running", cancel_requested_at=-1),
        dict(status="failed", cancel_requested_at=-1, finished_at=-1),
    ],
    ids=["not-requested", "running", "finished"],
)
def test_cancel_pending__does_not_apply(fields):
    """Invariant 8: only ``pending`` + requested (the status is the fence); a running job ends
    itself through the cancel CAS."""
    job = running(**fields) if fields["status"] == "running" else JobFactory(**fields)
    before = snapshot(job)
    assert store.cancel_pending(job.id) is None
    assert snapshot(job) == before


# ---------------------------------------------------------------------------------------
# operator_redrive (invariant 13)
# ---------------------------------------------------------------------------------------


def redrive(job, *, force=False, scope=DEFAULT_SCOPE, grace_ms=GRACE_MS):
    return store.operator_redrive(job.id, scope, force=force, grace_ms=grace_ms)


@pytest.mark.django_db
def test_operator_redrive__reissues_a_failed_job_with_fresh_budgets():
    """Invariant 13: budgets reset, identity kept (redrives + 1 as a new delivery)."""
    job = JobFactory(
        status="failed",
        next_run_at=None,
        finished_at=-5,
        parked_at=-5,
        error_code="poison",
        error_class="terminal",
        redrives=2,
        redrives_since_commit=5,
        consecutive_failures=3,
        mirror_attempts=4,
        lease_epoch=8,
        continuation_seq=6,
        cancel_requested_at=-9,
        cancelled_by="alice",
        domain_mirrored_at=db_now(),
        checkpoint={"cursor": 7},
    )

    redriven = redrive(job)

    assert redriven.status == "pending"
    assert (redriven.redrives, redriven.lease_epoch, redriven.continuation_seq) == (3, 9, 6)
    assert (
        redriven.redrives_since_commit,
        redriven.consecutive_failures,
        redriven.mirror_attempts,
    ) == (0, 0, 0)
    assert (
        redriven.parked_at is None
        and redriven.finished_at is None
        and redriven.domain_mirrored_at is None
    )
    assert redriven.error_code is None and redriven.error_class is None
    assert redriven.cancel_requested_at is None and redriven.cancelled_by is None
    assert redriven.checkpoint == {"cursor": 7}  # the work done so far is kept
    assert redriven.next_run_at <= db_now()


@pytest.mark.django_db
def test_operator_redrive__resets_the_count_of_attempts_to_tell_a_parked_subject():
    """Invariant 13: a redriven job that parks again gets its full budget to tell its subject."""
    job = _parked("poison", park_mirror_attempts=5)
    redriven = store.operator_redrive(job.id, DEFAULT_SCOPE, force=False, grace_ms=GRACE_MS)
    assert (redriven.status, redriven.park_mirror_attempts, redriven.domain_mirrored_at) == (
        "pending",
        0,
        None,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_operator_redrive__refuses_completed_and_cancelled(status):
    """Invariant 13: terminal is terminal, even with force."""
    job = JobFactory(status=status, next_run_at=None, finished_at=-5)
    before = snapshot(job)
    assert redrive(job) is None
    assert redrive(job, force=True) is None
    assert snapshot(job) == before


@pytest.mark.django_db
def test_operator_redrive__refuses_unrecoverable_unless_forced():
    """Invariant 13: ``unrecoverable`` only with an explicit force."""
    job = JobFactory(
        status="failed",
        next_run_at=None,
        finished_at=-5,
        error_code="unrecoverable",
        error_class="unrecoverable",
    )
    assert redrive(job) is None
    assert reload(job).status == "failed"
    assert redrive(job, force=True).status == "pending"


@pytest.mark.django_db
def test_operator_redrive__refuses_an_unrecoverable_failure_parked_for_its_mirror_unless_forced():
    """Invariant 13: ``unrecoverable`` only with force, even once parked for its mirror (11)."""
    job = running(lease_epoch=2)
    lease = lease_of(job)
    assert fail(lease, error_class="unrecoverable").verdict == "unrecoverable"
    # The terminal transaction's mirror keeps failing: the budget parks the job.
    parked = store.bump_mirror_attempts(lease, max_attempts=1, delay_ms=0, message="mirror broke")
    assert (parked.status, parked.error_code, parked.error_class) == (
        "failed",
        "mirror_failed",
        "unrecoverable",
    )

    assert redrive(job) is None


@pytest.mark.django_db
def test_operator_redrive__takes_a_running_job_whose_lease_expired_past_the_grace():
    """Invariants 4 and 13: the manual take of a dead worker's lease fences the old holder out."""
    job = running(lease_expires_at=-60, lease_epoch=3)
    old = lease_of(job)
    taken = redrive(job)
    assert (taken.status, taken.lease_epoch, taken.redrives) == ("pending", 4, 1)
    assert store.heartbeat(old) is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        dict(lease_expires_at=30),
        dict(lease_expires_at=-2),
        dict(lease_owner=None, lease_expires_at=-600, next_run_at=-600),
        dict(status="pending", lease_owner=None),
    ],
    ids=["live-lease", "inside-grace", "released-lease", "pending"],
)
def test_operator_redrive__refuses_a_live_job(fields):
    """Invariant 13 / DESIGN §6: a live lease, one inside the grace, a queued retry or a pending job
    is not taken."""
    job = running(**fields)
    before = snapshot(job)
    assert redrive(job) is None
    assert snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    "scope",
    [Scope(tenant="tenant-b"), Scope(tenant="default", organization="acme")],
    ids=["other-tenant", "other-organization"],
)
def test_operator_redrive__refused_from_another_scope(scope):
    """Invariant 10."""
    job = JobFactory(status="failed", next_run_at=None, finished_at=-5)
    assert redrive(job, scope=scope) is None
    assert reload(job).status == "failed"


# ---------------------------------------------------------------------------------------
# record_enqueue
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_record_enqueue__records_the_broker_message_of_a_live_job():
    """DESIGN §6: the broker message id is recorded so a cancel can remove it."""
    job = JobFactory(queue_name="bulk")
    assert store.record_enqueue(job.id, "msg-1", "bulk", delivery_of(job)) is True
    row = reload(job)
    assert (row.queue_job_id, row.queue_name) == ("msg-1", "bulk")


@pytest.mark.django_db
def test_record_enqueue__refused_for_a_finished_job():
    """Invariant 13: a finished row is not rewritten."""
    job = JobFactory(status="completed", next_run_at=None, finished_at=-1, queue_name="bulk")
    assert store.record_enqueue(job.id, "msg-1", "bulk", delivery_of(job)) is False
    assert reload(job).queue_job_id is None


@pytest.mark.django_db
def test_record_enqueue__a_slow_publish_of_an_older_pair_keeps_the_current_message_id():
    """Invariant 31: the start's publish timed out, the stale-pending pass re-drove the job
    and published (seq, redrives + 1); the first publish, finishing late, must not
    overwrite the current message's id, or a cancel would remove only the straggler."""
    job = JobFactory(queue_name="bulk", pending_since=-300, next_run_at=-300)
    first = delivery_of(job)
    redriven = store.redrive_pending(job.id, pending_ttl_ms=60_000)
    assert redriven is not None
    assert store.record_enqueue(job.id, "msg-current", "bulk", delivery_of(redriven)) is True

    assert store.record_enqueue(job.id, "msg-straggler", "bulk", first) is False
    assert reload(job).queue_job_id == "msg-current"


# ---------------------------------------------------------------------------------------
# Candidate selections (invariant 14)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_select_cancelling__returns_cancel_requested_jobs_no_worker_runs_of_the_tenant():
    """Invariants 8 and 14: the candidates, and the tenant filter that shards the loop.
    A running job with a live lease is its worker's to end, so it is not selected."""
    wanted = JobFactory(cancel_requested_at=-5)
    abandoned = running(cancel_requested_at=-4, lease_expires_at=-60)
    released = running(
        cancel_requested_at=-4, lease_owner=None, lease_expires_at=-1, next_run_at=30
    )
    running(cancel_requested_at=-4)  # a live lease: its worker ends it
    running(cancel_requested_at=-4, lease_expires_at=-0.1)  # expired, but inside the grace
    JobFactory()  # not requested
    JobFactory(status="cancelled", cancel_requested_at=-5, finished_at=-1, next_run_at=None)
    other_tenant = JobFactory(tenant_id="tenant-b", cancel_requested_at=-5)

    with transaction.atomic():
        everyone = {j.id for j in store.select_cancelling(grace_ms=GRACE_MS, limit=10)}
        ours = {
            j.id for j in store.select_cancelling(grace_ms=GRACE_MS, limit=10, tenant="default")
        }
        theirs = {
            j.id for j in store.select_cancelling(grace_ms=GRACE_MS, limit=10, tenant="tenant-b")
        }

    assert everyone == {wanted.id, abandoned.id, released.id, other_tenant.id}
    assert ours == {wanted.id, abandoned.id, released.id}
    assert theirs == {other_tenant.id}


@pytest.mark.django_db
def test_select_orphans__returns_leases_expired_past_the_grace_of_the_tenant():
    """Invariant 14 / DESIGN §6: leased rows expired past the grace, sharded by tenant."""
    orphan = running(lease_expires_at=-60)
    running(lease_expires_at=-1)  # inside the grace
    running(lease_expires_at=60)  # live
    running(lease_owner=None, lease_expires_at=-600, next_run_at=-600)  # waiting for its retry
    other_tenant = running(tenant_id="tenant-b", lease_expires_at=-60)

    with transaction.atomic():
        everyone = {j.id for j in store.select_orphans(grace_ms=GRACE_MS, limit=10)}
        ours = {j.id for j in store.select_orphans(grace_ms=GRACE_MS, limit=10, tenant="default")}

    assert everyone == {orphan.id, other_tenant.id}
    assert ours == {orphan.id}


@pytest.mark.django_db
def test_select_stale_pending__returns_pending_jobs_due_longer_than_the_ttl():
    """Invariant 14 / DESIGN §6: pending rows due longer than the TTL, sharded by tenant."""
    stale = JobFactory(pending_since=-300, next_run_at=-300)
    JobFactory(pending_since=-300, next_run_at=-5)
    JobFactory(pending_since=-300, next_run_at=-300, cancel_requested_at=-1)
    other_tenant = JobFactory(tenant_id="tenant-b", pending_since=-300, next_run_at=-300)

    with transaction.atomic():
        everyone = {j.id for j in _stale(["default"])}
        ours = {j.id for j in _stale(["default"], tenant="default")}

    assert everyone == {stale.id, other_tenant.id}
    assert ours == {stale.id}


@pytest.mark.django_db
def test_select_stale_pending__only_the_broker_queues_it_is_given():
    """DESIGN §6: a database-transport row cannot lose its delivery; re-driving it because
    no worker ran would spend its budget and park a healthy job. Without the queue filter
    the pass took every stale pending row of every queue."""
    on_the_broker = JobFactory(queue_name="brokered", pending_since=-300, next_run_at=-300)
    JobFactory(queue_name="default", pending_since=-300, next_run_at=-300)

    with transaction.atomic():
        assert {j.id for j in _stale(["brokered"])} == {on_the_broker.id}


@pytest.mark.django_db
def test_select_stale_pending__a_failed_slices_lost_retry_is_found_and_re_driven():
    """Invariant 14a: a failed slice waits for its retry with a released lease; on a broker
    its delayed delivery is as losable as a start's, and nothing else would ever re-drive
    it (the orphan take needs a live claim)."""
    job = running(queue_name="brokered")
    assert fail(lease_of(job)) is not None
    with connection.cursor() as cursor:  # its retry was due five minutes ago
        cursor.execute(
            "UPDATE durable_jobs_job SET next_run_at = now() - interval '5 minutes' WHERE id = %s",
            [job.id],
        )

    with transaction.atomic():
        assert {j.id for j in _stale(["brokered"])} == {job.id}
    redriven = store.redrive_pending(job.id, pending_ttl_ms=60_000)
    assert redriven is not None
    assert (redriven.status, redriven.redrives) == ("pending", job.redrives + 1)


def _stale(queues, tenant=None):
    return store.select_stale_pending(queues=queues, pending_ttl_ms=60_000, limit=10, tenant=tenant)


def _fail_fast_on_locks() -> None:
    """Without SKIP LOCKED the selection would wait for the other transaction: fail fast."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '2s'")


SELECTIONS = {
    "select_cancelling": (
        lambda: JobFactory(cancel_requested_at=-5),
        store.SELECT_CANCELLING,
        lambda limit: store.select_cancelling(grace_ms=GRACE_MS, limit=limit),
        {"grace_ms": GRACE_MS, "job_id": None},
    ),
    "select_orphans": (
        lambda: running(lease_expires_at=-60),
        store.SELECT_ORPHANS,
        lambda limit: store.select_orphans(grace_ms=GRACE_MS, limit=limit),
        {"grace_ms": GRACE_MS, "job_id": None},
    ),
    "select_stale_pending": (
        lambda: JobFactory(pending_since=-300, next_run_at=-300),
        store.SELECT_STALE_PENDING,
        lambda limit: store.select_stale_pending(
            queues=["default"], pending_ttl_ms=60_000, limit=limit
        ),
        {"pending_ttl_ms": 60_000, "queues": ["default"]},
    ),
    "select_parked_untold": (
        lambda: _parked("poison"),
        store.SELECT_PARKED_UNTOLD,
        lambda limit: store.select_parked_untold({"tests.noop": 3}, limit=limit),
        {"kinds": ["tests.noop"], "bounds": [3], "job_id": None},
    ),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", SELECTIONS)
def test_selection__two_reconcilers_side_by_side_take_disjoint_rows(name, other_connection):
    """Invariant 14: FOR UPDATE SKIP LOCKED; the second reconciler neither waits nor
    takes what the first holds."""
    build, sql, select, params = SELECTIONS[name]
    ids = {build().id for _ in range(4)}

    with other_connection.transaction():
        other_connection.execute("SET LOCAL lock_timeout = '2s'")
        theirs = {
            row[0] for row in other_connection.execute(sql, {**params, "limit": 2, "tenant": None})
        }
        with transaction.atomic():
            _fail_fast_on_locks()
            ours = {j.id for j in select(10)}

    assert len(theirs) == 2
    assert ours == ids - theirs


@pytest.mark.django_db
def test_record_enqueue__refused_for_a_job_under_a_live_claim():
    """A broker bookkeeping write never touches a job someone is running."""
    job = running()
    assert store.record_enqueue(job.id, "msg-1", "default", delivery_of(job)) is False
    assert reload(job).queue_job_id is None


# ---------------------------------------------------------------------------------------
# Reconciler leadership: acquire_leadership, resign_leadership (invariant 14)
# ---------------------------------------------------------------------------------------

LEADER = "reconciler"


def _expire_leader(name=LEADER):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_leader SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE name = %s",
            [name],
        )


def _leader_row(name=LEADER):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT owner, epoch, expires_at - clock_timestamp()"
            " FROM durable_jobs_leader WHERE name = %s",
            [name],
        )
        return cursor.fetchone()


@pytest.mark.django_db
def test_acquire_leadership__takes_a_free_name_and_renews_it_for_the_same_owner():
    """Invariant 14: the first worker leads; renewing keeps the epoch and moves the expiry on
    from the database clock."""
    assert store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000) == 1
    assert store.acquire_leadership(LEADER, "host:1:a", ttl_ms=90_000) == 1
    owner, epoch, left = _leader_row()
    assert (owner, epoch) == ("host:1:a", 1)
    assert timedelta(seconds=85) < left <= timedelta(seconds=90)


@pytest.mark.django_db
def test_acquire_leadership__refused_while_another_owner_s_lease_is_live():
    """Invariant 14: one leader at a time."""
    store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000)
    assert store.acquire_leadership(LEADER, "host:2:b", ttl_ms=60_000) is None
    assert _leader_row()[:2] == ("host:1:a", 1)


@pytest.mark.django_db
def test_acquire_leadership__takes_over_only_after_expiry_with_the_epoch_bumped():
    """Invariant 14: leadership leaves a dead leader once its lease expires; the takeover is a
    new epoch, and the old leader's renewal is then refused."""
    store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000)
    _expire_leader()
    assert store.acquire_leadership(LEADER, "host:2:b", ttl_ms=60_000) == 2
    assert store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000) is None, (
        "the old leader lost it"
    )
    assert _leader_row()[:2] == ("host:2:b", 2)


@pytest.mark.django_db
def test_resign_leadership__frees_the_name_at_once_for_the_next_epoch():
    """Invariant 14: a graceful stop moves leadership without waiting out the lease."""
    store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000)
    assert store.resign_leadership(LEADER, "host:2:b") is False, "only the holder resigns"
    assert store.acquire_leadership(LEADER, "host:2:b", ttl_ms=60_000) is None
    assert store.resign_leadership(LEADER, "host:1:a") is True
    assert store.acquire_leadership(LEADER, "host:2:b", ttl_ms=60_000) == 2
    assert store.resign_leadership(LEADER, "host:1:a") is False, (
        "a resigned leader cannot resign its successor"
    )
    assert store.acquire_leadership(LEADER, "host:1:a", ttl_ms=60_000) is None


@pytest.mark.django_db
def test_acquire_leadership__one_leadership_per_name():
    """A fleet sharded by tenant has one leader per shard."""
    assert store.acquire_leadership("reconciler:tenant:a", "host:1:a", ttl_ms=60_000) == 1
    assert store.acquire_leadership("reconciler:tenant:b", "host:2:b", ttl_ms=60_000) == 1
    assert store.acquire_leadership("reconciler:tenant:a", "host:2:b", ttl_ms=60_000) is None
