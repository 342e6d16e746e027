"""The reconciler's steps, each through the store's SKIP LOCKED selections and CAS statements."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connections
from django.test import override_settings

from durable_jobs import conf, store
from durable_jobs.runtime.reconciler import Reconciler, run_as_leader
from durable_jobs.states import Lease
from tests.factories import JobFactory, reload, running
from tests.integration.support import other_connection_fixture  # noqa: F401  (fixture override)

pytestmark = pytest.mark.django_db


def settings_with(**overrides):
    base = dict(conf.get().__class__.__dataclass_fields__)
    current = {name: getattr(conf.get(), name) for name in base}
    current.update(overrides)
    return override_settings(DURABLE_JOBS=current)


@pytest.fixture
def mirrored(kinds):
    """A kind whose mirror records every outcome it sees."""
    seen: list[tuple[object, str]] = []
    kinds.add("tests.mirrored", mirror=lambda job, outcome: seen.append((job.id, outcome)))
    return seen


class TestCancelStep:
    def test_ends_a_pending_job_whose_cancel_was_requested_with_its_mirror(self, mirrored):
        job = JobFactory(kind="tests.mirrored", cancel_requested_at=-1)
        report = Reconciler().run_pass()
        assert report.cancelled == 1
        after = reload(job)
        assert after.status == "cancelled" and after.domain_mirrored_at is not None
        assert mirrored == [(job.id, "cancelled")]

    def test_ends_a_running_job_whose_worker_is_gone(self, mirrored):
        gone = running(kind="tests.mirrored", cancel_requested_at=-5, lease_expires_at=-60)
        released = running(
            kind="tests.mirrored",
            cancel_requested_at=-5,
            lease_owner=None,
            lease_expires_at=-1,
            next_run_at=30,
        )
        Reconciler().run_pass()
        assert reload(gone).status == "cancelled"
        assert reload(released).status == "cancelled"

    def test_leaves_a_running_job_with_a_live_lease_to_its_worker(self, mirrored):
        live = running(kind="tests.mirrored", cancel_requested_at=-1, lease_expires_at=60)
        Reconciler().run_pass()
        assert reload(live).status == "running", (
            "Invariant 8: the worker ends it at its next heartbeat"
        )
        assert mirrored == []

    def test_a_job_not_asked_to_cancel_is_never_cancelled(self, mirrored):
        job = JobFactory(kind="tests.mirrored")
        Reconciler().run_pass()
        assert reload(job).status == "pending"


class TestOrphanStep:
    def test_takes_an_orphan_back_to_pending_under_a_new_epoch(self, kinds):
        kinds.add("tests.noop")
        orphan = running(lease_expires_at=-60, lease_epoch=4)
        report = Reconciler().run_pass()
        assert report.orphans_taken == 1
        after = reload(orphan)
        assert after.status == "pending" and after.lease_epoch == 5 and after.redrives == 1
        assert after.redrives_since_commit == 1
        old = Lease(job_id=orphan.id, owner="worker-a", epoch=4, ttl_ms=1000)
        assert store.heartbeat(old) is None, "the old worker, waking up, finds its lease gone"

    def test_leaves_a_lease_inside_its_grace_and_a_released_retry_alone(self, kinds):
        kinds.add("tests.noop")
        fresh = running(lease_expires_at=-0.1)  # expired, but inside the 0.5 s grace
        retry = running(lease_owner=None, lease_expires_at=-3600, next_run_at=-3600)
        Reconciler().run_pass()
        assert reload(fresh).status == "running" and reload(fresh).redrives == 0
        after = reload(retry)
        assert after.status == "running" and after.redrives == 0, (
            "DESIGN §6: a queued retry is not an orphan"
        )

    def test_parks_a_job_redriven_too_often_without_progress_as_poison(self, kinds):
        kinds.add("tests.noop")
        job = running(lease_expires_at=-60, redrives_since_commit=5)
        with settings_with(MAX_REDRIVES_WITHOUT_COMMIT=5):
            report = Reconciler().run_pass()
        after = reload(job)
        assert report.parked == 1
        assert (
            after.status == "failed"
            and after.error_code == "poison"
            and after.parked_at is not None
        )
        assert "6 times" in after.error_message

    def test_a_committed_unit_resets_the_poison_budget(self, kinds):
        kinds.add("tests.noop")
        job = running(lease_expires_at=60, redrives_since_commit=5)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=1)
        assert store.heartbeat(lease, committed=True) is False
        # the lease (1 ms) now expires; the job is an orphan again, but with a fresh budget
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "UPDATE durable_jobs_job"
                " SET lease_expires_at = clock_timestamp() - interval '1 minute' "
                "WHERE id = %s",
                [job.id],
            )
        with settings_with(MAX_REDRIVES_WITHOUT_COMMIT=5):
            Reconciler().run_pass()
        after = reload(job)
        assert after.status == "pending" and after.redrives_since_commit == 1

    def test_records_a_verdict_whose_worker_died_without_running_the_work_again(self, mirrored):
        job = running(
            kind="tests.mirrored",
            lease_expires_at=-60,
            error_code="retry_exhausted",
            error_class="transient",
            consecutive_failures=5,
        )
        report = Reconciler().run_pass()
        after = reload(job)
        assert report.verdicts_recorded == 1
        assert after.status == "failed" and after.error_code == "retry_exhausted"
        assert after.redrives == 0, "a decided verdict is recorded, never re-driven"
        assert mirrored == [(job.id, "failed")]


class TestStalePendingStep:
    def test_counts_work_waiting_past_the_pending_ttl_and_spends_nothing(self, kinds):
        kinds.add("tests.noop")
        stale = JobFactory(pending_since=-7200, next_run_at=-7200)
        with settings_with(PENDING_TTL=60):
            report = Reconciler().run_pass()
        assert report.stale_pending == 1
        after = reload(stale)
        assert (after.status, after.redrives, after.redrives_since_commit, after.lease_epoch) == (
            "pending",
            0,
            0,
            0,
        )


class TestRetention:
    def test_deletes_only_old_finished_unparked_jobs_in_batches(self, kinds):
        old_done = [
            JobFactory(status="completed", finished_at=-90_000, pending_since=None)
            for _ in range(5)
        ]
        recent = JobFactory(status="completed", finished_at=-10, pending_since=None)
        parked = JobFactory(
            status="failed", finished_at=-90_000, parked_at=-90_000, error_code="poison"
        )
        live = JobFactory(pending_since=-90_000)
        with settings_with(RETENTION=86_400):
            assert store.delete_finished(older_than_ms=86_400_000, limit=2) == 2, "bounded batch"
            Reconciler().run_pass()
        assert all(reload(job) is None for job in old_done)
        assert (
            reload(recent) is not None and reload(parked) is not None and reload(live) is not None
        )

    def test_retention_none_keeps_everything(self, kinds):
        job = JobFactory(status="completed", finished_at=-(10**7), pending_since=None)
        with settings_with(RETENTION=None):
            assert Reconciler().run_pass().deleted == 0
        assert reload(job) is not None


@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_side_by_side_act_once_on_each_orphan(kinds):
    """Invariant 14: SKIP LOCKED gives each pass a disjoint share; no job is taken twice."""
    kinds.add("tests.noop")
    orphans = [running(lease_expires_at=-60) for _ in range(150)]
    barrier = threading.Barrier(2)
    reports = []

    def one_pass():
        barrier.wait()
        try:
            while True:
                report = Reconciler().run_pass()
                reports.append(report)
                if report.orphans_taken == 0:
                    break
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.orphans_taken for r in reports) == 150
    assert {reload(job).redrives for job in orphans} == {1}, "every orphan re-driven exactly once"


def test_take_orphan_decides_the_poison_verdict_in_its_own_update(kinds):
    """Invariant 3: the park is decided from the counter the take increments, in one statement."""
    kinds.add("tests.noop")
    job = running(lease_expires_at=-60, redrives_since_commit=2)
    parked = store.take_orphan(job.id, grace_ms=0, backoff_ms=0, max_redrives=2)
    assert (parked.status, parked.error_code, parked.redrives_since_commit) == (
        "failed",
        "poison",
        3,
    )
    assert parked.parked_at is not None and parked.next_run_at is None and parked.lease_epoch == 2
    below = running(lease_expires_at=-60, redrives_since_commit=1)
    assert store.take_orphan(below.id, grace_ms=0, backoff_ms=0, max_redrives=2).status == "pending"


# ---------------------------------------------------------------------------------------
# Issue 9 item 6: a parked job tells its subject
# ---------------------------------------------------------------------------------------


def _parked(reason, **fields):
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
    }
    defaults.update(fields)
    return JobFactory(**defaults)


@pytest.fixture
def told(kinds):
    """A kind whose mirror records what it was told: (job id, outcome, error code, parked?)."""
    seen: list[tuple] = []
    kinds.add(
        "tests.told",
        mirror=lambda job, outcome: seen.append(
            (job.id, outcome, job.error_code, job.parked_at is not None)
        ),
    )
    return seen


class TestTellParkedStep:
    @pytest.mark.parametrize("reason", ["poison", "mirror_failed"])
    def test_a_parked_job_reaches_its_subject_as_failed_with_its_reason(self, told, reason):
        job = _parked(reason, kind="tests.told")
        report = Reconciler().run_pass()
        assert told == [(job.id, "failed", reason, True)]
        assert report.parked_told == 1
        after = reload(job)
        assert (
            after.domain_mirrored_at is not None
            and after.status == "failed"
            and after.error_code == reason
        )
        Reconciler().run_pass()
        assert len(told) == 1, "told once"

    def test_a_job_parked_as_poison_in_a_pass_is_told_in_that_pass(self, told):
        job = running(kind="tests.told", lease_expires_at=-60, redrives_since_commit=5)
        with settings_with(MAX_REDRIVES_WITHOUT_COMMIT=5):
            report = Reconciler().run_pass()
        assert report.parked == 1
        assert told == [(job.id, "failed", "poison", True)]

    def test_a_mirror_that_always_fails_is_tried_a_bounded_number_of_times(self, kinds, caplog):
        calls = []

        def mirror(job, outcome):
            calls.append(outcome)
            raise RuntimeError("the domain table is gone")

        kinds.add("tests.broken", mirror=mirror, max_mirror_attempts=3)
        job = _parked("mirror_failed", kind="tests.broken")
        with caplog.at_level("WARNING", logger="durable_jobs.reconciler"):
            for _ in range(5):
                Reconciler().run_pass()
        assert calls == ["failed"] * 3
        after = reload(job)
        assert (after.park_mirror_attempts, after.domain_mirrored_at, after.status) == (
            3,
            None,
            "failed",
        )
        assert sum("giving up" in record.getMessage() for record in caplog.records) == 1

    def test_a_kind_without_a_mirror_is_stamped_and_an_unknown_kind_is_left_for_one_that_knows_it(
        self, kinds
    ):
        kinds.add("tests.plain")
        plain = _parked("poison", kind="tests.plain")
        unknown = _parked("poison", kind="tests.nobody_knows")
        Reconciler().run_pass()
        assert reload(plain).domain_mirrored_at is not None
        assert reload(unknown).domain_mirrored_at is None


# ---------------------------------------------------------------------------------------
# Issue 9 item 8: user mirror code runs with only its own row locked; counts survive
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_mirror_runs_with_only_its_own_job_row_locked(kinds, other_connection):
    """Invariants 11 and 14: while a mirror runs, the pass holds no other candidate's row."""
    seen = []

    def mirror(job, outcome):
        others = [j.id for j in jobs if j.id != job.id]
        with other_connection.transaction():
            other_connection.execute("SET LOCAL lock_timeout = '1s'")
            try:
                locked = other_connection.execute(
                    "SELECT id FROM durable_jobs_job WHERE id = ANY(%s) FOR UPDATE NOWAIT", [others]
                ).fetchall()
                seen.append(("others free", len(locked)))
            except psycopg.errors.LockNotAvailable:
                seen.append(("others locked", 0))
        with other_connection.transaction():
            try:
                other_connection.execute(
                    "SELECT id FROM durable_jobs_job WHERE id = %s FOR UPDATE NOWAIT", [job.id]
                )
                seen.append(("own free", 1))
            except psycopg.errors.LockNotAvailable:
                seen.append(("own locked", 1))

    kinds.add("tests.watching", mirror=mirror)
    jobs = [JobFactory(kind="tests.watching", cancel_requested_at=-10 + n) for n in range(3)]
    report = Reconciler().run_pass()
    assert report.cancelled == 3
    assert seen == [("others free", 2), ("own locked", 1)] * 3


