"""Django's Tasks API over durable_jobs, in-process: ``@task``, ``.enqueue()``,
``.get_result()`` and ``result.refresh()`` only, with ``durable_jobs.testing.run_jobs`` as
the worker (the same executor ``durable_worker`` runs; tests/tasks/test_worker.py runs the
real worker processes)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.exceptions import CancelRequested
from durable_jobs.tasks.backend import DurableBackend
from testproject.demo import tasks
from testproject.demo.models import Report
from tests.tasks.framework import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_enqueued,
    task_finished,
    task_started,
)

pytestmark = pytest.mark.django_db


def test_enqueue__is_a_ready_result_that_succeeds_once_a_worker_ran_it():
    result = tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.attempts, result.errors) == ([2], {"b": 3}, 0, [])
    assert (
        result.enqueued_at is not None and result.started_at is None and result.finished_at is None
    )
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.errors == []
    # (The order of the instants is asserted with a real worker in test_worker.py: inside
    # this test's one transaction, now() stands still.)
    assert result.started_at == result.last_attempted_at and result.finished_at is not None

    again = tasks.add.get_result(result.id)
    assert (again.status, again.return_value, again.worker_ids) == (
        result.status,
        5,
        result.worker_ids,
    )


def test_a_raising_task__fails_with_its_exception_class_and_traceback():
    result = tasks.explode.enqueue("boom")
    assert [r.outcome for r in testing.run_jobs()] == ["failed"], (
        "one attempt by default, as Django's own backends"
    )
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "in explode" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_a_task_with_max_attempts__retries_then_succeeds_with_one_error_per_failed_attempt():
    result = tasks.flaky.enqueue(failures=1)
    outcomes = [r.outcome for r in testing.run_jobs(fast_forward=True)]
    assert outcomes == ["retrying", "completed"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.return_value == {"attempt": 2}, "TaskContext.attempt counts this attempt"
    [error] = result.errors
    assert (
        error.exception_class_path == "builtins.RuntimeError"
        and "attempt 1 fails" in error.traceback
    )
    assert result.last_attempted_at > result.started_at


def test_a_task_out_of_attempts__fails_after_exactly_max_attempts():
    result = tasks.flaky.enqueue(failures=5)
    testing.run_jobs(fast_forward=True)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3 and len(result.errors) == 3
    assert [e.traceback.strip().splitlines()[-1] for e in result.errors] == [
        f"RuntimeError: attempt {n} fails" for n in (1, 2, 3)
    ]


def test_enqueue__rolls_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        Report.objects.create(name="domain row")
        result = tasks.write_report.enqueue("rolled back")
        raise RuntimeError("the caller's transaction fails")
    assert not Report.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)
    assert testing.run_jobs() == [], "nothing left to run"


def test_higher_priority_runs_first():
    tasks.write_report.using(priority=-10).enqueue("low")
    tasks.write_report.enqueue("normal")
    tasks.write_report.using(priority=50).enqueue("high")
    testing.run_jobs()
    assert list(Report.objects.order_by("pk").values_list("name", flat=True)) == [
        "high",
        "normal",
        "low",
    ]


def test_run_after__keeps_the_task_ready_until_its_time():
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later
    assert testing.run_jobs() == [], "not due yet"
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert tasks.add.get_result(result.id).task.run_after == later
    testing.run_jobs(fast_forward=True)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)


def test_cancel_through_durable_jobs__shows_as_failed_naming_the_durable_jobs_exception():
    from durable_jobs.runtime.reconciler import Reconciler

    result = tasks.add.enqueue(1, 2)
    durable.cancel(result.id, by="ops")
    Reconciler().run_pass()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class_path == "durable_jobs.exceptions.CancelRequested"
    assert error.exception_class is CancelRequested
    assert "cancelled by ops" in error.traceback


def test_a_raising_signal_receiver__changes_nothing():
    seen = []

    def raising(sender, task_result, **kwargs):
        seen.append((sender, task_result.status))
        raise RuntimeError("a receiver's bug")

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(raising, dispatch_uid="test-raising")
    try:
        result = tasks.add.enqueue(20, 22)
        assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(dispatch_uid="test-raising")
    assert seen == [
        (DurableBackend, TaskResultStatus.READY),
        (DurableBackend, TaskResultStatus.RUNNING),
        (DurableBackend, TaskResultStatus.SUCCESSFUL),
    ]
    result.refresh()
    assert (result.status, result.return_value, result.attempts, result.errors) == (
        TaskResultStatus.SUCCESSFUL,
        42,
        1,
        [],
    )


def test_task_finished__is_not_sent_for_an_attempt_that_will_be_retried():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.status, task_result.attempts))

    task_finished.connect(receiver, dispatch_uid="test-finished")
    try:
        tasks.flaky.enqueue(failures=1)
        testing.run_jobs(fast_forward=True)
    finally:
        task_finished.disconnect(dispatch_uid="test-finished")
    assert finished == [(TaskResultStatus.SUCCESSFUL, 2)]


def test_unknown_or_malformed_ids__raise_task_result_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("00000000-0000-0000-0000-000000000000")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not a uuid")
    other = durable.start("demo.sleep", input={"seconds": 0})
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(other.id))


def test_a_task_whose_module_no_longer_imports__fails_clearly_and_the_worker_carries_on(
    tmp_path, monkeypatch
):
    (tmp_path / "vanishing_tasks.py").write_text(
        textwrap.dedent("""
        try:
            from django.tasks import task
        except ImportError:
            from django_tasks import task

        @task
        def gone():
            return "never"
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("vanishing_tasks")
    result = module.gone.enqueue()
    after = tasks.add.enqueue(1, 2)
    (tmp_path / "vanishing_tasks.py").unlink()
    del sys.modules["vanishing_tasks"]
    importlib.invalidate_caches()

    assert [r.outcome for r in testing.run_jobs()] == ["failed", "completed"], (
        "the next task still ran"
    )
    job = durable.get(result.id)
    assert (job.status, job.error_class, job.error_code) == ("failed", "terminal", "terminal")
    assert "task 'vanishing_tasks.gone' cannot be loaded" in job.error_message
    with pytest.raises(TaskResultDoesNotExist, match="vanishing_tasks.gone"):
        default_task_backend.get_result(result.id)
    assert tasks.add.get_result(after.id).return_value == 3


