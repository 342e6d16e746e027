"""Periodic tasks through Django's Tasks API: ``@task(schedule=...)`` (the backend's
``task_class``, DurableTask) and the backend's ``OPTIONS["SCHEDULES"]``. Each tick enqueues
the task once, as ``enqueue`` would (invariant 24)."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job, Schedule
from durable_jobs.schedules import declare
from durable_jobs.tasks.backend import TASK_KIND, DurableBackend
from testproject.demo import tasks
from tests.tasks.framework import InvalidTask, TaskResultStatus, default_task_backend

try:
    from django.tasks import task
except ImportError:  # Django 5.2 with the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db

ADD = "testproject.demo.tasks.add"


@pytest.fixture
def forget():
    names: list[str] = []
    yield names.append
    for name in names:
        declare.forget(name)


def test_a_task_declared_with_a_schedule_is_enqueued_once_per_tick(forget):
    forget(f"task:{ADD}")
    scheduled = task(schedule=durable.Schedule("@hourly", input={"a": 2, "b": 3}))(tasks.add.func)
    assert scheduled.schedule is not None
    durable.sync_schedules()
    stored = Schedule.objects.get(name=f"task:{ADD}")
    assert stored.kind == TASK_KIND and stored.input["task"] == ADD
    testing.fast_forward_schedule(stored.name)
    assert testing.fire_schedules() == 1
    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    job = Job.objects.get(meta__schedule=stored.name)
    result = default_task_backend.get_result(str(job.id))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.kwargs == {"a": 2, "b": 3}


def test_a_schedule_given_as_a_cron_string_takes_the_tasks_queue_and_retry_policy(forget):
    forget(f"task:{ADD}")
    task(schedule="0 6 * * *", priority=7, max_attempts=4)(tasks.add.func)
    durable.sync_schedules()
    stored = Schedule.objects.get(name=f"task:{ADD}")
    assert stored.expression == "0 6 * * *" and stored.priority == 7
    assert stored.input["max_attempts"] == 4


def test_the_backends_options_declare_schedules_for_tasks_by_path(forget):
    forget(f"task:{ADD}")
    forget("adds.nightly")
    DurableBackend(
        "default",
        {
            "OPTIONS": {
                "SCHEDULES": {
                    ADD: [
                        "@daily",
                        durable.Schedule("0 3 * * *", name="adds.nightly", input={"a": 1, "b": 1}),
                    ]
                }
            }
        },
    )
    durable.sync_schedules()
    assert set(Schedule.objects.filter(kind=TASK_KIND).values_list("name", flat=True)) == {
        f"task:{ADD}",
        "adds.nightly",
    }
    testing.fast_forward_schedule("adds.nightly")
    testing.fire_schedules()
    testing.run_jobs()
    job = Job.objects.get(meta__schedule="adds.nightly")
    assert default_task_backend.get_result(str(job.id)).return_value == 2


def test_a_bad_task_schedule_is_refused_when_the_task_is_defined():
    with pytest.raises(InvalidTask, match="schedule must be a cron expression"):
        task(schedule=5)(tasks.add.func)
    with pytest.raises(durable.ConfigurationError, match="SCHEDULES"):
        DurableBackend("other", {"OPTIONS": {"SCHEDULES": ["@daily"]}})
    with pytest.raises(durable.ConfigurationError, match=r"unknown keys \['kwargs'\]"):
        DurableBackend("other", {"OPTIONS": {"SCHEDULES": {ADD: {"cron": "@daily", "kwargs": {}}}}})


def test_a_bad_cron_on_a_task_fails_the_system_check_naming_it(forget):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    forget(f"task:{ADD}")
    task(schedule="0 0 31 2 * *")(tasks.add.func)
    with pytest.raises(SystemCheckError, match=rf"schedule 'task:{ADD}' \(task {ADD}\)"):
        call_command("check")
