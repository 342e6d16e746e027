"""The executor's outcome table, in-process (one slice at a time, no worker process)."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import store, testing
from tests.factories import JobFactory, reload, running

pytestmark = pytest.mark.django_db


def test_a_kind_this_worker_cannot_run_is_left_unclaimed_and_uncharged_for_one_that_can(kinds):
    """Invariant 14b: a worker claims only the kinds registered in it. A job of a kind it
    does not know (a rolling deploy, TASKS unset in this process) is not claimed, so no
    budget is spent on it; once a handler for the kind is registered, it runs."""
    job = JobFactory(kind="tests.nobody_handles_this")
    assert testing.run_jobs() == []
    waiting = reload(job)
    assert (waiting.status, waiting.lease_epoch, waiting.consecutive_failures) == ("pending", 0, 0)
    assert waiting.error_code is None and waiting.started_at is None
    kinds.add("tests.nobody_handles_this")
    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    assert reload(job).status == "completed"


def test_a_kind_unregistered_between_claim_and_run_retries_with_a_clear_code(kinds):
    """The fallback for the narrow race the dequeue filter cannot see (a handler removed
    after the claim): the slice fails as a transient ``unknown_kind`` and backs off."""
    kinds.add("tests.leaving")
    job = JobFactory(kind="tests.leaving")
    [claimed] = store.dequeue(["default"], "host", 60_000, kinds=["tests.leaving"])
    from durable_jobs import registry
    from durable_jobs.runtime.executor import run_slice

    registry.unregister("tests.leaving")
    assert run_slice(claimed).outcome == "retrying"
    after = reload(job)
    assert (after.status, after.error_code, after.lease_owner) == ("running", "unknown_kind", None)
    assert "no handler is registered for kind 'tests.leaving'" in after.error_message
    assert after.next_run_at > after.lease_expires_at, "it backs off instead of spinning"


def test_a_verdict_decided_but_not_recorded_is_recorded_without_running_the_work(kinds):
    ran = []
    kinds.add("tests.counted", lambda job: ran.append(job.id) or durable.DONE)
    job = running(
        kind="tests.counted",
        lease_owner=None,
        lease_expires_at=-1,
        next_run_at=-1,
        error_code="retry_exhausted",
        error_class="transient",
        consecutive_failures=5,
    )
    assert [r.outcome for r in testing.run_jobs()] == ["failed"]
    assert ran == [], "the handler never ran again"
    after = reload(job)
    assert after.status == "failed" and after.error_code == "retry_exhausted"


@pytest.mark.parametrize(
    ("raised", "code", "error_class"),
    [
        (durable.TerminalError("bad input"), "terminal", "terminal"),
        (durable.UnrecoverableError("corrupt"), "unrecoverable", "unrecoverable"),
    ],
)
def test_terminal_and_unrecoverable_errors_fail_at_once(kinds, raised, code, error_class):
    def handler(job):
        raise raised

    kinds.add("tests.raises", handler)
    job = durable.start("tests.raises")
    assert [r.outcome for r in testing.run_jobs()] == ["failed"]
    after = reload(job)
    assert (after.status, after.error_code, after.error_class) == ("failed", code, error_class)
    assert after.consecutive_failures == 1


def test_a_handler_calling_sys_exit_fails_its_slice_and_the_slot_lives(kinds):
    """Invariant 14a: ``SystemExit`` from a handler is charged to the slice like any
    failure (a retry, with the exception's name as the code); it does not end the slot."""

    def handler(job):
        raise SystemExit(3)

    kinds.add("tests.exits", handler)
    job = durable.start("tests.exits")
    assert [r.outcome for r in testing.run_jobs(max_slices=1)] == ["retrying"]
    assert reload(job).error_code == "SystemExit"


def test_an_invalid_return_value_is_a_terminal_error(kinds):
    kinds.add("tests.returns_junk", lambda job: 42)
    job = durable.start("tests.returns_junk")
    testing.run_jobs()
    after = reload(job)
    assert (after.status, after.error_code) == ("failed", "terminal")
    assert "invalid" in after.error_message.lower() or "returned int" in after.error_message


def test_a_classifier_maps_exceptions_to_classes(kinds):
    def handler(job):
        raise KeyError("missing")

    kinds.add(
        "tests.classified",
        handler,
        classify=lambda e: "unrecoverable" if isinstance(e, KeyError) else "transient",
    )
    job = durable.start("tests.classified")
    testing.run_jobs()
    assert reload(job).error_code == "unrecoverable"


def test_a_cancel_observed_by_the_slice_ends_the_job_cancelled(kinds):
    def handler(job):
        durable.cancel(job.id, scope=job.scope)
        job.heartbeat()  # the heartbeat carries the flag back
        assert job.should_yield()
        return durable.YIELD

    kinds.add("tests.self_cancelling", handler)
    job = durable.start("tests.self_cancelling")
    assert [r.outcome for r in testing.run_jobs()] == ["cancelled"]
    assert reload(job).status == "cancelled"


def test_a_fenced_write_after_the_cancel_was_seen_is_refused(kinds):
    writes = []

    def handler(job):
        durable.cancel(job.id, scope=job.scope)
        job.heartbeat()
        with job.fenced():
            writes.append("landed")
        return durable.DONE

    kinds.add("tests.writes_after_cancel", handler)
    job = durable.start("tests.writes_after_cancel")
    testing.run_jobs()
    assert writes == [] and reload(job).status == "cancelled"


def test_a_lost_lease_lands_nothing_and_the_slice_stops(kinds):
    writes = []

    def handler(job):
        # Someone takes the job over (epoch + 1) while this slice runs.
        store.take_orphan(job.id, grace_ms=0, backoff_ms=0) or _force_takeover(job)
        with job.fenced():
            writes.append("landed")
        return durable.DONE

    kinds.add("tests.loses_lease", handler)
    job = durable.start("tests.loses_lease")
    reports = testing.run_jobs(max_slices=1)
    assert [r.outcome for r in reports] == ["lease_lost"]
    assert writes == []
    assert reload(job).status == "pending", "the taker's state stands"


def _force_takeover(job):
    from django.db import connection

    with connection.cursor() as cursor:  # test-only: expire the lease so it can be taken
        cursor.execute(
            "UPDATE durable_jobs_job SET lease_expires_at = clock_timestamp() - interval '1 hour' "
            "WHERE id = %s",
            [job.id],
        )
    assert store.take_orphan(job.id, grace_ms=0, backoff_ms=0) is not None


def test_a_result_that_is_not_json_fails_the_job_instead_of_stranding_it(kinds):
    kinds.add("tests.bad_result", lambda job: durable.Done({"when": object()}))
    job = durable.start("tests.bad_result")
    testing.run_jobs()
    after = reload(job)
    assert after.status == "failed" and after.error_code == "terminal"


def test_a_failing_mirror_rolls_back_the_completion_and_its_own_writes(kinds):
    """Invariant 11: the terminal CAS and the mirror commit together or not at all."""
    from testproject.demo.models import Report

    report = Report.objects.create(name="m")

    def mirror(job, outcome):
        Report.objects.filter(pk=report.pk).update(status=outcome)
        raise RuntimeError("mirror down")

    kinds.add("tests.mirror_fails", lambda job: durable.DONE, mirror=mirror, max_mirror_attempts=2)
    job = durable.start("tests.mirror_fails", subject=report)
    assert [r.outcome for r in testing.run_jobs()] == ["mirror_retry"]
    after = reload(job)
    assert after.status == "running" and after.lease_owner is None and after.mirror_attempts == 1
    assert after.consecutive_failures == 0, "a mirror failure is not a slice failure"
    report.refresh_from_db()
    assert report.status == "queued", "the mirror's write rolled back with the completion"
    assert [r.outcome for r in testing.run_jobs(fast_forward=True)] == ["parked"]
    parked = reload(job)
    assert (parked.status, parked.error_code, parked.mirror_attempts) == (
        "failed",
        "mirror_failed",
        2,
    )
    assert parked.domain_mirrored_at is None


def test_a_mirror_s_statement_timeout_counts_against_the_mirror_not_the_work(kinds):
    """Invariant 11: a mirror cancelled by its statement timeout is a mirror failure (one
    mirror attempt, the lease released), not a slice failure."""
    from django.db import connection

    def mirror(job, outcome):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '1ms'")
            cursor.execute("SELECT pg_sleep(0.2)")

    kinds.add("tests.slow_mirror", lambda job: durable.DONE, mirror=mirror, max_mirror_attempts=3)
    job = durable.start("tests.slow_mirror")
    assert [r.outcome for r in testing.run_jobs()] == ["mirror_retry"]
    after = reload(job)
    assert (after.mirror_attempts, after.lease_owner, after.consecutive_failures) == (1, None, 0)


def test_a_fenced_block_that_rolls_back_forgets_the_checkpoint_it_saved(kinds):
    seen = []

    def handler(job):
        try:
            with job.fenced():
                job.save_checkpoint({"at": 1}, processed=1)
                raise RuntimeError("domain write failed")
        except RuntimeError:
            seen.append((job.checkpoint, job.processed))
        return durable.DONE

    kinds.add("tests.rolled_back", handler)
    job = durable.start("tests.rolled_back")
    testing.run_jobs()
    assert seen == [(None, 0)], "the in-memory checkpoint follows the database"
    assert reload(job).checkpoint is None
