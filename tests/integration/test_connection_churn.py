"""Issue #27 item 4: a cut connection costs a slice a reconnect, never a lease.

Real PostgreSQL, real cuts: ``pg_terminate_backend`` from a second connection ends the
backend the bookkeeping write is about to use (the terminal statement is wrapped so the
cut lands exactly there, on each of its first tries). Nothing about the database is
mocked: the statement, the error and the reconnect are the real ones.
"""

from __future__ import annotations

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import signals, store
from durable_jobs.runtime import executor
from durable_jobs.runtime.executor import complete_deferred, run_slice
from durable_jobs.states import Lease
from tests.factories import reload

pytestmark = pytest.mark.django_db(transaction=True)

TTL_MS = 60_000


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _cut(other) -> None:
    """End this thread's backend from another connection, as an administrator or a proxy would."""
    other.execute("SELECT pg_terminate_backend(%s, 5000)", [_backend_pid()])


def _lease(job) -> Lease:
    return Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=TTL_MS)


def _claim(kind: str, n: int = 1) -> list:
    jobs = [durable.start(kind) for _ in range(n)]
    claimed = store.dequeue(["default"], "churn-test:1", TTL_MS, kinds=[kind], limit=n)
    assert {job.id for job in claimed} == {job.id for job in jobs}
    return claimed


@pytest.fixture
def finished():
    """Every ``job_finished`` signal sent, as (job id, outcome)."""
    seen: list = []

    def receiver(sender, job, outcome, **kwargs):
        seen.append((job.id, str(outcome)))

    signals.job_finished.connect(receiver)
    yield seen
    signals.job_finished.disconnect(receiver)


def test_a_terminal_write_cut_three_times_still_completes_at_once_and_once(
    kinds, other_connection, monkeypatch, finished
):
    """Invariant 14a, without waiting out a lease: three cut connections in a row under
    the completion (two were enough to strand the job before issue #27) cost reconnects;
    the job is completed when ``run_slice`` returns, not re-driven, not charged."""
    kinds.add("tests.churn.done", lambda job: durable.DONE)
    [job] = _claim("tests.churn.done")
    real, tries = store.complete, []

    def complete_on_a_cut_connection(*args, **kwargs):
        tries.append(1)
        if len(tries) <= 3:
            _cut(other_connection)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "complete", complete_on_a_cut_connection)
    report = run_slice(job)
    assert report.outcome == "completed"
    assert len(tries) == 4, "three cut tries, then the one that landed"
    after = reload(job)
    assert (after.status, after.redrives, after.interruptions) == ("completed", 0, 0)
    assert after.lease_epoch == job.lease_epoch, "no takeover: it never waited out its lease"
    assert finished == [(job.id, "completed")]


def test_a_terminal_write_whose_reply_was_lost_is_recognised_not_doubled(
    kinds, other_connection, monkeypatch, finished
):
    """The completion commits, then the connection is cut before its reply arrives: the
    retry finds the job completed at its own epoch and reports it completed (not
    ``lease_lost``), once; the row is not written again."""
    kinds.add("tests.churn.lost_reply", lambda job: durable.Done({"n": 1}))
    [job] = _claim("tests.churn.lost_reply")
    real, tries = store.complete, []

    def commit_then_lose_the_reply(*args, **kwargs):
        tries.append(1)
        row = real(*args, **kwargs)
        if len(tries) == 1:
            _cut(other_connection)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # the dead connection raises, as a lost reply does
        return row

    monkeypatch.setattr(store, "complete", commit_then_lose_the_reply)
    report = run_slice(job)
    assert report.outcome == "completed"
    assert len(tries) == 1, "the landed write was recognised, not run again"
    after = reload(job)
    assert (after.status, after.result, after.redrives) == ("completed", {"n": 1}, 0)
    assert finished == [(job.id, "completed")]


def test_a_batched_completion_cut_mid_batch_completes_every_job_exactly_once(
    kinds, other_connection, monkeypatch, finished
):
    """A slot's batch: the first try commits part of the batch (the leaf statement) and
    is cut before the rest; the retry completes the rest and reports all completed."""
    kinds.add("tests.churn.batch", lambda job: durable.DONE)
    claimed = _claim("tests.churn.batch", n=4)
    completions = [
        executor.DeferredCompletion(job=job, lease=_lease(job), result_json=None) for job in claimed
    ]
    real, tries = store.complete_many, []

    def land_two_then_cut(items, *, using):
        tries.append(len(items))
        if len(tries) == 1:
            real(items[:2], using=using)  # committed: two rows done
            _cut(other_connection)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        return real(items, using=using)

    monkeypatch.setattr(store, "complete_many", land_two_then_cut)
    outcomes = complete_deferred(completions)
    assert [str(outcome) for outcome in outcomes] == ["completed"] * 4
    rows = [reload(job) for job in claimed]
    assert {row.status for row in rows} == {"completed"}
    assert {row.redrives for row in rows} == {0}
    assert sorted(finished) == sorted((job.id, "completed") for job in claimed)
