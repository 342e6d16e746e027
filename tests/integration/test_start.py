"""``durable_jobs.start``: what it writes, idempotency, lock keys, scheduling on the
database clock, and refusing bad input before anything is written (invariants 9, 10, 23)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection, transaction
from django.db.models import NOT_PROVIDED
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.exceptions import IdempotencyConflict, InvalidInput, LockKeyHeld, UnknownKind
from durable_jobs.models import Job
from durable_jobs.states import Delivery, Lease, Scope
from testproject.demo.models import Report
from tests.integration.support import (  # noqa: F401  (prepare_threshold: a fixture)
    SLACK,
    db_now,
    prepare_threshold_fixture,
    prepared_statements,
)

KIND = "tests.start"


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    kinds.add("tests.other")
    kinds.add("tests.queued", queue="reports")
    return KIND


def store_delivery(job) -> Delivery:
    return Delivery(seq=job.continuation_seq, redrives=job.redrives)


def _finish(job) -> None:
    """End a job through the store, as a worker would (claim, then the terminal CAS)."""
    scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
    claimed = store.claim(job.id, scope, store_delivery(job), "w", 60_000)
    assert (
        store.complete(Lease(job_id=job.id, owner="w", epoch=claimed.lease_epoch, ttl_ms=60_000))
        is not None
    )


# ---------------------------------------------------------------------------------------
# What start writes
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start__writes_a_pending_job_due_now(kind):
    """Invariants 2 and 9: the row, in the caller's transaction, due now on the database clock."""
    before = db_now()
    report = Report.objects.create(name="q3")

    job = durable.start(
        kind,
        input={"report": report.pk, "tags": ["a", "ü"]},
        subject=report,
        meta={"by": "test"},
        priority=7,
        total_count=40,
        created_by="alice",
    )

    row = durable.get(job.id)
    assert row.status == "pending"
    assert (row.tenant_id, row.organization_id, row.kind) == ("default", None, kind)
    assert row.input == {"report": report.pk, "tags": ["a", "ü"]}
    assert row.meta == {"by": "test"}
    assert (row.subject_type, row.subject_id) == ("demo.report", str(report.pk))
    assert (row.priority, row.total_count, row.created_by, row.queue_name) == (
        7,
        40,
        "alice",
        "default",
    )
    assert (row.lease_epoch, row.continuation_seq, row.redrives) == (0, 0, 0)
    assert before - SLACK <= row.next_run_at <= db_now()


@pytest.mark.django_db
def test_start__ids_are_time_ordered_so_the_primary_key_grows_at_its_right_edge(kind):
    """Issue #14: version 7 ids, in start order, for start() and start_many() alike."""
    one = durable.start(kind)
    many = durable.start_many([{"kind": kind} for _ in range(3)])
    two = durable.start(kind)
    ids = [one.id, *many, two.id]
    assert all(job_id.version == 7 for job_id in ids)
    assert ids == sorted(ids)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM durable_jobs_job ORDER BY id")
        assert [row[0] for row in cursor.fetchall()] == ids


@pytest.mark.django_db
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "input": {"b": 1, "a": [1.5, None, "ü"], "n": 10**20},
            "meta": {"z": {"y": True}},
            "priority": -3,
            "total_count": 7,
            "created_by": "alice",
            "lock_key": "k1",
            "idempotency_key": "i1",
            "queue": "other",
        },
        {"subject": ("demo.report", "42"), "run_after": 30, "scope": ("acme", "org-1")},
    ],
)
def test_start__returns_exactly_the_row_it_wrote(kind, extra):
    """Issue #14: the insert reads back only what the server decides; the job start()
    returns must still equal the stored row, field by field."""
    job = durable.start(kind, **extra)
    stored = durable.get(job.id, scope=extra.get("scope"))
    fields = [f.attname for f in type(job)._meta.concrete_fields]
    assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert job.id.version == 7


