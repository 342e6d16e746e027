"""Invariant 4 (the delivery fence) and DESIGN §6 (the database transport): ``claim`` and
``dequeue``, each success and every "does not apply when…" case."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from durable_jobs import store
from durable_jobs.states import Delivery, Scope
from tests.factories import JobFactory, reload, running
from tests.integration.support import (  # noqa: F401  (other_connection, prepare_threshold: fixtures)
    DEFAULT_SCOPE,
    db_now,
    delivery_of,
    lease_of,
    other_connection_fixture,
    pages_read,
    prepare_threshold_fixture,
    prepared_statements,
    snapshot,
)

# ---------------------------------------------------------------------------------------
# claim
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_claim__takes_the_lease_of_a_pending_job_on_the_database_clock():
    """Invariant 4: a claim bumps the epoch, names the owner, consumes the delivery."""
    job = JobFactory(lease_epoch=4, next_run_at=-5)
    before = db_now()
    claimed = store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000)
    after = db_now()

    assert claimed is not None
    assert claimed.status == "running"
    assert claimed.lease_owner == "worker-b"
    assert claimed.lease_epoch == 5
    assert (
        before + timedelta(seconds=30) <= claimed.lease_expires_at <= after + timedelta(seconds=30)
    )
    assert claimed.next_run_at is None and claimed.pending_since is None
    assert claimed.started_at is not None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("seq", "redrives"),
    [(2, 1), (3, 0), (4, 1), (2, 0)],
    ids=["older-seq", "older-redrives", "newer-seq", "both-older"],
)
def test_claim__refuses_a_straggling_delivery(seq, redrives):
    """Invariant 4: only the delivery ``(continuation_seq, redrives)`` the row carries may claim."""
    job = JobFactory(continuation_seq=3, redrives=1)
    before = snapshot(job)

    assert (
        store.claim(job.id, DEFAULT_SCOPE, Delivery(seq=seq, redrives=redrives), "late", 30_000)
        is None
    )
    assert snapshot(job) == before
    assert (
        store.claim(job.id, DEFAULT_SCOPE, Delivery(seq=3, redrives=1), "current", 30_000)
        is not None
    )


@pytest.mark.django_db
def test_claim__refuses_while_a_lease_is_live():
    """Invariant 4: a claim requires a free or expired lease, even for the current delivery."""
    job = running(lease_expires_at=5)
    before = snapshot(job)

    assert store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000) is None
    assert snapshot(job) == before


@pytest.mark.django_db
def test_claim__accepts_once_the_lease_expired_and_fences_out_the_old_holder():
    """Invariant 4: an expired lease may be claimed; the epoch bump stops the old holder."""
    job = running(lease_expires_at=-1)
    old = lease_of(job)

    claimed = store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000)

    assert claimed is not None and claimed.lease_epoch == job.lease_epoch + 1
    assert store.heartbeat(old) is None
    assert store.heartbeat(lease_of(claimed)) is False


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_claim__refuses_a_finished_job(status):
    """Invariant 4 / 13: only live rows (pending, running) can be claimed."""
    job = JobFactory(status=status, next_run_at=None, lease_expires_at=-10, finished_at=-5)
    assert store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000) is None
    assert reload(job).status == status


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("row_org", "scope"),
    [
        (None, Scope(tenant="other")),
        (None, Scope(tenant="default", organization="acme")),
        ("acme", Scope(tenant="default")),
        ("acme", Scope(tenant="default", organization="umbrella")),
    ],
    ids=[
        "other-tenant",
        "org-scope-on-tenant-wide-row",
        "tenant-wide-scope-on-org-row",
        "other-org",
    ],
)
def test_claim__refuses_another_scope(row_org, scope):
    """Invariant 10: a claim by id carries the exact scope; a null organization is a value."""
    job = JobFactory(organization_id=row_org)
    assert store.claim(job.id, scope, delivery_of(job), "worker-b", 30_000) is None
    assert reload(job).status == "pending"
    own = Scope(tenant="default", organization=row_org)
    assert store.claim(job.id, own, delivery_of(job), "worker-b", 30_000) is not None


# ---------------------------------------------------------------------------------------
# dequeue
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_dequeue__claims_a_due_pending_job():
    """Invariant 4 / DESIGN §6: the database transport claims like ``claim``: epoch + 1, an owner,
    the delivery consumed."""
    job = JobFactory(next_run_at=-1, lease_epoch=2)

    [claimed] = store.dequeue(["default"], "host-1", 30_000, kinds=None)

    assert claimed.id == job.id
    assert claimed.status == "running"
    assert claimed.lease_epoch == 3
    assert claimed.lease_owner.startswith("host-1")
    assert claimed.next_run_at is None
    assert claimed.lease_expires_at > db_now() + timedelta(seconds=29)


@pytest.mark.django_db
def test_dequeue__is_prepared_only_where_the_connection_prepares_statements(prepare_threshold):
    """Django's default prepares nothing (a transaction-mode pooler stays safe); a
    connection that prepares statements gets the claim prepared, planned once instead of
    on every claim, and it claims the same rows, floors and kinds included."""
    jobs = [JobFactory(next_run_at=-30 + i) for i in range(6)]
    floor = [("default", 0, db_now() - timedelta(minutes=5))]

    def claim_two():
        return store.dequeue_from(
            ["default"], "host-1", 30_000, kinds=["tests.noop"], limit=2, floors=floor
        )

    plain = claim_two()
    assert prepared_statements("%FOR UPDATE SKIP LOCKED%") == 0
    prepare_threshold(0)
    prepared = claim_two() + claim_two()

    assert prepared_statements("%FOR UPDATE SKIP LOCKED%") == 1
    assert [job.id for job, _ in plain + prepared] == [job.id for job in jobs]
    assert all(job.lease_owner == f"host-1:{job.id}" for job, _ in plain + prepared)


@pytest.mark.django_db
def test_dequeue__takes_only_the_queues_asked_for():
    """DESIGN §6: a worker claims only from the queues it serves."""
    JobFactory(queue_name="mail", next_run_at=-1)
    wanted = JobFactory(queue_name="reports", next_run_at=-1)

    claimed = store.dequeue(["reports", "nothing"], "host-1", 30_000, kinds=None, limit=10)

    assert [j.id for j in claimed] == [wanted.id]


@pytest.mark.django_db
def test_dequeue__claims_only_the_kinds_it_is_given():
    """Invariant 14b: a job of a kind the worker cannot run is neither claimed nor locked,
    and does not stand in the way of one behind it that the worker can run."""
    unknown = JobFactory(kind="tests.new_in_the_next_deploy", next_run_at=-2, priority=5)
    known = JobFactory(kind="tests.known", next_run_at=-1)

    claimed = store.dequeue(["default"], "host-1", 30_000, kinds=["tests.known"], limit=10)

    assert [j.id for j in claimed] == [known.id]
    left = reload(unknown)
    assert (left.status, left.lease_epoch, left.lease_owner) == (
        "pending",
        unknown.lease_epoch,
        None,
    )
    assert store.dequeue(["default"], "host-1", 30_000, kinds=[], limit=10) == []
    [later] = store.dequeue(
        ["default"], "host-2", 30_000, kinds=["tests.new_in_the_next_deploy"], limit=10
    )
    assert later.id == unknown.id


@pytest.mark.django_db
def test_dequeue__takes_higher_priority_first_then_earlier_run_time():
    """DESIGN §6: candidates are taken by ``priority DESC, next_run_at``."""
    low_old = JobFactory(priority=1, next_run_at=-60)
    high_new = JobFactory(priority=9, next_run_at=-1)
    high_old = JobFactory(priority=9, next_run_at=-30)

    first = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=1)
    second = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=1)
    third = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=1)

    assert [j.id for j in first + second + third] == [high_old.id, high_new.id, low_old.id]


@pytest.mark.django_db
def test_dequeue__one_batch_spans_priority_levels_and_queues_in_order():
    """DESIGN §6: a batch walks the levels highest first, passing over rows not yet due."""
    top = JobFactory(priority=9, next_run_at=-5)
    JobFactory(priority=9, next_run_at=60)  # not due: must not end the walk of its level
    JobFactory(priority=5, next_run_at=60)  # a level with nothing due
    mid_old = JobFactory(priority=3, next_run_at=-40, queue_name="mail")
    mid_new = JobFactory(priority=3, next_run_at=-20)
    low = JobFactory(priority=-4, next_run_at=-90)
    JobFactory(priority=-4, next_run_at=-100, queue_name="elsewhere")  # a queue not asked for

    claimed = store.dequeue(["default", "mail"], "host-1", 30_000, kinds=None, limit=3)
    rest = store.dequeue(["default", "mail"], "host-1", 30_000, kinds=None, limit=3)

    assert [j.id for j in claimed] == [top.id, mid_old.id, mid_new.id]
    assert [j.id for j in rest] == [low.id]


@pytest.mark.django_db
def test_dequeue__a_batch_comes_back_in_run_order_whatever_plan_joins_it():
    """A slot runs a batch in the order the claim returns it. The claim's UPDATE returns
    rows in the order its plan joins them: with a hash join, the table's physical order,
    here lowest priority and newest first. The batch still comes back by priority, then
    run time."""
    low = JobFactory(priority=1, next_run_at=-10)
    mid_new = JobFactory(priority=5, next_run_at=-5)
    mid_old = JobFactory(priority=5, next_run_at=-30)
    high = JobFactory(priority=9, next_run_at=-1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute("SET LOCAL enable_mergejoin = off")
        claimed = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=4)

    assert [job.id for job in claimed] == [high.id, mid_old.id, mid_new.id, low.id]


@pytest.mark.django_db
def test_dequeue__does_not_read_the_rows_scheduled_later_at_a_higher_priority():
    """A claim costs the same beside a mass of future work (retries, held waits, schedules).

    20,000 rows due tomorrow at priority 7 sit before the one due priority-0 row in the
    dequeue index. Reading them all on every claim (as a single scan in priority order
    does) turned each claim into a scan of the whole future. Counted in buffers, not time.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {store.TABLE} (id, tenant_id, kind, status, created_at, updated_at,"
            " queue_name, priority, next_run_at, pending_since)"
            " SELECT gen_random_uuid(), 'default', 'test.later', 'pending', now(), now(),"
            "        'default', 7, now() + interval '1 day', now() FROM generate_series(1, 20000)"
        )
        cursor.execute(f"ANALYZE {store.TABLE}")
    due = JobFactory(priority=0, next_run_at=-1)
    params = store.claim_params(["default"], "host-1", 30_000, kinds=None)

    buffers = pages_read(store.DEQUEUE, params)

    assert buffers < 200, f"the claim read {buffers} pages for one due row"
    assert [j.id for j in store.dequeue(["default"], "host-1", 30_000, kinds=None)] == [due.id]


