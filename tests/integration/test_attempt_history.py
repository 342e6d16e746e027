"""Invariant 32, history is written with its transition: every slice that ends in a
failure, a time limit, an interruption or a lease loss leaves one bounded attempt row,
written by the transition's own statement and fenced like it; a slice that succeeds
leaves none; retention removes the rows with their job."""

from __future__ import annotations

import re

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import conf, store, testing
from durable_jobs.console import display, queries
from durable_jobs.models import Job, JobAttempt, ReadOnlyJobRow
from durable_jobs.runtime.reconciler import PassReport, Reconciler
from durable_jobs.states import Scope
from tests.factories import JobFactory, reload, running, shift
from tests.integration.support import claim, connect_to_test_database, fail, lease_of, snapshot

DAY = 24 * 3600


def attempts(job) -> list[JobAttempt]:
    """The job's attempt rows, newest first, as the console reads them."""
    return queries.attempts_of(job.id, limit=100)


def _parse_row(row):
    raise ValueError(f"bad row {row}")


# ---------------------------------------------------------------------------------------
# What a failing slice leaves
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failing_handler__leaves_an_attempt_with_its_traceback(kinds):
    """Invariant 32: attempt number, worker, both ends on the database clock, the error
    and the traceback that shows where the handler raised."""
    kinds.add("tests.fails", lambda job: _parse_row(7))
    job = durable.start("tests.fails")
    assert [r.outcome for r in testing.run_jobs(max_slices=1)] == ["retrying"]

    [first] = attempts(job)
    row = reload(job)
    assert (first.attempt, first.outcome, first.error_class, first.error_code) == (
        1,
        "failed",
        "transient",
        "ValueError",
    )
    assert first.error_message == "ValueError: bad row 7" == row.error_message
    assert first.worker.startswith("durable_jobs.testing:") and first.epoch == row.lease_epoch
    assert "in _parse_row" in first.traceback
    assert first.traceback.rstrip().endswith("ValueError: bad row 7")
    assert first.started_at is not None and first.started_at <= first.ended_at

    testing.run_jobs(fast_forward=True)  # the retries, to the retry_exhausted verdict
    history = attempts(job)
    assert [a.attempt for a in history] == [5, 4, 3, 2, 1], "newest first, one per failed slice"
    assert reload(job).error_code == "retry_exhausted"
    assert history[0].error_code == "retry_exhausted", "the verdict the slice reached"


@pytest.mark.django_db
def test_a_successful_slice__records_no_attempt(kinds):
    """Invariant 32: only failure paths write history; a yield is not a failure either."""
    calls = []

    def twice(job):
        calls.append(1)
        return durable.YIELD if len(calls) == 1 else durable.DONE

    kinds.add("tests.yields_then_done", twice)
    job = durable.start("tests.yields_then_done")
    assert [r.outcome for r in testing.run_jobs()] == ["yielded", "completed"]
    assert attempts(job) == []
    assert JobAttempt.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "forged", [{"epoch": -1}, {"owner": "someone-else"}], ids=["stale-epoch", "other-owner"]
)
def test_a_stale_holder__records_neither_the_transition_nor_the_attempt(forged):
    """Invariants 4 and 32: the attempt is fenced by the transition's own WHERE clause."""
    job = running(lease_epoch=3)
    before = snapshot(job)
    stale = lease_of(
        job,
        epoch=job.lease_epoch + forged["epoch"] if "epoch" in forged else None,
        owner=forged.get("owner"),
    )
    assert fail(stale) is None
    assert store.charge_interruption(stale, reason="cut", backoff_ms=0, max_redrives=None) is None
    assert snapshot(job) == before
    assert attempts(job) == []
    assert fail(lease_of(job)) is not None, "the real holder's failure is recorded"
    assert [a.outcome for a in attempts(job)] == ["failed"]


