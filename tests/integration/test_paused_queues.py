"""Invariant 27, paused means not claimed: pause, resume and read a queue's pause; the
dequeue statement honours it from the first claim that starts after the pause commits,
on any connection; running work is never interrupted or charged; resume wakes workers and
the backlog drains in priority, then run-time order."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import reads, store, testing
from durable_jobs.exceptions import InvalidInput
from durable_jobs.models import PausedQueue, ReadOnlyJobRow
from tests.factories import JobFactory, reload, running
from tests.integration.support import (  # noqa: F401  (other_connection: fixture override)
    SLACK,
    db_now,
    in_thread,
    other_connection_fixture,
)

TTL_MS = 60_000


def claim_from(*queues: str, limit: int = 10) -> list:
    return store.dequeue(list(queues), "tests", TTL_MS, kinds=None, limit=limit)


# ---------------------------------------------------------------------------------------
# pause, resume, read
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_is_not_claimed_from_and_other_queues_are():
    """Invariant 27: the dequeue statement itself leaves a paused queue out."""
    reports = JobFactory(queue_name="reports")
    mail = JobFactory(queue_name="mail")
    durable.pause_queue("reports", reason="incident 42", by="ops@example.com")

    assert [job.id for job in claim_from("reports", "mail")] == [mail.id]
    assert reload(reports).status == "pending" and reload(reports).lease_epoch == 0

    ended = durable.resume_queue("reports")
    assert ended is not None and ended.reason == "incident 42"
    assert [job.id for job in claim_from("reports", "mail")] == [reports.id]


@pytest.mark.django_db
def test_pause_records_when_on_the_database_clock_who_and_why():
    before = db_now()
    pause = durable.pause_queue("reports", reason="bad deploy", by="alice")
    after = db_now()
    assert pause.queue == "reports" and pause.newly_paused
    assert (pause.paused_by, pause.reason) == ("alice", "bad deploy")
    assert before - SLACK <= pause.paused_at <= after + SLACK
    assert durable.paused_queues() == [
        durable.QueuePause(
            queue="reports", paused_at=pause.paused_at, paused_by="alice", reason="bad deploy"
        )
    ]


@pytest.mark.django_db
def test_pausing_a_paused_queue_keeps_the_first_pause():
    first = durable.pause_queue("reports", reason="first", by="alice")
    again = durable.pause_queue("reports", reason="second", by="bob")
    assert not again.newly_paused
    assert (again.paused_at, again.paused_by, again.reason) == (
        first.paused_at,
        "alice",
        "first",
    )
    assert [p.queue for p in durable.paused_queues()] == ["reports"]


@pytest.mark.django_db
def test_resuming_a_queue_that_is_not_paused_changes_nothing():
    assert durable.resume_queue("reports") is None
    assert durable.paused_queues() == []


@pytest.mark.django_db
def test_an_undeclared_queue_is_refused_in_one_line_with_a_did_you_mean():
    with override_settings(DURABLE_JOBS={"QUEUES": ["default", "reports"]}):
        with pytest.raises(InvalidInput, match=r"'reprots' is not a declared queue.*'reports'"):
            durable.pause_queue("reprots")
        with pytest.raises(InvalidInput, match="'reprots' is not a declared queue"):
            durable.resume_queue("reprots")
    with pytest.raises(InvalidInput, match="queue"):
        durable.pause_queue("no spaces")
    with pytest.raises(InvalidInput, match="reason: must not contain control characters"):
        durable.pause_queue("reports", reason="a\x00b")
    assert durable.paused_queues() == []


@pytest.mark.django_db
def test_a_queue_paused_then_removed_from_the_declared_list_can_still_be_resumed():
    durable.pause_queue("legacy")
    with override_settings(DURABLE_JOBS={"QUEUES": ["default"]}):
        assert durable.resume_queue("legacy") is not None


@pytest.mark.django_db
def test_a_paused_queue_still_accepts_starts(kinds):
    """Pausing stops claims, not starts: the job is stored and waits for the resume."""
    kinds.add("tests.paused", queue="reports")
    durable.pause_queue("reports")
    job = durable.start("tests.paused")
    assert reload(job).status == "pending"
    assert claim_from("reports") == []


# ---------------------------------------------------------------------------------------
# the race: a pause committed while another connection's claim transaction is open
# ---------------------------------------------------------------------------------------


def _dequeue_on(conn: psycopg.Connection, queue: str, *, limit: int = 10) -> list:
    """Run the dequeue statement on another connection, in whatever transaction it has open."""
    params = store.claim_params([queue], "other", TTL_MS, kinds=None, limit=limit)
    return [row[0] for row in conn.execute(store.DEQUEUE, params).fetchall()]


@pytest.mark.django_db(transaction=True)
def test_pause_during_a_claim_transaction__each_statement_honours_the_pauses_committed_before_it(
    other_connection,
):
    """Invariant 27, read committed (the worker's isolation): the claim made before the
    pause committed stands and its job runs on (pausing interrupts nothing); the next
    claim statement of the same open transaction already sees the pause and takes
    nothing; the pause never waits for the claimer's row locks."""
    first, second = JobFactory(queue_name="reports", priority=5), JobFactory(queue_name="reports")
    other_connection.execute("BEGIN")  # read committed: each statement takes its own snapshot
    try:
        claimed_before = _dequeue_on(other_connection, "reports", limit=1)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a pause that waited would fail, not hang
        assert durable.pause_queue("reports").newly_paused  # autocommit: committed on return
        claimed_after = _dequeue_on(other_connection, "reports", limit=1)
    finally:
        other_connection.execute("COMMIT")
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert claimed_before == [first.id], "the claim before the pause took the top job"
    assert claimed_after == [], "the claim after the pause took nothing, same transaction"
    assert reload(first).status == "running", "the claimed job runs on: nothing interrupted"
    assert reload(second).status == "pending"
    assert claim_from("reports") == [], "and no later claim on any connection takes from it"


@pytest.mark.django_db(transaction=True)
def test_pause_during_a_claim_transaction__a_snapshot_taken_before_the_pause_still_claims(
    other_connection,
):
    """The boundary, shown: the pause holds from the claim statement's snapshot on. A
    claimer whose snapshot predates the commit (here a repeatable-read transaction) still
    claims; its claim is then an ordinary running job, and claims after it see the pause."""
    job = JobFactory(queue_name="reports")
    other_connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        other_connection.execute("SELECT 1")  # the snapshot is taken here
        durable.pause_queue("reports")
        claimed = _dequeue_on(other_connection, "reports")
    finally:
        other_connection.execute("COMMIT")
    assert claimed == [job.id]
    assert reload(job).status == "running"
    JobFactory(queue_name="reports")
    assert claim_from("reports") == []


# ---------------------------------------------------------------------------------------
# resume: the wake-up and the backlog's order
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_resume_notifies_the_queue_s_channel_at_commit_and_a_rolled_back_one_does_not(
    other_connection, settings
):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "NOTIFY_CHANNEL": "durable_jobs"}
    other_connection.execute("LISTEN durable_jobs")
    durable.pause_queue("reports")
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.resume_queue("reports")
        raise RuntimeError("roll back")
    assert [n.payload for n in other_connection.notifies(timeout=0.3)] == []
    assert [p.queue for p in durable.paused_queues()] == ["reports"]

    durable.resume_queue("reports")
    assert [n.payload for n in other_connection.notifies(timeout=2, stop_after=1)] == ["reports"]


