"""Fault-injection scenarios. Each runs real worker processes with a named fault, lets a
rescuing worker (with its reconciler) finish, then checks every invariant over the
recorded history (tests/chaos/history.py)."""

from __future__ import annotations

import signal
import time

import pytest

import durable_jobs as durable
from durable_jobs.models import Job
from tests.acceptance.harness import backends_of, terminate_backends, wait_until
from tests.chaos.conftest import assert_invariants

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

RESCUE = {"DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"}


def start_imports(n: int, rows: int = 6, delay: float = 0.05) -> list:
    return [
        durable.start("demo.import", input={"rows": rows, "batch": 1, "delay": delay})
        for _ in range(n)
    ]


def finish_with_rescuer(processes, jobs, *, timeout: float = 60, env: dict | None = None) -> None:
    processes.worker(
        "--concurrency", "2", "--reconcile", app_name="durable-rescuer", env=RESCUE | (env or {})
    )
    ids = [job.id for job in jobs]
    wait_until(
        lambda: not Job.objects.filter(id__in=ids, status__in=["pending", "running"]).exists(),
        timeout=timeout,
        message="every job to finish after the fault",
    )


@pytest.mark.parametrize(
    "point",
    [
        "after_claim",
        "domain_before_commit",
        "domain_after_commit",
        "terminal_inside",
        "terminal_after",
        "before_heartbeat",
    ],
)
def test_sigkill_at_a_named_point_loses_nothing_and_duplicates_nothing(recorded, processes, point):
    jobs = start_imports(3, rows=6, delay=0.2)  # long enough for heartbeats to come due
    # Thread execution: the domain points run in the handler's process, which is the
    # worker itself only there (process execution: see the test below).
    victim = processes.worker(
        app_name="durable-victim",
        env={"DURABLE_JOBS_FAULTS": f"{point}=kill@2", "DURABLE_JOBS_EXECUTION": "thread"},
    )
    victim.wait(timeout=60)
    assert victim.popen.returncode == -signal.SIGKILL, victim.output()
    assert f"FAULT {point} kill" in victim.output()
    finish_with_rescuer(processes, jobs)
    assert all(job.status == "completed" for job in Job.objects.filter(id__in=[j.id for j in jobs]))
    assert_invariants(recorded, processes)


@pytest.mark.parametrize("point", ["domain_before_commit", "domain_after_commit"])
def test_process_execution__a_handler_process_killed_inside_or_after_its_fence(
    recorded, processes, point
):
    """Process execution: SIGKILL lands in the child running the handler, mid-fence or just
    after its commit. The worker lives on, charges the interruption to the re-drive budget,
    and the job resumes from its checkpoint: nothing lost, nothing written twice."""
    jobs = start_imports(3, rows=6, delay=0.2)
    worker = processes.worker(
        "--concurrency",
        "2",
        "--reconcile",
        app_name="durable-victim",
        env={**RESCUE, "DURABLE_JOBS_FAULTS": f"{point}=kill@2"},
    )
    ids = [job.id for job in jobs]
    wait_until(
        lambda: not Job.objects.filter(id__in=ids, status__in=["pending", "running"]).exists(),
        timeout=60,
        message="every job to finish",
    )
    assert f"FAULT {point} kill" in worker.output()
    assert "died (signal 9)" in worker.output()
    assert worker.popen.poll() is None, "only the handler's process died"
    assert all(job.status == "completed" for job in Job.objects.filter(id__in=ids))
    assert sum(job.redrives for job in Job.objects.filter(id__in=ids)) >= 1, "the crash was charged"
    assert_invariants(recorded, processes)


def test_a_reconciler_killed_between_select_and_update(recorded, processes):
    jobs = start_imports(2, rows=20, delay=0.1)
    first = processes.worker(app_name="durable-first")
    wait_until(lambda: Job.objects.filter(processed_count__gte=2).count() == 2, message="progress")
    first.signal(signal.SIGKILL)
    first.wait()
    reconciler = processes.worker(
        "--reconcile",
        "--queues",
        "nothing",
        app_name="durable-reconciler",
        env={**RESCUE, "DURABLE_JOBS_FAULTS": "reconciler_between=kill"},
    )
    reconciler.wait(timeout=30)
    assert "FAULT reconciler_between kill" in reconciler.output()
    finish_with_rescuer(processes, jobs)
    assert_invariants(recorded, processes)