def test_start__its_column_lists_cover_every_column_of_the_model_once():
    """The start's hand-written lists (where each column of a new row comes from) name
    every column INSERT_JOB writes, each once, and only columns the model has: a column
    added to the model or the insert and forgotten in the lists fails here, not silently."""
    model_columns = {f.column for f in Job._meta.concrete_fields}
    named = [
        *store.START_FROM_PARAMS,
        *store.START_LITERALS,
        *store.START_RETURNING,
        *store.START_SAME_AS,
    ]
    assert len(named) == len(set(named)), named
    inserted = store.INSERT_JOB.split("(", 1)[1].split(")", 1)[0]
    assert {c.strip() for c in inserted.split(",")} == set(named)
    assert set(named) <= model_columns
    assert set(store.START_SAME_AS.values()) <= set(store.START_RETURNING)
    # Every column the insert does not name comes back as NULL or its zero default.
    unnamed = model_columns - set(named)
    assert unnamed and all(
        f.null or f.db_default is not NOT_PROVIDED
        for f in Job._meta.concrete_fields
        if f.column in unnamed
    )


def _prepared_inserts() -> int:
    return prepared_statements("%INSERT INTO durable_jobs_job%")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "input": {"a": [1, "ü"]},
            "lock_key": "k1",
            "idempotency_key": "i1",
            "subject": ("demo.report", "42"),
            "run_after": 30,
            "priority": 3,
        },
    ],
)
def test_start__prepares_its_insert_only_where_the_connection_prepares_statements(
    kind, prepare_threshold, extra
):
    """Django's default (no ``prepare_threshold``) prepares nothing, so a transaction-mode
    pooler that loses prepared statements between transactions is safe; a connection that
    prepares statements gets the start's insert prepared, and the same rows."""
    for _ in range(3):
        durable.start(kind)
    assert _prepared_inserts() == 0
    prepare_threshold(0)
    job = durable.start(kind, **extra)
    durable.start(kind)
    assert _prepared_inserts() == 1
    stored = durable.get(job.id)
    fields = [f.attname for f in type(job)._meta.concrete_fields]
    assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}


@pytest.mark.django_db
def test_start__uses_the_handler_queue_unless_told(kind):
    """DESIGN §1: the handler's queue is the default."""
    assert durable.start("tests.queued").queue_name == "reports"
    assert durable.start("tests.queued", queue="urgent").queue_name == "urgent"


@pytest.mark.django_db
def test_start__refuses_an_unregistered_kind(kind):
    """Invariant 9: refused before anything is written."""
    with pytest.raises(UnknownKind) as caught:
        durable.start("tests.nobody_handles_this")
    assert caught.value.field == "kind"
    assert Job.objects.count() == 0


# ---------------------------------------------------------------------------------------
# Idempotency
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start__idempotent_start_returns_the_first_job(kind):
    """Invariant 9: a second start with the same key in a tenant returns the first job."""
    first = durable.start(kind, input={"n": 1}, idempotency_key="req-1")
    second = durable.start(kind, input={"n": 2}, idempotency_key="req-1")

    assert second.id == first.id
    assert second.input == {"n": 1}
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__idempotent_start_returns_the_first_job_even_once_it_finished(kind):
    """Invariant 9: idempotency outlives the job's lock key."""
    first = durable.start(kind, idempotency_key="req-1", lock_key="L")
    _finish(first)
    assert durable.start(kind, idempotency_key="req-1", lock_key="L").id == first.id
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__idempotency_key_for_another_kind_is_a_conflict(kind):
    """Invariant 9: answering with a job of another kind would hide a caller's bug."""
    first = durable.start(kind, idempotency_key="req-1")
    with pytest.raises(IdempotencyConflict) as caught:
        durable.start("tests.other", idempotency_key="req-1")
    assert caught.value.idempotency_key == "req-1"
    assert Job.objects.count() == 1 and Job.objects.get().id == first.id


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first_org", "second_org"),
    [("acme", None), (None, "acme"), ("acme", "umbrella")],
    ids=["org-then-tenant-wide", "tenant-wide-then-org", "org-then-other-org"],
)
def test_start__idempotency_key_from_another_organization_is_a_conflict(
    kind, first_org, second_org
):
    """Invariant 10: the key is tenant-wide, but answering with another organization's job
    (a null organization being a value of its own) would leak it."""
    durable.start(kind, scope=("default", first_org), idempotency_key="req-1")
    with pytest.raises(IdempotencyConflict):
        durable.start(kind, scope=("default", second_org), idempotency_key="req-1")
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__idempotency_keys_of_other_tenants_are_independent(kind):
    """Invariant 10: idempotency keys are tenant-scoped."""
    a = durable.start(kind, scope="tenant-a", idempotency_key="req-1")
    b = durable.start(kind, scope="tenant-b", idempotency_key="req-1")
    assert a.id != b.id