@pytest.mark.django_db
def test_dequeue__skips_a_job_whose_run_time_has_not_come():
    """Invariant 2 / DESIGN §6: due means ``next_run_at <= clock_timestamp()``."""
    future = JobFactory(next_run_at=30)

    assert store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10) == []
    assert reload(future).status == "pending"


@pytest.mark.django_db
def test_dequeue__skips_a_job_whose_cancellation_was_requested():
    """Invariant 8: a cancel-requested pending job is for the reconciler to end, not to run."""
    JobFactory(next_run_at=-1, cancel_requested_at=-1)
    assert store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10) == []


@pytest.mark.django_db
def test_dequeue__skips_a_job_under_a_live_claim_and_finished_jobs():
    """Invariant 4: a leased row (even expired: the reconciler's orphan) or a finished row is no
    delivery."""
    running(
        next_run_at=-1, lease_expires_at=-100
    )  # leased (even expired): an orphan, not a delivery
    JobFactory(status="completed", next_run_at=-1, finished_at=-1)
    JobFactory(status="failed", next_run_at=-1, finished_at=-1)

    assert store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10) == []


@pytest.mark.django_db
def test_dequeue__delivers_a_failed_slice_waiting_for_its_retry():
    """DESIGN §6 / §4: ``running`` with a released lease and a due ``next_run_at`` is deliverable.
    DESIGN §6 / §4: ``running`` with a released lease and a due ``next_run_at`` is deliverable."""
    job = running(lease_owner=None, lease_expires_at=-5, next_run_at=-1, consecutive_failures=1)

    [claimed] = store.dequeue(["default"], "host-1", 30_000, kinds=None)

    assert claimed.id == job.id
    assert claimed.lease_epoch == job.lease_epoch + 1
    assert claimed.consecutive_failures == 1  # a claim spends nothing