def stop_past_the_lease_and_resume(processes, jobs, *, env: dict | None = None) -> None:
    """Two jobs under way in a worker that is then SIGSTOPped past its lease; a rescuer takes
    both back and runs them; the stopped worker resumes, tries a fenced write for each and is
    refused; every job finishes."""
    extra = env or {}
    zombie = processes.worker("--concurrency", "2", app_name="durable-zombie", env=extra)
    wait_until(
        lambda: Job.objects.filter(processed_count__gte=1).count() == 2, message="both under way"
    )
    zombie.signal(signal.SIGSTOP)
    time.sleep(4.5)  # past the 3 s lease and the 0.5 s grace
    processes.worker(
        "--concurrency", "2", "--reconcile", app_name="durable-rescuer", env=RESCUE | extra
    )
    wait_until(
        lambda: Job.objects.filter(redrives__gte=1).count() == 2, message="the orphans to be taken"
    )
    zombie.signal(signal.SIGCONT)
    wait_until(
        lambda: zombie.output().count("outcome=lease_lost") == 2,
        timeout=30,
        message="the zombie to try, and be refused, for both jobs",
    )
    ids = [job.id for job in jobs]
    wait_until(
        lambda: not Job.objects.filter(id__in=ids, status__in=["pending", "running"]).exists(),
        message="the finish",
    )


def test_sigstop_past_the_lease_then_sigcont_lands_no_zombie_write(recorded, processes):
    stop_past_the_lease_and_resume(processes, start_imports(2, rows=8, delay=0.6))
    assert_invariants(recorded, processes)


def test_a_domain_transaction_held_open_past_the_lease(recorded, processes):
    """The heartbeat must not deadlock against the worker's own row lock, and the lease
    written at commit must be fresh, not computed from the transaction's start."""
    jobs = start_imports(1, rows=3, delay=0)
    worker = processes.worker(
        "--reconcile",
        app_name="durable-slow-tx",
        env={**RESCUE, "DURABLE_JOBS_FAULTS": "domain_before_commit=pause:5"},
    )
    wait_until(lambda: "FAULT domain_before_commit pause" in worker.output(), message="the pause")
    wait_until(
        lambda: Job.objects.get(id=jobs[0].id).status == "completed", message="the job to complete"
    )
    job = Job.objects.get(id=jobs[0].id)
    assert job.redrives == 0, "nobody took the job while its fence held the row"
    with __import__("django").db.connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_expires_at > at FROM durable_jobs_history"
            " WHERE job_id = %s AND op = 'UPDATE' "
            "AND status = 'running' AND lease_owner IS NOT NULL ORDER BY seq",
            [job.id],
        )
        fresh = [row[0] for row in cursor.fetchall()]
    assert fresh and all(fresh), "every lease the slice wrote lay in the future of its own write"
    assert_invariants(recorded, processes)


def test_a_worker_stopped_inside_its_fenced_transaction_is_cut_off_by_the_server(
    recorded, processes
):
    """The stopped worker holds the job row; PostgreSQL ends its idle transaction after
    FENCED_IDLE_TIMEOUT, the job is re-driven, and the zombie's late commit lands nothing.
    (Thread execution: the fault stops the worker itself.)"""
    jobs = start_imports(1, rows=4, delay=0.2)
    zombie = processes.worker(
        app_name="durable-zombie",
        env={
            "DURABLE_JOBS_FAULTS": "domain_before_commit=stop@2",
            "DURABLE_JOBS_FENCED_IDLE_TIMEOUT": "2",
            "DURABLE_JOBS_EXECUTION": "thread",
        },
    )
    wait_until(
        lambda: "FAULT domain_before_commit stop" in zombie.output(),
        message="the stop inside the fence",
    )
    finish_with_rescuer(processes, jobs)
    zombie.signal(signal.SIGCONT)
    wait_until(
        lambda: "outcome=" in zombie.output().split("FAULT domain_before_commit stop")[-1],
        timeout=20,
        message="the zombie to finish its slice after waking",
    )
    assert Job.objects.get(id=jobs[0].id).redrives >= 1
    assert_invariants(recorded, processes)


def test_process_execution__a_handler_process_stopped_inside_its_fence_is_killed_at_the_time_limit(
    recorded, processes
):
    """Process execution: the fault stops only the handler's process, so its worker keeps
    the lease alive; the server ends the idle fenced transaction after FENCED_IDLE_TIMEOUT,
    and the time limit kills the stopped process (SIGKILL reaches a stopped process). The
    slice is charged time_limit, the job retries and completes, and nothing lands twice."""
    jobs = start_imports(1, rows=4, delay=0.2)
    worker = processes.worker(
        app_name="durable-stalled-child",
        env={
            "DURABLE_JOBS_FAULTS": "domain_before_commit=stop@2",
            "DURABLE_JOBS_FENCED_IDLE_TIMEOUT": "2",
            "DURABLE_JOBS_SLICE_BUDGET": "1.5",
        },
    )
    wait_until(
        lambda: "FAULT domain_before_commit stop" in worker.output(),
        message="the stop inside the fence",
    )
    wait_until(
        lambda: Job.objects.get(id=jobs[0].id).status == "completed",
        timeout=60,
        message="the job to complete after the time limit",
    )
    job = Job.objects.get(id=jobs[0].id)
    assert job.redrives == 0 and job.lease_epoch >= 2, "a time_limit retry, not an orphan take"
    assert "time limit" in worker.output()
    assert worker.popen.poll() is None
    assert_invariants(recorded, processes)