def test_a_return_value_that_is_not_json__fails_the_task_without_retrying():
    result = tasks.not_json.enqueue()
    assert [r.outcome for r in testing.run_jobs()] == ["failed"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "durable_jobs.exceptions.InvalidJobData"
    assert "return value" in result.errors[-1].traceback


def test_an_async_task__runs_through_the_worker():
    result = tasks.async_add.enqueue(4, 5)
    testing.run_jobs()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 9)


def test_arguments_that_are_not_json__are_refused_at_enqueue_and_nothing_is_stored():
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert testing.run_jobs() == []


def test_bad_task_policy__is_refused_when_the_task_is_defined():
    from durable_jobs.tasks.backend import DurableTask

    with pytest.raises(InvalidTask, match="max_attempts"):
        DurableTask(func=tasks.add.func, max_attempts=0)
    with pytest.raises(InvalidTask, match="retry_backoff_max"):
        tasks.flaky.using(priority=1).__class__(
            func=tasks.flaky.func, takes_context=True, retry_backoff_base=10, retry_backoff_max=1
        ).enqueue(1)


def test_backend_construction__touches_no_database_and_refuses_unknown_options():
    with CaptureQueriesContext(connection) as queries:
        DurableBackend("other", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    assert len(queries) == 0
    with pytest.raises(durable.ConfigurationError, match="MAX_ATTEMPS"):
        DurableBackend("other", {"OPTIONS": {"MAX_ATTEMPS": 2}})
    with pytest.raises(durable.ConfigurationError, match="MAX_ATTEMPTS"):
        DurableBackend("other", {"OPTIONS": {"MAX_ATTEMPTS": 0}})


def test_backend_check__reports_queues_the_default_worker_does_not_take(monkeypatch):
    from django.conf import settings

    backend = DurableBackend("other", {"QUEUES": ["default", "emails", "bad queue"]})
    messages = {message.id: message.msg for message in backend.check()}
    assert "durable_jobs.E104" in messages and "bad queue" in messages["durable_jobs.E104"]
    assert "durable_jobs.W101" in messages and "'emails'" in messages["durable_jobs.W101"]
    assert default_task_backend.check() == []
    monkeypatch.setitem(
        settings.DATABASES, "sqlite", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    )
    sqlite = DurableBackend("other", {"OPTIONS": {"DATABASE": "sqlite"}})
    assert [m.id for m in sqlite.check()] == ["durable_jobs.E103"]


def test_aenqueue_and_aget_result__work_from_async_code():
    from asgiref.sync import async_to_sync

    async def enqueue_and_read():
        result = await tasks.add.aenqueue(3, 4)
        return result, await tasks.add.aget_result(result.id)

    result, again = async_to_sync(enqueue_and_read)()
    assert again.id == result.id and again.status == TaskResultStatus.READY
    testing.run_jobs()
    async_to_sync(result.arefresh)()
    assert result.return_value == 7


@pytest.mark.parametrize("path", ["this.nothing", "probe_never_imported_by_a_job.anything"])
def test_a_job_naming_a_path_that_is_no_task__fails_terminally_without_importing_it(
    path, tmp_path, monkeypatch
):
    # A module whose import would be noticed: it writes a file. The job's input is data
    # anyone who can start a job controls; naming a module must not make a worker run it.
    marker = tmp_path / "imported"
    (tmp_path / "probe_never_imported_by_a_job.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nanything = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = path.partition(".")[0]
    assert module not in sys.modules
    job = durable.start(
        "django.tasks", input={"task": path, "args": [], "kwargs": {}, "backend": "default"}
    )

    assert [r.outcome for r in testing.run_jobs()] == ["failed"]

    job = durable.get(job.id)
    assert (job.status, job.error_class, job.error_code) == ("failed", "terminal", "terminal")
    assert f"task {path!r} cannot be loaded: it is not a task of this backend" in (
        job.error_message
    )
    assert module not in sys.modules, f"{module} was imported"
    assert not marker.exists()


def test_a_task_enqueued_onto_a_paused_queue__is_stored_ready_and_runs_after_the_resume():
    """Invariant 27 through Django's API: the backend says the queue is paused; the task
    is stored (READY), not run, and runs once the queue is resumed."""
    backend = default_task_backend
    durable.pause_queue("default", reason="incident 42", by="alice")
    assert backend.paused_queues() == ["default"]
    pause = backend.queue_pause("default")
    assert pause is not None and (pause.paused_by, pause.reason) == ("alice", "incident 42")
    assert backend.queue_pause("other") is None

    result = tasks.add.enqueue(1, 2)
    assert result.status == TaskResultStatus.READY
    assert testing.run_jobs() == [], "paused: no worker claims it"
    result.refresh()
    assert result.status == TaskResultStatus.READY

    durable.resume_queue("default")
    assert backend.queue_pause("default") is None
    testing.run_jobs()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
