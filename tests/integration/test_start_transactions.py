"""Invariant 9, transactional start, with real concurrency: the start lives and dies with
the caller's transaction, the wake-up is sent only at commit, and the unique indexes
settle races between transactions that cannot see each other's rows."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction
from django.test import override_settings

import durable_jobs as durable
from durable_jobs.exceptions import LockKeyHeld
from durable_jobs.models import Job
from durable_jobs.states import LIVE_STATUSES
from testproject.demo.models import Report
from tests.integration.support import (  # noqa: F401  (other_connection_fixture: fixture override)
    in_thread,
    job_count,
    other_connection_fixture,
)

KIND = "tests.start"
CHANNEL = "durable_jobs"


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    kinds.add("tests.queued", queue="reports")
    return KIND


class Rollback(Exception):
    pass


def _notifications(conn, *, timeout: float = 0.3) -> list:
    return list(conn.notifies(timeout=timeout, stop_after=5))


# ---------------------------------------------------------------------------------------
# Rollback and the wake-up
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_start__rolled_back_leaves_no_row_and_sends_no_notify(kind, other_connection):
    """Invariant 9: a rolled-back start leaves no trace: no row, no wake-up, no held key."""
    other_connection.execute(f"LISTEN {CHANNEL}")

    with pytest.raises(Rollback), transaction.atomic():
        Report.objects.create(name="domain row")
        job = durable.start(kind, input={"n": 1}, lock_key="K", idempotency_key="req-1")
        assert Job.objects.filter(id=job.id).exists()
        raise Rollback

    assert job_count(other_connection) == 0
    assert Report.objects.count() == 0
    assert _notifications(other_connection) == []
    # The rolled-back start left no trace: neither its lock key nor its idempotency key.
    again = durable.start(kind, lock_key="K", idempotency_key="req-1")
    assert again.id != job.id


@pytest.mark.django_db(transaction=True)
def test_start__committed_sends_one_notify_at_commit(kind, other_connection):
    """Invariant 9: the wake-up is delivered at commit, naming the queue."""
    other_connection.execute(f"LISTEN {CHANNEL}")

    with transaction.atomic():
        durable.start("tests.queued")
        assert _notifications(other_connection, timeout=0.2) == []  # not before commit

    [notice] = _notifications(other_connection)
    assert (notice.channel, notice.payload) == (CHANNEL, "reports")


@pytest.mark.django_db(transaction=True)
def test_start__outside_a_transaction_commits_and_notifies(kind, other_connection):
    """Invariant 9: in autocommit the start is its own transaction."""
    other_connection.execute(f"LISTEN {CHANNEL}")

    job = durable.start(kind)

    assert other_connection.execute(
        "SELECT status FROM durable_jobs_job WHERE id = %s", [job.id]
    ).fetchone() == ("pending",)
    assert len(_notifications(other_connection)) == 1


@pytest.mark.django_db(transaction=True)
def test_start__sends_no_notify_when_the_channel_is_disabled(kind, other_connection):
    """Invariant 9 / DESIGN §6: NOTIFY_CHANNEL=None (a transaction pooler) sends nothing."""
    other_connection.execute(f"LISTEN {CHANNEL}")
    with override_settings(DURABLE_JOBS={"NOTIFY_CHANNEL": None}):
        durable.start(kind)
    assert _notifications(other_connection) == []
    assert job_count(other_connection) == 1


# ---------------------------------------------------------------------------------------
# Races between transactions
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_start__two_transactions_racing_for_one_lock_key_leave_one_live_job(kind):
    """Invariant 9: both start at once behind a barrier and hold their transaction a while,
    so neither lookup can see the other's row; the unique index decides."""
    barrier = threading.Barrier(2, timeout=5)
    outcomes: list[object] = []

    def contender() -> None:
        try:
            with transaction.atomic():
                barrier.wait()
                job = durable.start(kind, lock_key="report:1")
                time.sleep(0.3)
            outcomes.append(job)
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            outcomes.append(error)

    threads = [in_thread(contender), in_thread(contender)]
    for thread in threads:
        thread.join(10)

    jobs = [o for o in outcomes if isinstance(o, Job)]
    refusals = [o for o in outcomes if isinstance(o, LockKeyHeld)]
    assert len(jobs) == 1 and len(refusals) == 1, outcomes
    assert refusals[0].holder_id == jobs[0].id
    assert Job.objects.filter(lock_key="report:1", status__in=LIVE_STATUSES).count() == 1