@pytest.mark.parametrize("role", ["durable-slot-0", "durable-heartbeat", "durable-listener"])
def test_pg_terminate_backend_of_one_worker_connection(recorded, processes, role):
    jobs = start_imports(2, rows=10, delay=0.1)
    worker = processes.worker("--reconcile", app_name="durable-cut", env=RESCUE)
    name = f"durable-cut/{role}"
    wait_until(lambda: backends_of(name), message=f"the {role} connection")
    wait_until(lambda: Job.objects.filter(processed_count__gte=2).exists(), message="progress")
    assert terminate_backends(name, like=True) == 1
    if role == "durable-listener":
        later = durable.start("demo.flaky", input={"failures": 0})
        jobs.append(later)
    wait_until(
        lambda: (
            not Job.objects.filter(
                id__in=[j.id for j in jobs], status__in=["pending", "running"]
            ).exists()
        ),
        timeout=60,
        message="every job to finish after the cut",
    )
    assert worker.popen.poll() is None, "the worker survived"
    if role != "durable-slot-0":
        wait_until(lambda: backends_of(name), message=f"the {role} connection to come back")
    assert_invariants(recorded, processes)


def test_a_poison_handler_that_kills_its_worker_every_slice_is_parked(recorded, processes):
    poison = durable.start("demo.suicide")
    healthy = start_imports(3, rows=4, delay=0.05)
    env = {**RESCUE, "DURABLE_JOBS_MAX_REDRIVES_WITHOUT_COMMIT": "2"}
    recorded.budgets["max_redrives"] = 2
    deadline = time.monotonic() + 90
    restarts = 0
    while Job.objects.get(id=poison.id).status != "failed":
        assert time.monotonic() < deadline, "the poison job was never parked"
        worker = processes.worker("--reconcile", app_name=f"durable-poisoned-{restarts}", env=env)
        while worker.popen.poll() is None and Job.objects.get(id=poison.id).status != "failed":
            time.sleep(0.1)
        restarts += 1  # a supervisor restarting the killed worker
    parked = Job.objects.get(id=poison.id)
    assert parked.error_code == "poison" and parked.redrives_since_commit == 3
    finish_with_rescuer(processes, healthy)
    assert all(
        job.status == "completed" for job in Job.objects.filter(id__in=[j.id for j in healthy])
    )
    assert_invariants(recorded, processes)


def test_three_reconcilers_over_hundreds_of_orphans_act_once_each(recorded, processes):
    from tests.factories import running

    orphans = [
        running(kind="demo.flaky", input={"failures": 0}, lease_expires_at=-60) for _ in range(300)
    ]
    reconcilers = [
        processes.worker(
            "--reconcile", "--queues", "nothing", app_name=f"durable-rec-{n}", env=RESCUE
        )
        for n in range(3)
    ]
    wait_until(
        lambda: not Job.objects.filter(status="running").exists(), message="every orphan taken"
    )
    assert set(
        Job.objects.filter(id__in=[o.id for o in orphans]).values_list("redrives", flat=True)
    ) == {1}
    for reconciler in reconcilers:
        reconciler.signal(signal.SIGTERM)
    finish_with_rescuer(processes, orphans, timeout=90)
    assert_invariants(recorded, processes)


