"""Unique jobs by arguments (invariant 25): one job per kind, scope and selected input
while its key covers it; a second start gets the holder back, flagged ``deduplicated``."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.models import Job
from durable_jobs.states import Delivery, Lease, Scope
from testproject.demo.models import Report
from tests.factories import reload

pytestmark = pytest.mark.django_db

KIND = "tests.unique"
HOUR = 3600


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    kinds.add("tests.unique_other")
    kinds.add("tests.unique_by_customer", unique=["customer"])
    return KIND


def _claim(job) -> Lease:
    scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
    delivery = Delivery(seq=job.continuation_seq, redrives=job.redrives)
    claimed = store.claim(job.id, scope, delivery, "w", 60_000)
    assert claimed is not None
    return Lease(job_id=job.id, owner="w", epoch=claimed.lease_epoch, ttl_ms=60_000)


def _complete(job) -> None:
    assert store.complete(_claim(job)) is not None


def _fail(job) -> None:
    lease = _claim(job)
    assert store.fail_terminal(lease, error_class="terminal", code="boom", message="no") is not None


def _into_the_last_window(job) -> None:
    """Pretend ``job`` started one period ago: its window becomes the previous one."""
    period, index = job.unique_window.split(":")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_job SET unique_window = %s WHERE id = %s",
            [f"{period}:{int(index) - 1}", job.id],
        )


# ---------------------------------------------------------------------------------------
# What a second start gets
# ---------------------------------------------------------------------------------------


def test_unique__a_second_start_with_the_same_input_gets_the_first_job_flagged(kind):
    first = durable.start(kind, input={"customer": 7, "plan": "pro"}, unique=True)
    second = durable.start(kind, input={"plan": "pro", "customer": 7}, unique=True)

    assert second.id == first.id
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert Job.objects.count() == 1


def test_unique__the_returned_job_is_the_row_as_stored(kind):
    job = durable.start(kind, input={"a": 1}, unique=durable.Unique(period=HOUR))
    stored = durable.get(job.id)
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert stored.unique_states == ["pending", "running", "completed"]
    assert stored.unique_window.startswith("3600000:")


def test_unique__the_whole_input_is_compared_unless_fields_are_chosen(kind):
    a = durable.start(kind, input={"customer": 7, "plan": "pro"}, unique=True)
    b = durable.start(kind, input={"customer": 7, "plan": "free"}, unique=True)
    assert a.id != b.id and not b.deduplicated

    c = durable.start(kind, input={"customer": 8, "plan": "pro"}, unique=["customer"])
    d = durable.start(kind, input={"customer": 8, "plan": "free"}, unique=["customer"])
    assert d.id == c.id and d.deduplicated
    assert d.input == {"customer": 8, "plan": "pro"}, "the holder's own input comes back"


def test_unique__kinds_never_answer_for_each_other(kind):
    a = durable.start(kind, input={"n": 1}, unique=True)
    b = durable.start("tests.unique_other", input={"n": 1}, unique=True)
    assert a.id != b.id and not b.deduplicated


def test_unique__a_scope_never_answers_for_another(kind):
    """Invariant 10: tenant A's key never answers tenant B, nor an organization the
    tenant-wide scope (a null organization is a value)."""
    started = [
        durable.start(kind, input={"n": 1}, unique=True, scope=scope)
        for scope in ("tenant-a", "tenant-b", ("tenant-a", "org-1"), ("tenant-a", None))
    ]
    assert len({job.id for job in started}) == 3
    assert started[3].id == started[0].id and started[3].deduplicated
    assert not any(job.deduplicated for job in started[:3])


def test_unique__a_start_without_unique_is_unaffected_by_a_holder(kind):
    first = durable.start(kind, input={"n": 1}, unique=True)
    plain = durable.start(kind, input={"n": 1})
    assert plain.id != first.id and plain.deduplicated is False
    assert plain.unique_key is None


# ---------------------------------------------------------------------------------------
# Which states a key covers
# ---------------------------------------------------------------------------------------


def test_unique__a_running_job_holds_its_live_key_and_a_completed_one_frees_it(kind):
    first = durable.start(kind, input={"n": 1}, unique=True)
    lease = _claim(first)
    assert durable.start(kind, input={"n": 1}, unique=True).id == first.id

    assert store.complete(lease) is not None
    after = durable.start(kind, input={"n": 1}, unique=True)
    assert after.id != first.id and not after.deduplicated


def test_unique__a_yielded_job_keeps_its_key(kind):
    first = durable.start(kind, input={"n": 1}, unique=True)
    lease = _claim(first)
    assert store.yield_slice(lease, delay_ms=0) is not None
    assert reload(first).status == "pending"
    assert durable.start(kind, input={"n": 1}, unique=True).id == first.id


def test_unique__a_job_completed_within_the_period_blocks_until_the_next_period(kind):
    hourly = durable.Unique(period=HOUR)
    first = durable.start(kind, input={"n": 1}, unique=hourly)
    _complete(first)

    again = durable.start(kind, input={"n": 1}, unique=hourly)
    assert again.id == first.id and again.deduplicated
    assert again.status == "completed"

    _into_the_last_window(first)
    fresh = durable.start(kind, input={"n": 1}, unique=hourly)
    assert fresh.id != first.id and not fresh.deduplicated


def test_unique__a_live_job_from_an_earlier_period_still_holds_its_key(kind):
    """Live jobs are always covered: a period adds finished ones, it never frees a live one
    (where a key holding only the window would let a second run start at the boundary)."""
    hourly = durable.Unique(period=HOUR)
    first = durable.start(kind, input={"n": 1}, unique=hourly)
    _into_the_last_window(first)
    assert durable.start(kind, input={"n": 1}, unique=hourly).id == first.id


def test_unique__a_failed_job_is_covered_only_when_its_states_say_so(kind):
    completed_only = durable.Unique(period=HOUR)
    failed = durable.start(kind, input={"n": 1}, unique=completed_only)
    _fail(failed)
    assert durable.start(kind, input={"n": 1}, unique=completed_only).id != failed.id

    any_outcome = durable.Unique(period=HOUR, states=["pending", "running", "failed", "completed"])
    failed = durable.start(kind, input={"n": 2}, unique=any_outcome)
    _fail(failed)
    assert durable.start(kind, input={"n": 2}, unique=any_outcome).id == failed.id


def test_unique__an_operator_redrive_refuses_to_make_a_second_job_on_the_key(kind):
    failed = durable.start(kind, input={"n": 1}, unique=True)
    _fail(failed)
    holder = durable.start(kind, input={"n": 1}, unique=True)
    assert holder.id != failed.id

    with transaction.atomic():
        with pytest.raises(durable.UniqueKeyHeld) as caught:
            durable.redrive(failed.id)
        Report.objects.create(name="the transaction is still usable")
    assert caught.value.unique_key == holder.unique_key
    assert reload(failed).status == "failed"


# ---------------------------------------------------------------------------------------
# The kind's default, and keys side by side
# ---------------------------------------------------------------------------------------


def test_unique__the_kinds_registration_is_the_default_and_a_start_overrides_it(kind):
    by_customer = "tests.unique_by_customer"
    first = durable.start(by_customer, input={"customer": 1, "note": "a"})
    assert durable.start(by_customer, input={"customer": 1, "note": "b"}).id == first.id

    off = durable.start(by_customer, input={"customer": 1}, unique=False)
    assert off.id != first.id and off.unique_key is None

    whole = durable.start(by_customer, input={"customer": 1, "note": "c"}, unique=True)
    assert whole.id != first.id and not whole.deduplicated


def test_unique__an_idempotency_key_answers_before_the_unique_key(kind):
    first = durable.start(kind, input={"n": 1}, unique=True, idempotency_key="req-1")
    retried = durable.start(kind, input={"n": 1}, unique=True, idempotency_key="req-1")
    assert retried.id == first.id and not retried.deduplicated

    # Another request for the same input is deduplicated onto the holder; its own
    # idempotency key is not recorded, so its retry is answered the same way.
    other = durable.start(kind, input={"n": 1}, unique=True, idempotency_key="req-2")
    assert other.id == first.id and other.deduplicated
    assert not Job.objects.filter(idempotency_key="req-2").exists()


def test_unique__a_unique_holder_answers_before_a_lock_key_refusal(kind):
    first = durable.start(kind, input={"n": 1}, unique=True, lock_key="report:1")
    again = durable.start(kind, input={"n": 1}, unique=True, lock_key="report:1")
    assert again.id == first.id and again.deduplicated
    with pytest.raises(durable.LockKeyHeld):
        durable.start(kind, input={"n": 2}, unique=True, lock_key="report:1")


def test_unique__bad_values_are_refused_in_one_line_before_anything_is_written(kind):
    for bad, says in [
        ("yes", "unique: must be True, a list of input keys or a durable.Unique"),
        ([], "unique: is empty"),
    ]:
        with pytest.raises(durable.InvalidInput) as caught:
            durable.start(kind, input={"n": 1}, unique=bad)
        assert str(caught.value).startswith(says) and "\n" not in str(caught.value)
    with pytest.raises(durable.InvalidInput, match="the input must be a JSON object"):
        durable.start(kind, input=[1, 2], unique=["n"])
    assert Job.objects.count() == 0


def test_unique__a_start_without_unique_runs_the_one_statement_it_always_did(kind):
    """Issue #27 measures start cost: no unique key, no lookup, no other insert."""
    with CaptureQueriesContext(connection) as queries:
        durable.start(kind, input={"n": 1})
    [statement] = [q["sql"] for q in queries.captured_queries]
    assert statement.startswith("\nINSERT INTO durable_jobs_job") and "unique_" not in statement


