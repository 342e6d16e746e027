"""Tasks of Django's Tasks framework, run by durable_worker (TASKS in settings.py).

Imported from whichever line is installed: ``django.tasks`` on Django 6, the
``django_tasks`` backport on Django 5.2.
"""

from __future__ import annotations

import os
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task

from testproject.demo.models import Report


@task
def add(a, b):
    return a + b


@task
def write_report(name):
    """A domain write: the order of the rows is the order the tasks ran in."""
    return Report.objects.create(name=name, status="task").pk


@task
def explode(message):
    raise ValueError(message)


@task(takes_context=True, max_attempts=3, retry_backoff_base=0.05, retry_backoff_max=0.1)
def flaky(context, failures):
    """Raise on the first ``failures`` attempts, then answer which attempt succeeded."""
    if context.attempt <= failures:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt}


@task(takes_context=True, max_attempts=1)
def slow_first_attempt(context, seconds):
    """The first attempt sleeps (long enough to kill its worker); a later one returns."""
    if context.attempt == 1:
        time.sleep(seconds)
    return {"attempt": context.attempt, "worker": context.task_result.worker_ids[-1]}


@task
def sleep(seconds):
    time.sleep(seconds)
    return seconds


@task
def not_json():
    return object()


@task
async def async_add(a, b):
    return a + b


def connect_raising_receivers() -> None:
    """Connect a receiver that raises to each of Django's task signals (a receiver's bug)."""
    try:
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:  # Django 5.2
        from django_tasks.signals import task_enqueued, task_finished, task_started

    def raising(sender, task_result, **kwargs):
        raise RuntimeError(f"a receiver's bug (task {task_result.id}, {task_result.status})")

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(raising, weak=False, dispatch_uid="demo.raising_receiver")


# A periodic task for tests/acceptance/test_schedules.py, only when asked for: a schedule
# declared on every import would be written by every test's worker.
_PERIODIC = os.environ.get("DURABLE_DEMO_TASK_SCHEDULE")


def _periodic(func):
    return task(schedule=_PERIODIC)(func) if _PERIODIC else task(func)


@_periodic
def periodic():
    return "ran on its tick"


@task(unique=True)
def refresh_feed(feed):
    """Unique by its arguments: an enqueue while one is queued or running returns it."""
    return feed