def test_a_claim_storm_over_few_lock_keys_never_runs_two_jobs_of_one_key(recorded, processes):
    """Starts race on three lock keys while two workers drain them: at no instant are two
    jobs of one key live, per the recorded history (the index makes it so; this proves it)."""
    import threading

    from django.db import connections

    for n in range(2):
        processes.worker("--concurrency", "2", app_name=f"durable-storm-{n}")
    # Workers that are still booting (seconds on a slow machine) claim nothing: a storm
    # over before the first claim would race nothing. Warm them up first.
    warm_up = [durable.start("demo.import", input={"rows": 1, "batch": 1}) for _ in range(4)]
    wait_until(
        lambda: (
            Job.objects.filter(id__in=[j.id for j in warm_up], status="completed").count()
            == len(warm_up)
        ),
        timeout=60,
        message="the warm-up jobs",
    )
    stop = threading.Event()
    refused = []

    def starter():
        try:
            while not stop.is_set():
                for key in ("a", "b", "c"):
                    try:
                        durable.start("demo.import", input={"rows": 2, "batch": 1}, lock_key=key)
                    except durable.LockKeyHeld:
                        refused.append(key)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=starter) for _ in range(3)]
    keyed = Job.objects.filter(lock_key__isnull=False)
    for thread in threads:
        thread.start()
    began = time.monotonic()
    try:
        # At least 6 s, and until keys were both refused and freed again by completions.
        wait_until(
            lambda: time.monotonic() - began >= 6 and keyed.count() >= 6 and refused,
            timeout=60,
            message="the storm to race",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    wait_until(
        lambda: not Job.objects.filter(status__in=["pending", "running"]).exists(),
        message="the drain",
    )
    assert keyed.count() >= 6 and refused, "the storm really raced"
    with __import__("django").db.connection.cursor() as cursor:
        cursor.execute("""
            WITH spans AS (
                SELECT j.lock_key, h.job_id, min(h.at) AS began,
                       min(h.at) FILTER (
                           WHERE h.status IN ('completed', 'failed', 'cancelled')) AS ended
                  FROM durable_jobs_history h JOIN durable_jobs_job j ON j.id = h.job_id
                 GROUP BY j.lock_key, h.job_id)
            SELECT a.lock_key, a.job_id, b.job_id FROM spans a JOIN spans b
              ON a.lock_key = b.lock_key AND a.job_id < b.job_id
             WHERE a.began < b.ended AND b.began < a.ended""")
        overlaps = cursor.fetchall()
    assert overlaps == [], f"two live jobs shared a lock key: {overlaps[:5]}"
    assert_invariants(recorded, processes)


def test_sigkill_before_a_batched_completion_commits(recorded, processes):
    """Quick slices finished but their batched completion never committed: the jobs are
    orphans, re-driven and completed once; nothing was reported completed early."""
    jobs = [durable.start("demo.noop") for _ in range(40)]
    victim = processes.worker(
        app_name="durable-victim", env={"DURABLE_JOBS_FAULTS": "before_batched_completion=kill"}
    )
    victim.wait(timeout=60)
    assert "FAULT before_batched_completion kill" in victim.output()
    assert "outcome=completed (batched" not in victim.output().split("FAULT")[-1]
    finish_with_rescuer(processes, jobs)
    assert Job.objects.filter(status="completed").count() == 40
    assert Job.objects.filter(redrives__gte=1).exists(), "the unflushed batch was re-driven"
    assert_invariants(recorded, processes)


def test_two_worker_backends_terminated_every_quarter_second_lose_and_double_nothing(
    recorded, processes
):
    """Issue #27 item 4, as an operator sees it: a 4-slot worker whose connections are cut
    two at a time, four times a second (slots, handler processes, heartbeat, listener,
    reconciler alike), finishes every job exactly once, stays up, and leaves no job to
    wait out its lease (the worker never says a lease "will expire"), without a warning
    per cut."""
    import random
    import threading

    import psycopg

    from tests.conftest import database_url

    jobs = start_imports(24, rows=4, delay=0.05)  # a mirror: the terminal transaction
    jobs += [durable.start("demo.flaky", input={"failures": 0}) for _ in range(150)]
    worker = processes.worker(
        "--concurrency", "4", "--reconcile", app_name="durable-churn", env=RESCUE
    )
    wait_until(lambda: len(backends_of("durable-churn")) >= 4, message="the worker's connections")
    stop, killed = threading.Event(), []

    def killer() -> None:
        rng = random.Random(27)
        with psycopg.connect(database_url(), autocommit=True) as conn:
            while not stop.is_set():
                pids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                        " OR application_name LIKE %s",
                        ["durable-churn", "durable-churn/%"],
                    )
                ]
                for pid in rng.sample(pids, min(2, len(pids))):
                    if conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]:
                        killed.append(pid)
                stop.wait(0.25)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    ids = [job.id for job in jobs]
    try:
        wait_until(
            lambda: not Job.objects.filter(id__in=ids, status__in=["pending", "running"]).exists(),
            timeout=90,
            message="every job to finish under churn",
        )
    finally:
        stop.set()
        thread.join(10)
    assert len(killed) >= 4, "the churn happened"
    assert worker.popen.poll() is None, "the worker survived"
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}
    output = worker.output()
    assert "will expire" not in output, "a claim or a finished job was left to its lease"
    # A cut connection is routine: reconnected and said at INFO. Before issue #27 each one
    # was a WARNING or two (29 for 54 cuts here); an outage still warns once.
    assert output.count(" WARNING ") <= len(killed) // 3, output
    assert_invariants(recorded, processes)