@pytest.mark.django_db
def test_dequeue__gives_each_claimed_row_its_own_owner_and_epoch():
    """Invariant 4 per row: a batched claim must not hand two rows the same lease."""
    jobs = [JobFactory(next_run_at=-3 + i, lease_epoch=epoch) for i, epoch in enumerate((0, 4, 7))]

    claimed = {j.id: j for j in store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10)}

    assert set(claimed) == {j.id for j in jobs}
    assert len({j.lease_owner for j in claimed.values()}) == 3
    for job in jobs:
        assert claimed[job.id].lease_epoch == job.lease_epoch + 1
    # Each lease fences its own row only: one row's owner cannot write another row.
    a, b = jobs[0], jobs[1]
    assert store.heartbeat(lease_of(claimed[a.id])) is False
    forged = lease_of(claimed[b.id], owner=claimed[a.id].lease_owner)
    assert store.heartbeat(forged) is None


@pytest.mark.django_db
def test_dequeue__claims_at_most_the_limit():
    """STYLE habit 3: the LIMIT sits in the locked candidate set; a batch never over-claims."""
    for i in range(5):
        JobFactory(next_run_at=-10 + i)

    first = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=3)
    second = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=3)
    third = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=3)

    assert (len(first), len(second), len(third)) == (3, 2, 0)
    assert {j.id for j in first}.isdisjoint({j.id for j in second})