@pytest.mark.django_db(transaction=True)
def test_start__losing_the_lock_key_race_at_the_index_leaves_the_callers_transaction_usable(kind):
    """Invariant 9: the other transaction's row is uncommitted, so our lookup misses it and
    our insert waits on the unique index, then fails. That failure is contained in a
    savepoint: we get a clear ``LockKeyHeld`` naming the winner, and our transaction
    carries on and commits."""
    holding, release = threading.Event(), threading.Event()
    winner: dict[str, Job] = {}

    def first() -> None:
        with transaction.atomic():
            winner["job"] = durable.start(kind, lock_key="report:1")
            holding.set()
            release.wait(5)

    thread = in_thread(first)
    assert holding.wait(5)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    started = time.monotonic()
    with transaction.atomic():
        Report.objects.create(name="ours")
        with pytest.raises(LockKeyHeld) as caught:
            durable.start(kind, lock_key="report:1")
        waited = time.monotonic() - started
        Report.objects.create(name="after the refusal")
        mine = durable.start(kind, lock_key="report:2")
    thread.join(5)

    assert waited >= 0.25, "the insert should have waited on the winner's uncommitted row"
    assert caught.value.holder_id == winner["job"].id
    assert Report.objects.count() == 2
    assert Job.objects.filter(id=mine.id).exists()
    assert Job.objects.filter(lock_key="report:1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_start__when_the_racing_transaction_rolls_back_the_waiting_start_wins(kind):
    """Invariant 9: the unique index waits for the other transaction's outcome."""
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                durable.start(kind, lock_key="report:1")
                holding.set()
                release.wait(5)
                raise Rollback
        except Rollback:
            pass

    thread = in_thread(first)
    assert holding.wait(5)
    threading.Timer(0.3, release.set).start()
    job = durable.start(kind, lock_key="report:1")
    thread.join(5)

    assert list(Job.objects.values_list("id", flat=True)) == [job.id]


@pytest.mark.django_db(transaction=True)
def test_start__racing_starts_with_one_idempotency_key_return_the_first_job(kind):
    """Invariant 9: the idempotency index settles the race; the loser gets the winner's job."""
    holding, release = threading.Event(), threading.Event()
    winner: dict[str, Job] = {}

    def first() -> None:
        with transaction.atomic():
            winner["job"] = durable.start(kind, idempotency_key="req-1")
            holding.set()
            release.wait(5)

    thread = in_thread(first)
    assert holding.wait(5)
    threading.Timer(0.3, release.set).start()
    with transaction.atomic():
        second = durable.start(kind, idempotency_key="req-1")
        Report.objects.create(name="still usable")
    thread.join(5)

    assert second.id == winner["job"].id
    assert Job.objects.count() == 1 and Report.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_start__a_retry_racing_its_original_with_a_lock_key_returns_the_first_job(kind):
    """Invariant 9: a retried request (same idempotency key and lock key) racing its
    original loses at the lock-key index, yet gets the original back, exactly as when the
    two calls run one after the other."""
    holding, release = threading.Event(), threading.Event()
    winner: dict[str, Job] = {}

    def first() -> None:
        with transaction.atomic():
            winner["job"] = durable.start(kind, idempotency_key="req-1", lock_key="report:1")
            holding.set()
            release.wait(5)

    thread = in_thread(first)
    assert holding.wait(5)
    threading.Timer(0.3, release.set).start()
    try:
        second = durable.start(kind, idempotency_key="req-1", lock_key="report:1")
    finally:
        thread.join(5)

    assert second.id == winner["job"].id