# ---------------------------------------------------------------------------------------
# Lock keys
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start__a_live_job_holding_the_lock_key_refuses_a_second(kind):
    """Invariant 9: at most one live job per lock key in a scope; the refusal names the holder."""
    holder = durable.start(kind, lock_key="report:7")
    with pytest.raises(LockKeyHeld) as caught:
        durable.start(kind, lock_key="report:7")
    assert (caught.value.lock_key, caught.value.holder_id) == ("report:7", holder.id)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__a_running_job_still_holds_its_lock_key_and_a_finished_one_frees_it(kind):
    """Invariant 9: live means pending or running."""
    holder = durable.start(kind, lock_key="report:7")
    claimed = store.claim(holder.id, Scope(tenant="default"), store_delivery(holder), "w", 60_000)
    assert claimed is not None
    with pytest.raises(LockKeyHeld):
        durable.start(kind, lock_key="report:7")
    assert (
        store.complete(Lease(job_id=holder.id, owner="w", epoch=claimed.lease_epoch, ttl_ms=1))
        is not None
    )

    successor = durable.start(kind, lock_key="report:7")
    assert successor.id != holder.id


@pytest.mark.django_db
def test_start__lock_keys_are_per_scope_and_a_null_organization_is_a_value(kind):
    """Invariant 10: tenant-wide and org-scoped keys do not collide; tenant-wide collides
    with tenant-wide (null is one value in the lock index, not 'never equal')."""
    durable.start(kind, scope=("default", None), lock_key="K")
    durable.start(kind, scope=("default", "acme"), lock_key="K")
    durable.start(kind, scope=("default", "umbrella"), lock_key="K")
    durable.start(kind, scope=("tenant-b", None), lock_key="K")

    with pytest.raises(LockKeyHeld):
        durable.start(kind, scope=("default", None), lock_key="K")
    with pytest.raises(LockKeyHeld):
        durable.start(kind, scope=("default", "acme"), lock_key="K")
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_start__a_refused_lock_key_leaves_the_callers_transaction_usable(kind):
    """Invariant 9: the lock-key check runs before the insert, so the refusal aborts
    nothing; the caller's further writes in the same transaction commit."""
    with transaction.atomic():
        report = Report.objects.create(name="before")
        durable.start(kind, lock_key="K", subject=report)
        with pytest.raises(LockKeyHeld):
            durable.start(kind, lock_key="K")
        Report.objects.filter(pk=report.pk).update(name="after")
        other = durable.start(kind, lock_key="K2")
    assert Report.objects.get(pk=report.pk).name == "after"
    assert durable.get(other.id).lock_key == "K2"


# ---------------------------------------------------------------------------------------
# Keys that look like SQL round-trip exactly
# ---------------------------------------------------------------------------------------

HOSTILE = [
    "'; DROP TABLE durable_jobs_job; --",
    "x' OR '1'='1",
    "%(id)s %s {TABLE} $1 \\x00",
    "ünïcödé 🚀 key",
    '"quoted" `ticks`',
]