@pytest.mark.django_db
def test_a_failure_past_the_history_bound__trims_the_oldest_in_the_same_statement(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "ATTEMPT_HISTORY_KEEP": 3}
    job = running()
    fail(lease_of(job), max_failures=100)
    for _ in range(4):
        _, lease = claim(reload(job))
        assert fail(lease, max_failures=100) is not None
    assert [a.attempt for a in attempts(job)] == [5, 4, 3]


# ---------------------------------------------------------------------------------------
# Interruptions, lease losses, time limits
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_interruption__leaves_an_attempt(kinds):
    """A slice whose connection is cut is charged as an interruption, and recorded as one."""

    def cut_my_connection(job):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with connect_to_test_database(autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return durable.DONE

    kinds.add("tests.cut", cut_my_connection)
    job = durable.start("tests.cut")
    assert [r.outcome for r in testing.run_jobs(max_slices=1)] == ["interrupted"]
    [attempt] = attempts(job)
    assert attempt.outcome == "interrupted" and attempt.worker.startswith("durable_jobs.testing:")
    assert attempt.error_message.startswith("interrupted: database connection lost")
    assert "cut_my_connection" in attempt.traceback
    assert attempt.epoch == reload(job).lease_epoch - 1, "the epoch the slice held"


@pytest.mark.django_db
def test_a_lease_lost_to_the_reconciler__leaves_an_attempt_naming_the_old_worker():
    job = running(lease_owner="host-a:4242:tok", lease_epoch=7, lease_expires_at=-120)
    assert store.take_orphan(job.id, grace_ms=0, backoff_ms=0) is not None
    [attempt] = attempts(job)
    assert (attempt.outcome, attempt.worker, attempt.epoch) == ("lease_lost", "host-a:4242:tok", 7)
    assert attempt.started_at is None and attempt.heartbeat_at == job.heartbeat_at
    assert attempt.error_code is None and "stopped heartbeating" in attempt.error_message

    poisoned = running(lease_expires_at=-120, redrives_since_commit=2)
    parked = store.take_orphan(poisoned.id, grace_ms=0, backoff_ms=0, max_redrives=2)
    assert parked.status == "failed"
    assert [(a.outcome, a.error_code) for a in attempts(poisoned)] == [("lease_lost", "poison")]


@pytest.mark.django_db
def test_a_take_that_does_not_apply__records_nothing():
    live = running(lease_expires_at=60)
    assert store.take_orphan(live.id, grace_ms=0, backoff_ms=0) is None
    assert attempts(live) == []


def _claim_one():
    claimed = store.dequeue(["default"], "slot", conf.ms(conf.get().LEASE_TTL), kinds=None, limit=1)
    assert len(claimed) == 1
    return claimed


@pytest.mark.django_db(transaction=True)
def test_a_time_limit__leaves_an_attempt(settings):
    """Process execution: the handler process is killed at the time limit and the charge
    (a ``time_limit`` failure) records the attempt."""
    from durable_jobs.runtime.runner import ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    settings.DURABLE_JOBS = {**getattr(settings, "DURABLE_JOBS", {}), "TIME_LIMIT": 1.0}
    slow = durable.start("demo.sleep", input={"seconds": 30, "stubborn": True})
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        worker._run_claimed(slot, _claim_one(), conf.ms(conf.get().LEASE_TTL), runner)
    finally:
        runner.close()
    [attempt] = attempts(slow)
    assert (attempt.outcome, attempt.error_code) == ("time_limit", "time_limit")
    assert attempt.worker.startswith("slot:")
    assert "time limit of 1s" in attempt.error_message


@pytest.mark.django_db(transaction=True)
def test_process_execution__the_traceback_crosses_the_pipe():
    """The handler process formats the traceback; the worker's statement stores it."""
    from durable_jobs.runtime.runner import ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    job = durable.start("demo.always_fails")
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        worker._run_claimed(slot, _claim_one(), conf.ms(conf.get().LEASE_TTL), runner)
    finally:
        runner.close()
    [attempt] = attempts(job)
    assert attempt.outcome == "failed" and attempt.error_code == "always"
    assert "in always_fails" in attempt.traceback and "TransientError" in attempt.traceback


# ---------------------------------------------------------------------------------------
# Bounds, retention, the rows themselves
# ---------------------------------------------------------------------------------------


def _deep_failure(job):
    # A long first part (the cause, printed first), then the exception that ended the slice.
    raise RuntimeError("deep down") from ValueError("context " * 1000)


@pytest.mark.django_db
def test_the_traceback_cap__holds_and_keeps_the_innermost_end(kinds, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "ATTEMPT_TRACEBACK_BYTES": 1000}
    kinds.add("tests.deep", _deep_failure)
    job = durable.start("tests.deep")
    testing.run_jobs(max_slices=1)
    [attempt] = attempts(job)
    assert len(attempt.traceback.encode()) <= 1000
    assert attempt.traceback.startswith("[traceback cut to ATTEMPT_TRACEBACK_BYTES")
    assert attempt.traceback.rstrip().endswith("RuntimeError: deep down")


@pytest.mark.parametrize("limit", [50, 100, 101, 102, 103, 500])
def test_clip_traceback__never_exceeds_the_limit_nor_splits_a_character(limit):
    text = "é€𝄞x" * 300 + "\x00 the end"
    clipped = store.clip_traceback(text, limit)
    assert len(clipped.encode()) <= limit
    assert clipped.endswith("\\x00 the end")
    assert store.clip_traceback("short", limit) == "short"


@pytest.mark.django_db
def test_retention_removing_the_job__removes_its_attempts(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "RETENTION": 30 * DAY}
    job = running()
    fail(lease_of(job), error_class="terminal")
    assert store.fail_terminal(lease_of(job), code="terminal", error_class="terminal") is not None
    shift(job.id, "finished_at", -40 * DAY)
    kept = running()
    fail(lease_of(kept))
    assert JobAttempt.objects.count() == 2
    Reconciler().apply_retention(PassReport())
    assert not Job.objects.filter(id=job.id).exists()
    assert list(JobAttempt.objects.values_list("job_id", flat=True)) == [kept.id]


@pytest.mark.django_db
def test_attempt_rows__are_refused_to_the_orm():
    """Invariant 1: attempt rows are written by the store's statements only."""
    job = running()
    fail(lease_of(job))
    [attempt] = attempts(job)
    with pytest.raises(ReadOnlyJobRow):
        attempt.save()
    with pytest.raises(ReadOnlyJobRow):
        JobAttempt.objects.filter(job_id=job.id).delete()


@pytest.mark.django_db
def test_attempts_of__is_scoped_and_bounded():
    job = running(tenant_id="acme", organization_id=None)
    fail(lease_of(job), max_failures=100)
    _, lease = claim(reload(job), scope=Scope(tenant="acme"))
    fail(lease, max_failures=100)
    assert [a.attempt for a in queries.attempts_of(job.id, limit=1)] == [2]
    assert len(queries.attempts_of(job.id, scope=Scope(tenant="acme"))) == 2
    assert queries.attempts_of(job.id, scope=Scope(tenant="other")) == []
    assert queries.attempts_of(job.id, scope=Scope(tenant="acme", organization="o1")) == []


@pytest.mark.django_db
def test_attempts_html__escapes_what_the_handler_wrote():
    job = running()
    fail(lease_of(job), message="<script>alert(1)</script>")
    html = display.attempts_html(attempts(job))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert re.search(r"data-dj-attempt='1'", html)
    assert "No failed" in display.attempts_html([])


def test_a_job_factory_row_has_no_history_to_begin_with(db):
    assert attempts(JobFactory()) == []


@pytest.mark.django_db
def test_job_attempts_html__shows_the_job_s_attempts_newest_first():
    job = running()
    fail(lease_of(job), max_failures=100, message="first")
    _, lease = claim(reload(job))
    fail(lease, max_failures=100, message="second")
    html = display.job_attempts_html(reload(job))
    assert html.index("second") < html.index("first")
    assert display.job_attempts_html(reload(job), limit=1).count("data-dj-attempt=") == 1