@pytest.mark.django_db(transaction=True)
def test_a_mirror_failure_count_survives_a_pass_that_dies(kinds, other_connection):
    """Invariant 11: the count is its own autocommit statement, not part of the pass."""
    backend = connections["default"]

    def mirror(job, outcome):
        if job.id == failing.id:
            raise RuntimeError("the mirror refused")
        # The next candidate's mirror loses the connection: the pass dies here.
        pid = backend.connection.info.backend_pid
        other_connection.execute(
            "SELECT pg_terminate_backend(%s, 5000)", [pid]
        )  # waits until it is gone
        with backend.cursor() as cursor:
            cursor.execute("SELECT 1")

    kinds.add("tests.fragile", mirror=mirror, max_mirror_attempts=5)
    failing = JobFactory(kind="tests.fragile", cancel_requested_at=-20)
    cut = JobFactory(kind="tests.fragile", cancel_requested_at=-10)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the cut connection raises
        Reconciler().run_pass()
    backend.close()
    counted = other_connection.execute(
        "SELECT status, mirror_attempts FROM durable_jobs_job WHERE id = %s", [failing.id]
    ).fetchone()
    assert counted == ("pending", 1), "the failed attempt stays counted"
    stranded = other_connection.execute(
        "SELECT id FROM durable_jobs_job WHERE id = ANY(%s) FOR UPDATE NOWAIT",
        [[failing.id, cut.id]],
    ).fetchall()
    assert len(stranded) == 2, "nothing is left locked"
    assert reload(cut).status == "pending" and reload(cut).mirror_attempts == 0