@pytest.mark.django_db
def test_resume_drains_a_backlog_of_ten_thousand_in_priority_then_run_time_order(kinds):
    """Issue 23: 10,000 jobs at mixed priorities and run times started on a paused queue
    are claimed, after the resume, strictly by priority (highest first), then run time."""
    kinds.add("tests.backlog", queue="backlog")
    durable.pause_queue("backlog")
    now = db_now()
    rng = random.Random(23)
    offsets = rng.sample(range(1, 3_600_000), 10_000)  # distinct run times, milliseconds
    specs = [
        {
            "kind": "tests.backlog",
            "priority": rng.choice((-10, 0, 0, 3, 7, 50)),
            "run_after": now - timedelta(milliseconds=offset),
        }
        for offset in offsets
    ]
    ids = []
    for first in range(0, len(specs), 2_500):  # four statements of 2,500
        ids += durable.start_many(specs[first : first + 2_500])
    key_of = {job_id: (s["priority"], s["run_after"]) for job_id, s in zip(ids, specs, strict=True)}
    assert claim_from("backlog") == [], "paused: nothing is claimed"

    durable.resume_queue("backlog")
    claimed = []  # one batch's rows are claimed together: their order within it is not kept
    while batch := claim_from("backlog", limit=500):
        claimed += sorted((key_of[job.id] for job in batch), key=lambda key: (-key[0], key[1]))
    expected = sorted(key_of.values(), key=lambda key: (-key[0], key[1]))
    assert len(claimed) == 10_000
    assert claimed == expected, "each batch is the next 500 by priority, then run time"