def test_unique__the_holder_lookup_reads_the_two_partial_indexes(kind):
    """Uniqueness costs what the key's jobs number, not the table: each branch of the
    lookup spells its index's predicate, so the planner can read that index."""
    durable.start(kind, input={"n": 1}, unique=durable.Unique(period=HOUR))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        # On a table this small the tenant's index is as cheap; a tenant with millions of
        # finished rows is where it is not. Without it, the lookup must have a way in.
        cursor.execute("DROP INDEX durable_jobs_tenant_recent")
        cursor.execute(
            "EXPLAIN " + store.FIND_UNIQUE_HOLDERS,
            {
                "tenant": "default",
                "organization": None,
                "keys": '[{"unique_key": "k", "period_ms": 3600000}]',
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "durable_jobs_unique_live" in plan and "durable_jobs_unique_window" in plan, plan


# ---------------------------------------------------------------------------------------
# start_many
# ---------------------------------------------------------------------------------------


def test_start_many__repeats_answer_with_the_first_row_and_held_keys_with_the_holder(kind):
    holder = durable.start(kind, input={"n": 0}, unique=True)
    ids = durable.start_many(
        [
            {"kind": kind, "input": {"n": 1}, "unique": True},
            {"kind": kind, "input": {"n": 0}, "unique": True},
            {"kind": kind, "input": {"n": 1}, "unique": True},
            {"kind": kind, "input": {"n": 1}},
        ]
    )
    assert ids[1] == holder.id
    assert ids[2] == ids[0] != holder.id
    assert ids[3] not in (ids[0], holder.id), "a row without unique is its own job"
    assert Job.objects.count() == 3


def test_start_many__takes_the_kinds_default_and_each_rows_override(kind):
    by_customer = "tests.unique_by_customer"
    ids = durable.start_many(
        [
            {"kind": by_customer, "input": {"customer": 1, "note": "a"}},
            {"kind": by_customer, "input": {"customer": 1, "note": "b"}},
            {"kind": by_customer, "input": {"customer": 1, "note": "c"}, "unique": False},
        ]
    )
    assert ids[0] == ids[1] != ids[2]


def test_start_many__is_all_or_nothing_with_unique_rows(kind):
    durable.start(kind, lock_key="report:1")
    with transaction.atomic():
        with pytest.raises(durable.LockKeyHeld):
            durable.start_many(
                [
                    {"kind": kind, "input": {"n": 1}, "unique": True},
                    {"kind": kind, "input": {"n": 2}, "unique": True, "lock_key": "report:1"},
                ]
            )
        Report.objects.create(name="still usable")
    assert Job.objects.count() == 1


def test_start_many__an_idempotency_key_repeated_in_the_batch_gets_one_answer(kind):
    holder = durable.start(kind, input={"n": 1}, unique=True)
    ids = durable.start_many(
        [
            {"kind": kind, "input": {"n": 1}, "unique": True, "idempotency_key": "r"},
            {"kind": kind, "input": {"n": 9}, "idempotency_key": "r"},
        ]
    )
    assert ids == [holder.id, holder.id]
    assert Job.objects.count() == 1


def test_unique__a_unique_holder_answers_before_a_wait_key(kind):
    after = {"after": "2020-01-01T00:00:00Z"}
    first = durable.start(kind, input={"n": 1}, unique=True, wait_for=[after], wait_key="t/1")
    again = durable.start(kind, input={"n": 1}, unique=True, wait_for=[after], wait_key="t/1")
    assert again.id == first.id and again.deduplicated and not again.coalesced

    other = durable.start(kind, input={"n": 2}, unique=True, wait_for=[after], wait_key="t/1")
    assert other.id == first.id and other.coalesced and not other.deduplicated


def test_unique__without_an_input_a_kind_has_one_live_job_per_scope(kind):
    singleton = durable.start(kind, unique=True)
    assert durable.start(kind, unique=True).id == singleton.id
    assert durable.start(kind, unique=True, scope="tenant-b").id != singleton.id


def test_unique__the_app_passes_django_s_checks_without_django_contrib_postgres(kind):
    # The key's status list is a PostgreSQL array. Django's own ArrayField would demand
    # django.contrib.postgres in INSTALLED_APPS (postgres.E005 on Django 6.1), and every
    # worker's start-up check would refuse to run in a project without it.
    from django.conf import settings
    from django.core import checks

    assert "django.contrib.postgres" not in settings.INSTALLED_APPS
    errors = [m for m in checks.run_checks() if m.level >= checks.ERROR]
    assert errors == []
    job = durable.start(
        kind,
        input={"a": 1},
        unique=durable.Unique(period=60, states=["pending", "running", "failed"]),
    )
    assert reload(job).unique_states == ["pending", "running", "failed"]
