"""The service's cancel (invariant 8) and redrive (invariant 13)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.exceptions import JobBusy, WrongState
from tests.acceptance.harness import ROOT
from tests.conftest import database_url
from tests.factories import JobFactory, reload, running
from tests.integration.support import db_now, lease_of, other_connection_fixture  # noqa: F401  (fixture)

KIND = "tests.ops"


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    return KIND


def _finished(status, **fields):
    return JobFactory(kind=KIND, status=status, next_run_at=None, finished_at=-1, **fields)


# ---------------------------------------------------------------------------------------
# cancel
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel__of_a_pending_job_is_a_request_the_reconciler_ends(kind):
    """Invariant 8: cancel writes the request, never the status."""
    job = durable.start(kind)
    asked = durable.cancel(job.id, by="alice")

    assert asked.status == "pending"
    assert asked.cancel_requested_at is not None and asked.cancelled_by == "alice"
    assert store.dequeue(["default"], "host", 60_000, kinds=None) == []
    assert store.cancel_pending(job.id).status == "cancelled"


@pytest.mark.django_db
def test_cancel__of_a_running_job_is_seen_at_its_next_heartbeat(kind):
    """Invariant 8."""
    job = running(kind=KIND)
    asked = durable.cancel(job.id)

    assert asked.status == "running"
    assert store.heartbeat(lease_of(job)) is True
    assert store.finish_cancelled(lease_of(job)).status == "cancelled"


@pytest.mark.django_db
def test_cancel__twice_keeps_the_first_request(kind):
    """Invariant 8."""
    job = durable.start(kind)
    first = durable.cancel(job.id, by="alice")
    second = durable.cancel(job.id, by="bob")
    assert (second.cancelled_by, second.cancel_requested_at) == ("alice", first.cancel_requested_at)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_cancel__of_a_finished_job_is_wrong_state(kind, status):
    """Invariants 8 and 13."""
    job = _finished(status)
    with pytest.raises(WrongState) as caught:
        durable.cancel(job.id, by="alice")
    assert (caught.value.status, caught.value.operation) == (status, "cancel")
    assert reload(job).cancel_requested_at is None


# ---------------------------------------------------------------------------------------
# redrive
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_redrive__reissues_a_failed_job_with_fresh_budgets(kind):
    """Invariant 13: budgets reset, identity kept."""
    job = _finished(
        "failed",
        parked_at=-1,
        error_code="poison",
        error_class="terminal",
        redrives=1,
        redrives_since_commit=5,
        consecutive_failures=2,
        lease_epoch=4,
    )
    redriven = durable.redrive(job.id)

    assert redriven.status == "pending"
    assert (redriven.redrives, redriven.lease_epoch) == (2, 5)
    assert (redriven.redrives_since_commit, redriven.consecutive_failures) == (0, 0)
    assert redriven.parked_at is None and redriven.error_code is None
    assert redriven.next_run_at <= db_now()
    [claimed] = store.dequeue(["default"], "host", 60_000, kinds=None)
    assert claimed.id == job.id


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_redrive__completed_and_cancelled_are_final(kind, status):
    """Invariant 13: even with force."""
    job = _finished(status)
    for force in (False, True):
        with pytest.raises(WrongState) as caught:
            durable.redrive(job.id, force=force)
        assert "final" in str(caught.value)
    assert reload(job).status == status


@pytest.mark.django_db
def test_redrive__unrecoverable_needs_force(kind):
    """Invariant 13."""
    job = _finished("failed", error_code="unrecoverable", error_class="unrecoverable")
    with pytest.raises(WrongState) as caught:
        durable.redrive(job.id)
    assert "force" in str(caught.value)
    assert reload(job).status == "failed"
    assert durable.redrive(job.id, force=True).status == "pending"


@pytest.mark.django_db
def test_redrive__a_running_job_only_once_its_lease_expired_past_the_grace(kind):
    """Invariants 4 and 13 (the orphan grace in the test settings is 0.5 s)."""
    live = running(kind=KIND, lease_expires_at=30)
    with pytest.raises(WrongState) as caught:
        durable.redrive(live.id)
    assert "still live" in str(caught.value)

    dead = running(kind=KIND, lease_expires_at=-60)
    taken = durable.redrive(dead.id)
    assert (taken.status, taken.lease_epoch) == ("pending", dead.lease_epoch + 1)
    assert store.heartbeat(lease_of(dead)) is None


@pytest.mark.django_db
def test_redrive__a_pending_job_is_wrong_state(kind):
    """Invariant 13: a live pending job is not re-driven."""
    job = durable.start(kind)
    with pytest.raises(WrongState):
        durable.redrive(job.id)
    assert reload(job).redrives == 0


@pytest.mark.django_db
def test_redrive__refused_with_lock_key_held_when_a_live_job_took_the_key(kinds):
    """A failed job's lock key may have been taken since; re-driving it would make two
    live jobs on one key. The refusal names the holder and leaves the transaction usable."""
    from django.db import transaction

    from tests.factories import JobFactory, reload

    kinds.add("tests.keyed")
    failed = JobFactory(
        kind="tests.keyed",
        status="failed",
        lock_key="K",
        finished_at=-1,
        pending_since=None,
        error_code="terminal",
        error_class="terminal",
    )
    holder = durable.start("tests.keyed", lock_key="K")
    with transaction.atomic():
        with pytest.raises(durable.LockKeyHeld) as caught:
            durable.redrive(failed.id)
        assert caught.value.holder_id == holder.id
        durable.start("tests.keyed")  # the transaction is still usable
    assert reload(failed).status == "failed"


# ---------------------------------------------------------------------------------------
# Operators never hang (issue 9 item 7): a worker's fenced() transaction holds the job row
# FOR UPDATE for as long as its domain write lasts; cancel and redrive wait a bounded time.
# ---------------------------------------------------------------------------------------

WAIT = 0.2


@pytest.fixture
def short_wait(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "OPERATOR_LOCK_WAIT": WAIT}


@pytest.fixture
def held(other_connection):
    """Hold a job row the way a worker's fenced() does: SELECT ... FOR UPDATE in an open
    transaction."""

    @contextlib.contextmanager
    def hold(job):
        with other_connection.transaction():
            rows = other_connection.execute(
                "SELECT id FROM durable_jobs_job WHERE id = %s FOR UPDATE", [job.id]
            ).fetchall()
            assert len(rows) == 1
            yield

    return hold


def _lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return cursor.fetchone()[0]


def _set_local_lock_timeout(value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{value}'")


OPERATIONS = {
    "cancel": (
        lambda: running(kind=KIND),
        lambda job: durable.cancel(job.id, by="alice"),
        lambda row: row.cancel_requested_at is None,
    ),
    "redrive": (
        lambda: _finished("failed", error_code="poison", parked_at=-1),
        lambda job: durable.redrive(job.id),
        lambda row: row.status == "failed",
    ),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("operation", OPERATIONS)
def test_operator_action__behind_a_held_row_raises_job_busy_and_leaves_the_caller_s_transaction_usable(
    kind, short_wait, held, operation
):
    """Issue 9 item 7: a bounded wait and a clear answer; nothing changed, the caller's transaction
    goes on, and their own lock_timeout is theirs again."""
    build, act, unchanged = OPERATIONS[operation]
    job = build()
    with held(job), transaction.atomic():
        _set_local_lock_timeout("7s")
        other = durable.start(kind)
        with pytest.raises(JobBusy) as caught:
            act(job)
        assert _lock_timeout() == "7s", "the caller's setting is restored"
        assert durable.get(other.id).status == "pending", "the caller's transaction is usable"
    error = caught.value
    assert (error.job_id, error.operation) == (job.id, operation)
    assert str(job.id) in str(error) and "a worker holds it in a transaction" in str(error)
    assert "try again" in str(error)
    assert unchanged(reload(job)), "nothing was changed"
    assert reload(other) is not None, "the caller's own work committed"
    with transaction.atomic():  # once the worker's transaction ends, the same call succeeds
        _set_local_lock_timeout("7s")
        act(job)
        assert _lock_timeout() == "7s", "the bound was for the operator's statement only"
    assert not unchanged(reload(job))


@pytest.mark.django_db(transaction=True)
def test_cli_cancel__behind_a_held_row_exits_1_with_the_reason(kind, held):
    """Issue 9 item 7: the command line answers instead of hanging."""
    job = running(kind=KIND)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "testproject.settings_test",
    }
    with held(job):
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "durable_jobs", "cancel", str(job.id)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert "a worker holds it in a transaction" in done.stderr and str(job.id) in done.stderr
    assert reload(job).cancel_requested_at is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(30)
def test_admin_cancel__behind_a_held_row_shows_a_busy_message(kind, short_wait, held, client):
    """Issue 9 item 7: the admin page answers with a message instead of hanging."""
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_job", "cancel_job"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    busy, free = running(kind=KIND), running(kind=KIND)
    with held(busy):
        response = client.post(
            "/admin/durable_jobs/job/",
            {
                "action": "cancel_jobs",
                "confirm": "yes",
                "_selected_action": [str(busy.id), str(free.id)],
            },
            follow=True,
        )
    text = response.content.decode()
    assert "Cancellation requested for 1 job(s)." in text
    assert (
        "Busy, not changed, try again: 1" in text and "a worker holds it in a transaction" in text
    )
    assert reload(busy).cancel_requested_at is None and reload(free).cancel_requested_at is not None