# ---------------------------------------------------------------------------------------
# the reconciler leaves a paused queue's backlog alone
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_s_old_backlog_is_not_stale_and_is_never_re_driven():
    """Invariant 27: waiting behind a pause is not a lost delivery: no stale-pending
    warning, and a broker transport's re-drive (which spends a budget) refuses it."""
    old = JobFactory(queue_name="reports", pending_since=-7200, next_run_at=-7200)
    JobFactory(queue_name="mail", pending_since=-7200, next_run_at=-7200)
    durable.pause_queue("reports")

    assert store.count_stale_pending(pending_ttl_ms=60_000) == 1
    assert [
        job.queue_name
        for job in store.select_stale_pending(queues=None, pending_ttl_ms=60_000, limit=10)
    ] == ["mail"]
    assert store.redrive_pending(old.id, pending_ttl_ms=60_000) is None
    assert (reload(old).redrives, reload(old).redrives_since_commit) == (0, 0)

    durable.resume_queue("reports")
    assert store.count_stale_pending(pending_ttl_ms=60_000) == 2


@pytest.mark.django_db
def test_a_pause_row_cannot_be_written_through_the_orm():
    """Invariant 1's rule for every row this app keeps as state: only store.py writes it."""
    with pytest.raises(ReadOnlyJobRow, match="durable_jobs.pause_queue"):
        PausedQueue(queue_name="reports", paused_at=db_now()).save()
    durable.pause_queue("reports")
    with pytest.raises(ReadOnlyJobRow):
        PausedQueue.objects.all().delete()
    with pytest.raises(ReadOnlyJobRow):
        PausedQueue.objects.get(queue_name="reports").delete()
    assert [p.queue for p in durable.paused_queues()] == ["reports"]


@pytest.mark.django_db(transaction=True)
def test_two_pauses_racing_on_two_connections_make_one_pause_and_the_second_is_told(
    other_connection,
):
    """Decided under the primary key, not read-then-write: the second pause waits for the
    first's transaction, then gets that pause back (``newly_paused`` False), not an error."""
    params = {"queue": "reports", "by": "bob", "reason": "first"}
    other_connection.execute("BEGIN")
    assert other_connection.execute(store.PAUSE_QUEUE, params).fetchone()[-1] is True
    answers = []
    thread = in_thread(lambda: answers.append(durable.pause_queue("reports", by="alice")))
    thread.join(timeout=0.5)
    assert thread.is_alive(), "the second pause waits on the unique index"
    other_connection.execute("COMMIT")
    thread.join(timeout=10)
    (second,) = answers
    assert (second.newly_paused, second.paused_by, second.reason) == (False, "bob", "first")
    assert [(p.queue, p.paused_by) for p in durable.paused_queues()] == [("reports", "bob")]


@pytest.mark.django_db
def test_run_jobs_with_fast_forward_leaves_a_paused_queue_alone_and_runs_the_rest(kinds):
    """The testing helpers claim through the same statement: a paused queue's jobs wait,
    and a scheduled one there does not stop the others being brought forward."""
    kinds.add("tests.paused_helper")
    durable.pause_queue("reports")
    held = durable.start("tests.paused_helper", queue="reports", run_after=60)
    later = durable.start("tests.paused_helper", queue="mail", run_after=120)
    assert [r.job_id for r in testing.run_jobs(fast_forward=True)] == [later.id]
    assert reload(held).status == "pending"
    durable.resume_queue("reports")
    assert [r.job_id for r in testing.run_jobs(fast_forward=True)] == [held.id]


@pytest.mark.django_db
def test_a_burst_run_does_not_wait_for_a_retry_on_a_paused_queue():
    """``durable_worker --burst --wait-for-retries`` waits only for what it could claim."""
    running(queue_name="reports", lease_owner=None, lease_expires_at=None, next_run_at=30)
    assert reads.waiting_out_a_backoff(["reports"], ["tests.noop"])[0] == 1
    durable.pause_queue("reports")
    assert reads.waiting_out_a_backoff(["reports"], ["tests.noop"]) == (0, None)