@pytest.mark.django_db
@pytest.mark.parametrize("key", HOSTILE)
def test_start__injection_looking_keys_round_trip_exactly(kind, key):
    """Invariants 9 and 23: keys are parameters, never SQL; they round-trip byte for byte."""
    job = durable.start(
        kind,
        lock_key=key,
        idempotency_key=key,
        subject=("type " + key[:50], key),
        input={key: key},
        created_by=key[:200],
    )

    row = durable.get(job.id)
    assert (row.lock_key, row.idempotency_key, row.subject_id, row.created_by) == (
        key,
        key,
        key,
        key[:200],
    )
    assert row.input == {key: key}
    assert durable.start(kind, lock_key="other", idempotency_key=key).id == job.id
    with pytest.raises(LockKeyHeld):
        durable.start(kind, lock_key=key)
    jobs, total = durable.list_jobs(subject=("type " + key[:50], key))
    assert total == 1 and jobs[0].id == job.id


# ---------------------------------------------------------------------------------------
# Scheduling (invariant 2: durations cross into SQL; the database's clock adds them)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "run_after", [timedelta(hours=1), 3600, 3600.0], ids=["timedelta", "int", "float"]
)
def test_start__a_run_after_duration_is_added_to_the_database_clock(kind, run_after):
    """Invariant 2: only durations cross into SQL."""
    before = db_now()
    job = durable.start(kind, run_after=run_after)
    after = db_now()

    assert before + timedelta(hours=1) <= job.next_run_at <= after + timedelta(hours=1)
    assert store.dequeue(["default"], "host", 60_000, kinds=None) == []


@pytest.mark.django_db
def test_start__an_aware_datetime_is_stored_as_the_instant_given(kind):
    """Invariant 2: an aware instant is data, not a reading of this process's clock."""
    # A whole minute about a month ahead, in a zone of its own (inside MAX_RUN_AFTER).
    soon = db_now() + timedelta(days=30)
    instant = datetime(soon.year, soon.month, soon.day, 9, 30, tzinfo=timezone(timedelta(hours=2)))
    job = durable.start(kind, run_after=instant)
    assert job.next_run_at == instant


@pytest.mark.django_db
def test_start__a_negative_timedelta_means_now(kind):
    """Invariant 2."""
    before = db_now()
    job = durable.start(kind, run_after=timedelta(minutes=-5))
    assert before - SLACK <= job.next_run_at <= db_now()


# ---------------------------------------------------------------------------------------
# Bad input: refused, naming the argument, and nothing written
# ---------------------------------------------------------------------------------------


def _deep(levels: int):
    value: object = "leaf"
    for _ in range(levels):
        value = [value]
    return value


