"""Long work that never wedges (issue 9): overruns, stuck handlers, starved heartbeats,
cut connections — each against real worker processes, in both execution modes where the
modes differ.

Invariant 14a (no uncounted loop) and invariant 5 (a fence never stalls the heartbeat).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.db.models import Count

import durable_jobs as durable
from testproject.demo.models import Effect
from tests.acceptance.harness import terminate_backends, wait_until
from tests.factories import reload

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

MODES = ["process", "thread"]


def status_of(job) -> str:
    return reload(job).status


@pytest.mark.parametrize("execution", MODES)
def test_an_overrunning_slice_is_charged_each_time_and_the_job_ends_failed(processes, execution):
    """Invariant 14a. Each unit takes 0.8 s before its checkpoint; the budget is 0.2 s, so the
    time limit (0.4 s) ends every slice before it commits anything. This used to loop
    forever as uncounted lost leases; now each overrun is a time_limit failure with
    backoff and the job ends failed, saying what to change."""
    job = durable.start("demo.import", input={"rows": 3, "batch": 1, "delay": 0.8})
    worker = processes.worker(
        "--concurrency",
        "2",
        "--reconcile",
        env={
            "DURABLE_JOBS_EXECUTION": execution,
            "DURABLE_JOBS_SLICE_BUDGET": "0.2",
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "3",
            "DURABLE_JOBS_MAX_REDRIVES_WITHOUT_COMMIT": "1",
            "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3",
        },
    )
    wait_until(lambda: status_of(job) == "failed", timeout=60, message="the overrunning job to end")
    final = reload(job)
    assert (final.error_code, final.consecutive_failures, final.redrives) == (
        "retry_exhausted",
        3,
        0,
    )
    assert "time limit of 0.4s" in final.error_message and "checkpoint" in final.error_message
    assert final.checkpoint is None and not Effect.objects.filter(job_id=job.id).exists(), (
        "nothing landed"
    )
    # One claim per charged slice; in thread execution the supervisor leaves the verdict
    # for the next claim to record (user mirror code never runs on the supervisor).
    assert final.lease_epoch == (3 if execution == "process" else 4)
    time.sleep(1.0)
    assert worker.popen.poll() is None, "the worker is still serving"
    healthy = durable.start("demo.flaky", input={"failures": 0})
    wait_until(lambda: status_of(healthy) == "completed", message="the worker to keep taking work")


def test_thread_execution__a_stuck_slot_is_replaced_and_capacity_kept(processes):
    """Issue 9: a handler that never returns used to keep its thread's slot, and each retry
    took another, until a 2-slot worker ran nothing. Now the stuck thread is abandoned at
    the time limit, counted, and a fresh thread takes the slot over."""
    stuck = durable.start("demo.sleep", input={"seconds": 600, "stubborn": True})
    worker = processes.worker(
        "--concurrency",
        "2",
        env={
            "DURABLE_JOBS_EXECUTION": "thread",
            "DURABLE_JOBS_SLICE_BUDGET": "0.5",
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "3",
            "DURABLE_JOBS_MAX_ABANDONED_THREADS": "4",
        },
    )
    healthy = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # healthy work arriving while the stuck job retries
        healthy.append(durable.start("demo.flaky", input={"failures": 0}))
        time.sleep(0.5)
    wait_until(lambda: status_of(stuck) == "failed", timeout=60, message="the stuck job to end")
    for job in healthy:
        wait_until(
            lambda job=job: status_of(job) == "completed", message="every healthy job to complete"
        )
    final = reload(stuck)
    assert (final.error_code, final.consecutive_failures) == ("retry_exhausted", 3)
    assert worker.output().count("abandoning thread") == 3
    assert worker.popen.poll() is None, "three abandoned threads are within the bound of four"


def test_thread_execution__past_the_abandoned_thread_bound_the_worker_exits_for_a_restart(
    processes,
):
    durable.start("demo.sleep", input={"seconds": 600, "stubborn": True})
    worker = processes.worker(
        "--concurrency",
        "1",
        env={
            "DURABLE_JOBS_EXECUTION": "thread",
            "DURABLE_JOBS_SLICE_BUDGET": "0.3",
            "DURABLE_JOBS_MAX_ABANDONED_THREADS": "1",
        },
    )
    assert worker.wait(timeout=30) == 1, "a supervisor sees a failure and restarts the worker"
    assert "more than 1 handler threads are stuck" in worker.output()


def test_forty_slow_mirrors_never_starve_a_long_computation_s_heartbeat(processes):
    """Invariant 5 / issue 9 item 3. Forty slots sit in mirrors that hold their rows locked
    for 6 s (twice the 3 s lease) while one slice computes for 8 s. Heartbeats used to
    queue behind each locked row in turn, and the computation's lease expired while it
    was healthy: it was taken over and ran twice."""
    mirrors = [durable.start("demo.slow_mirror", input={"mirror_seconds": 6}) for _ in range(40)]
    computation = durable.start("demo.sleep", input={"seconds": 8}, run_after=0.5)
    processes.worker(
        "--concurrency",
        "41",
        "--reconcile",
        env={
            "DURABLE_JOBS_EXECUTION": "thread",
            "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3",
        },
    )
    wait_until(
        lambda: status_of(computation) == "completed",
        timeout=90,
        message="the computation to finish",
    )
    for job in mirrors:
        wait_until(
            lambda job=job: status_of(job) == "completed",
            timeout=60,
            message="the mirrors to finish",
        )
    final = reload(computation)
    assert (final.lease_epoch, final.redrives) == (1, 0), "never taken for an orphan"
    assert all(reload(job).lease_epoch == 1 for job in mirrors), (
        "no mirror's slice was taken over either"
    )


def test_fenced_inside_the_handlers_own_atomic_keeps_its_lease_after_the_outer_commit(processes):
    """Invariant 5. The fence commits with the handler's outer transaction, held open for
    4 s (longer than the 3 s lease plus grace); the heartbeat skips the locked row and the
    lease is extended right after the outer commit, so the reconciler never takes it."""
    job = durable.start("demo.nested_fence", input={"hold": 4, "after": 2})
    processes.worker(
        "--reconcile",
        env={"DURABLE_JOBS_EXECUTION": "thread", "DURABLE_JOBS_RECONCILE_INTERVAL": "0.2"},
    )
    wait_until(lambda: status_of(job) == "completed", timeout=30, message="the job to finish")
    final = reload(job)
    assert (final.lease_epoch, final.redrives) == (1, 0)
    assert final.last_committed_at is not None, "the fenced write was a committed unit"
    assert Effect.objects.filter(job_id=job.id).count() == 1


@pytest.mark.parametrize("execution", MODES)
def test_a_cut_connection_inside_fenced_is_an_interruption_not_a_failure(processes, execution):
    """Issue 9 item 5. Three pg_terminate_backend rounds inside the job's one fenced unit
    used to be charged as the work's own failures (retry_exhausted with a budget of 2).
    They are interruptions: charged to the re-drive budget, and the job completes."""
    job = durable.start("demo.long_fence", input={"seconds": 30, "short_after": 3})
    worker = processes.worker(
        app_name="durable-test-cuts",
        env={
            "DURABLE_JOBS_EXECUTION": execution,
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "2",
            "DURABLE_JOBS_RETRY_BACKOFF_MAX": "0.1",
        },
    )
    for cut in range(3):
        wait_until(
            lambda: terminate_backends("durable-test-cuts%", like=True, query_like="%pg_sleep%"),
            timeout=30,
            message=f"the fenced unit to be running (cut {cut + 1})",
        )
        wait_until(
            lambda cut=cut: reload(job).redrives == cut + 1,
            message="the interruption to be charged",
        )
        during = reload(job)
        assert during.consecutive_failures == 0 and during.error_code is None, (
            "not the work's failure"
        )
    wait_until(lambda: status_of(job) == "completed", timeout=30, message="the job to complete")
    final = reload(job)
    assert (final.redrives, final.consecutive_failures) == (3, 0)
    assert Effect.objects.filter(job_id=job.id).count() == 1, "exactly one unit landed"
    assert "interrupted" in worker.output()


def test_shutdown_past_the_grace_kills_the_handler_and_hands_the_slice_back(processes):
    """Issue 9 item 2, process execution: a handler deaf to shutdown is killed at the grace
    (with its process group) and the slice handed back uncharged; the worker exits 0."""
    job = durable.start("demo.sleep", input={"seconds": 600, "stubborn": True})
    worker = processes.worker(
        env={"DURABLE_JOBS_SHUTDOWN_GRACE": "1.5", "DURABLE_JOBS_SLICE_BUDGET": "300"}
    )
    wait_until(lambda: status_of(job) == "running", message="the slice to start")
    wait_until(worker.children, message="the handler's process")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    after = reload(job)
    assert (after.status, after.interruptions, after.redrives, after.consecutive_failures) == (
        "pending",
        1,
        0,
        0,
    )
    assert "did not yield within the shutdown grace: killed" in worker.output()


def test_a_cancel_the_handler_ignores_is_enforced_after_the_grace(processes):
    """Process execution: cancel reaches the handler; one that ignores it is killed after
    CANCEL_GRACE and the job ends cancelled."""
    job = durable.start("demo.sleep", input={"seconds": 600, "stubborn": True})
    worker = processes.worker(
        env={"DURABLE_JOBS_CANCEL_GRACE": "1", "DURABLE_JOBS_SLICE_BUDGET": "300"}
    )
    wait_until(lambda: status_of(job) == "running", message="the slice to start")
    durable.cancel(job.id)
    wait_until(
        lambda: status_of(job) == "cancelled", timeout=20, message="the cancel to be enforced"
    )
    assert "ignored the cancel request" in worker.output()
    assert worker.popen.poll() is None


def test_a_child_that_dies_is_charged_to_the_redrive_budget_and_parks_as_poison(processes):
    """Process execution: a handler that kills its own process is a crash the worker lived
    to report: charged to the poison budget at once, parked past it."""
    job = durable.start("demo.suicide")
    worker = processes.worker(env={"DURABLE_JOBS_MAX_REDRIVES_WITHOUT_COMMIT": "2"})
    wait_until(
        lambda: status_of(job) == "failed", timeout=30, message="the poison job to be parked"
    )
    final = reload(job)
    assert (final.error_code, final.redrives, final.consecutive_failures) == ("poison", 3, 0)
    assert final.parked_at is not None and "died (signal 9)" in final.error_message
    assert worker.popen.poll() is None, "only the child died each time"
    count = Effect.objects.values("job_id").annotate(n=Count("id"))
    assert not count.exists()


def test_a_worker_killed_outright_takes_its_handler_s_own_processes_with_it(processes):
    """Process execution: SIGKILL of the worker closes its handler process's command pipe;
    the handler process then kills its whole process group, so a subprocess the handler
    started does not run on unsupervised."""
    job = durable.start("demo.spawner")
    worker = processes.worker(env={"DURABLE_JOBS_SLICE_BUDGET": "300"})
    grandchild = wait_until(
        lambda: (reload(job).checkpoint or {}).get("grandchild"), message="the subprocess"
    )
    assert Path(f"/proc/{grandchild}").exists()
    worker.signal(signal.SIGKILL)
    worker.wait()
    wait_until(
        lambda: not _alive(grandchild),
        timeout=10,
        message="the handler's subprocess to die with it",
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_time_limit_kill_mid_statement_does_not_hold_the_slot_behind_the_row_lock(processes):
    """Process execution: a handler killed while its backend runs a long statement inside
    fenced() leaves that backend holding the job row. The server is told to check its
    client, so it ends the statement within a second and the slot records the charge and
    moves on, instead of waiting out the 60 s statement."""
    job = durable.start("demo.long_fence", input={"seconds": 60})
    healthy = durable.start("demo.flaky", input={"failures": 0}, run_after=1)
    processes.worker(
        env={"DURABLE_JOBS_SLICE_BUDGET": "0.5", "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "2"}
    )
    wait_until(lambda: status_of(job) == "failed", timeout=25, message="two time-limit charges")
    assert reload(job).error_code == "retry_exhausted"
    wait_until(
        lambda: status_of(healthy) == "completed", timeout=10, message="the single slot to serve on"
    )