def test_a_mirror_raising_a_database_error_never_blocks_the_reconciler(kinds):
    """Invariant 11: a mirror's own database error (an IntegrityError in the domain table)
    is counted against that job's mirror budget; the pass goes on to its neighbours and
    its later steps, and the job is parked ``mirror_failed`` once the budget is spent."""
    from django.db import IntegrityError

    def mirror(job, outcome):
        raise IntegrityError("duplicate key in the domain table")

    kinds.add("tests.bad_mirror", mirror=mirror, max_mirror_attempts=2)
    kinds.add("tests.good")
    bad = JobFactory(kind="tests.bad_mirror", cancel_requested_at=-10)
    good = JobFactory(kind="tests.good", cancel_requested_at=-5)
    orphan = running(kind="tests.good", lease_expires_at=-60)
    Reconciler().run_pass()
    assert reload(good).status == "cancelled", "the neighbour was not blocked"
    assert reload(orphan).status == "pending", "the later steps still ran"
    assert reload(bad).mirror_attempts == 1 and reload(bad).status == "pending"
    Reconciler().run_pass()
    parked = reload(bad)
    assert (parked.status, parked.error_code, parked.mirror_attempts) == (
        "failed",
        "mirror_failed",
        2,
    )


# ---------------------------------------------------------------------------------------
# Issue 9 item 4: one leader at a time runs passes
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_as_leader__runs_no_pass_while_another_worker_leads_and_takes_over_when_it_resigns(
    kinds,
):
    """Invariant 14: every worker runs the loop, only the leader reconciles; leadership moves."""
    kinds.add("tests.noop")
    store.acquire_leadership("reconciler", "host:1:alive", ttl_ms=600_000)
    orphan = running(lease_expires_at=-60)
    stop = threading.Event()
    with settings_with(RECONCILE_INTERVAL=0.05):
        thread = threading.Thread(target=run_as_leader, args=(stop, "host:2:second"))
        thread.start()
        try:
            stop.wait(0.5)  # about ten intervals
            assert reload(orphan).status == "running", "the second worker ran no pass"
            assert store.resign_leadership("reconciler", "host:1:alive")
            wait_for(lambda: reload(orphan).status == "pending")
            assert _leader() == ("host:2:second", 2)
        finally:
            stop.set()
            thread.join(10)
    assert not thread.is_alive()
    assert _leader() == (None, 2), "a stopping leader resigns"


def _leader():
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT owner, epoch FROM durable_jobs_leader WHERE name = 'reconciler'")
        return cursor.fetchone()


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "args, reconcile", [([], True), (["--reconcile"], True), (["--no-reconcile"], False)]
)
def test_durable_worker__reconciles_unless_told_not_to(args, reconcile):
    """Issue 9 item 4: `manage.py durable_worker` alone recovers crashed workers' jobs;
    `--reconcile` stays accepted for existing command lines."""
    from durable_jobs.management.commands.durable_worker import Command

    options = Command().create_parser("manage.py", "durable_worker").parse_args(args)
    assert options.reconcile is reconcile
