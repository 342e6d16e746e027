"""Django's Tasks API against real ``durable_worker`` processes: both execution modes, and
a worker SIGKILLed mid-task whose task a second worker finishes after the reconciler
re-drove it (a database backend without leases leaves that task RUNNING forever)."""

from __future__ import annotations

import signal

import pytest

from testproject.demo import tasks
from tests.acceptance.harness import wait_until
from tests.tasks.framework import TaskResultStatus

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = {"DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"}


def finished(*results):
    def check():
        for result in results:
            result.refresh()
        return all(result.is_finished for result in results)

    return check


@pytest.mark.parametrize("execution", ["process", "thread"])
def test_a_worker_runs_tasks__success_failure_and_retry(processes, execution):
    """Every task signal's receiver raises in the worker (and its handler processes): the
    outcomes are the tasks' own all the same."""
    ok = tasks.add.enqueue(19, 23)
    failing = tasks.explode.enqueue("no luck")
    retried = tasks.flaky.enqueue(failures=1)
    worker = processes.worker(
        "--concurrency",
        "2",
        app_name=f"durable-test-tasks-{execution}",
        env={"DURABLE_JOBS_EXECUTION": execution, "DEMO_RAISING_TASK_RECEIVERS": "1"},
    )
    wait_until(finished(ok, failing, retried), timeout=60, message="the tasks to finish")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    output = worker.output()
    for signal_name in ("task_started", "task_finished"):
        assert f"a {signal_name} receiver" in output and "a receiver's bug" in output, output

    assert (ok.status, ok.return_value, ok.attempts, ok.errors) == (
        TaskResultStatus.SUCCESSFUL,
        42,
        1,
        [],
    )
    assert ok.enqueued_at <= ok.started_at == ok.last_attempted_at <= ok.finished_at
    assert len(set(retried.worker_ids)) >= 1 and all(retried.worker_ids)

    assert failing.status == TaskResultStatus.FAILED and failing.attempts == 1
    assert failing.errors[0].exception_class_path == "builtins.ValueError"
    assert "ValueError: no luck" in failing.errors[0].traceback

    assert (retried.status, retried.attempts, retried.return_value) == (
        TaskResultStatus.SUCCESSFUL,
        2,
        {"attempt": 2},
    )
    assert [e.exception_class_path for e in retried.errors] == ["builtins.RuntimeError"]


def test_a_worker_sigkilled_mid_task__another_finishes_it_after_the_reconciler(processes):
    result = tasks.slow_first_attempt.enqueue(seconds=120)
    doomed = processes.worker(app_name="durable-test-tasks-doomed", env=FAST)

    def running():
        result.refresh()
        # Claimed (RUNNING) a moment before the attempt is recorded (attempts == 1).
        return result.status == TaskResultStatus.RUNNING and result.attempts == 1

    wait_until(running, timeout=60, message="the first attempt to run")
    doomed.signal(signal.SIGKILL)
    doomed.wait()
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING, (
        "the dead worker's claim still stands: only its lease ends it"
    )

    survivor = processes.worker("--reconcile", app_name="durable-test-tasks-survivor", env=FAST)
    wait_until(finished(result), timeout=60, message="the survivor to finish the task")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.worker_ids[0] != result.worker_ids[1], "two workers, one attempt each"
    assert result.return_value == {"attempt": 2, "worker": result.worker_ids[1]}
    [lost] = result.errors
    assert lost.exception_class_path == "durable_jobs.exceptions.TaskAttemptInterrupted"
    assert lost.exception_class.__module__ == "durable_jobs.exceptions"


def test_cancelling_a_running_task_through_durable_jobs__ends_it_failed(processes):
    import durable_jobs as durable

    result = tasks.sleep.enqueue(120)
    worker = processes.worker(
        "--reconcile",
        app_name="durable-test-tasks-cancel",
        env={**FAST, "DURABLE_JOBS_CANCEL_GRACE": "0.5"},
    )

    def started():
        result.refresh()
        return result.attempts == 1

    wait_until(started, timeout=60, message="the task to start")
    durable.cancel(result.id, by="ops")
    wait_until(finished(result), timeout=60, message="the cancelled task to end")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "durable_jobs.exceptions.CancelRequested"
    assert "cancelled by ops" in error.traceback