BAD_INPUT = {
    "nul-in-input": ("input", dict(input={"text": "a\x00b"})),
    "nul-in-input-key": ("input", dict(input={"a\x00": 1})),
    "nan-in-input": ("input", dict(input={"ratio": math.nan})),
    "infinity-in-input": ("input", dict(input=[1, math.inf])),
    "set-in-input": ("input", dict(input={"s": {1, 2}})),
    "non-string-key": ("input", dict(input={1: "x"})),
    "too-deep": ("input", dict(input=_deep(200))),
    "nul-in-meta": ("meta", dict(meta={"x": "\x00"})),
    "meta-not-a-dict": ("meta", dict(meta=["x"])),
    "unaware-run-after": ("run_after", dict(run_after=datetime(2030, 1, 1, 12, 0))),
    "negative-seconds": ("run_after", dict(run_after=-1)),
    "nan-seconds": ("run_after", dict(run_after=math.nan)),
    "string-run-after": ("run_after", dict(run_after="tomorrow")),
    "control-in-lock-key": ("lock_key", dict(lock_key="a\nINFO forged log line")),
    "nul-in-lock-key": ("lock_key", dict(lock_key="a\x00b")),
    "line-separator-in-lock-key": ("lock_key", dict(lock_key="a\u2028b")),
    "empty-lock-key": ("lock_key", dict(lock_key="")),
    "long-lock-key": ("lock_key", dict(lock_key="k" * 256)),
    "escape-in-idempotency-key": ("idempotency_key", dict(idempotency_key="\x1b[31mred")),
    "bad-queue": ("queue", dict(queue="no spaces")),
    "priority-too-high": ("priority", dict(priority=101)),
    "priority-bool": ("priority", dict(priority=True)),
    "negative-total": ("total_count", dict(total_count=-1)),
    "bad-tenant": ("scope.tenant", dict(scope="tenant with spaces")),
    "empty-organization": ("scope.organization", dict(scope=("default", ""))),
    "unsaved-subject": ("subject", dict(subject=Report(name="unsaved"))),
    "bad-subject": ("subject", dict(subject="report:7")),
    "control-in-created-by": ("created_by", dict(created_by="bob\r\n")),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "kwargs"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_start__refuses_bad_input_naming_the_field_and_writes_nothing(kind, field, kwargs):
    """Invariants 9 and 23: refused at the API, the argument named, nothing written."""
    with pytest.raises(InvalidInput) as caught:
        durable.start(kind, **kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(field)
    assert isinstance(caught.value, ValueError)
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("kind_name", ["has space", "", "x" * 101, "drop;table", None, "ünï"])
def test_start__refuses_a_malformed_kind(kind, kind_name):
    """Invariant 23."""
    with pytest.raises(InvalidInput) as caught:
        durable.start(kind_name)
    assert caught.value.field == "kind"
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_start__refuses_a_payload_over_max_payload_bytes(kind):
    """Invariant 9: MAX_PAYLOAD_BYTES, counted in UTF-8 bytes."""
    with override_settings(DURABLE_JOBS={"MAX_PAYLOAD_BYTES": 64}):
        durable.start(kind, input={"x": "a" * 40})
        with pytest.raises(InvalidInput) as caught:
            durable.start(kind, input={"x": "a" * 80})
        with pytest.raises(InvalidInput) as caught_meta:
            durable.start(kind, meta={"x": "é" * 40})  # 80 bytes of UTF-8, 40 characters
    assert caught.value.field == "input" and "MAX_PAYLOAD_BYTES" in str(caught.value)
    assert caught_meta.value.field == "meta"
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__refuses_a_payload_deeper_than_max_payload_depth(kind):
    """Invariant 9: MAX_PAYLOAD_DEPTH, inclusive."""
    with override_settings(DURABLE_JOBS={"MAX_PAYLOAD_DEPTH": 3}):
        durable.start(kind, input=_deep(3))
        with pytest.raises(InvalidInput) as caught:
            durable.start(kind, input=_deep(4))
    assert caught.value.field == "input" and "MAX_PAYLOAD_DEPTH" in str(caught.value)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_start__refuses_an_infinite_run_after(kind):
    """Invariants 2 and 9: bad input is InvalidInput, not a crash."""
    with pytest.raises(InvalidInput) as caught:
        durable.start(kind, run_after=math.inf)
    assert caught.value.field == "run_after"


@pytest.mark.django_db
@pytest.mark.parametrize("run_after", [1e13, timedelta.max], ids=["seconds", "timedelta-max"])
def test_start__refuses_a_run_after_beyond_what_the_database_can_schedule(kind, run_after):
    """Invariant 9: bad input is refused at the API, not by a failed statement."""
    with pytest.raises(InvalidInput) as caught:
        durable.start(kind, run_after=run_after)
    assert caught.value.field == "run_after"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("queue", dict(queue="default\n")),
        ("scope.tenant", dict(scope="tenant-a\n")),
        ("scope.organization", dict(scope=("tenant-a", "acme\n"))),
    ],
    ids=["queue", "tenant", "organization"],
)
def test_start__refuses_a_name_with_a_trailing_newline(kind, field, kwargs):
    """Invariant 23: only validated bytes reach a label or a log line."""
    with pytest.raises(InvalidInput) as caught:
        durable.start(kind, **kwargs)
    assert caught.value.field == field