@pytest.mark.django_db(transaction=True)
def test_dequeue__skips_rows_locked_by_another_transaction(other_connection):
    """Invariant 14 / DESIGN §6: SKIP LOCKED; a row another transaction holds is passed over, not
    waited for."""
    locked = JobFactory(priority=9, next_run_at=-5)
    free = JobFactory(priority=1, next_run_at=-1)

    with other_connection.transaction():
        other_connection.execute(
            "SELECT id FROM durable_jobs_job WHERE id = %s FOR UPDATE", [locked.id]
        )
        with transaction.atomic():
            with connection.cursor() as cursor:
                # Without SKIP LOCKED this would wait for the other transaction: fail fast.
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            claimed = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10)

    assert [j.id for j in claimed] == [free.id]
    assert reload(locked).status == "pending"
    assert [j.id for j in store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10)] == [
        locked.id
    ]


@pytest.mark.django_db(transaction=True)
def test_dequeue__two_workers_at_once_claim_disjoint_rows(other_connection):
    """Invariant 4 / DESIGN §6: the claim is one statement with SKIP LOCKED inside, so concurrent
    dequeues never hand one row to two workers."""
    ids = {JobFactory(next_run_at=-1).id for _ in range(4)}

    with other_connection.transaction():
        theirs = other_connection.execute(
            store.DEQUEUE,
            store.claim_params(["default"], "host-2", 30_000, kinds=None, limit=2),
        ).fetchall()
        ours = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=10)

    their_ids = {row[0] for row in theirs}
    assert len(their_ids) == 2
    assert {j.id for j in ours} == ids - their_ids
    assert all(reload(i).lease_owner.startswith("host-2") for i in their_ids)


@pytest.mark.django_db(transaction=True)
def test_a_claimed_batch_reads_its_timestamps_exactly_as_the_orm_does():
    """The claim reads timestamptz with psycopg's C loader (Django's own is Python): the
    values, and their tzinfo, must be what a model read through the ORM gives."""
    import datetime

    from django.db.models import DateTimeField

    from durable_jobs.models import Job

    JobFactory.create_batch(3)
    claimed = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=3)
    assert len(claimed) == 3
    stamps = [f.attname for f in Job._meta.fields if isinstance(f, DateTimeField)]
    for job in claimed:
        orm = Job.objects.get(id=job.id)
        for name in stamps:
            ours, theirs = getattr(job, name), getattr(orm, name)
            assert ours == theirs, name
            if ours is not None:
                assert ours.tzinfo is theirs.tzinfo is datetime.timezone.utc, name
    assert claimed[0].started_at is not None and claimed[0].lease_expires_at > claimed[0].started_at


@pytest.mark.django_db
def test_claim__refuses_a_job_whose_cancellation_was_requested():
    """Invariants 8 and 31: a RabbitMQ message cannot be taken back from its queue, so a
    cancelled job's delivery must fail the claim; the reconciler's cancel step ends the
    job. Before this predicate the claim ran a slice of a cancelled job."""
    job = JobFactory(cancel_requested_at=-1)
    before = snapshot(job)

    assert store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000) is None
    assert snapshot(job) == before


@pytest.mark.django_db
def test_claim__a_projects_post_init_listener_sees_the_claimed_job():
    """A claim builds its ``Job`` without ``Model.__init__`` while nobody listens, and through
    ``from_db`` (signals and all) once a project connects to ``pre_init`` or ``post_init``."""
    from django.db.models.signals import post_init

    from durable_jobs.models import Job

    job = JobFactory(next_run_at=-5)
    seen = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.id)

    post_init.connect(listener, sender=Job)
    try:
        claimed = store.claim(job.id, DEFAULT_SCOPE, delivery_of(job), "worker-b", 30_000)
    finally:
        post_init.disconnect(listener, sender=Job)
    assert claimed is not None and claimed.status == "running"
    assert seen == [job.id]

    other = JobFactory(next_run_at=-5)
    store.claim(other.id, DEFAULT_SCOPE, delivery_of(other), "worker-b", 30_000)
    assert seen == [job.id]
