"""Unique tasks (invariant 25 through Django's Tasks API): ``@task(unique=...)`` through the
backend's task class, and ``OPTIONS["UNIQUE"]`` as the backend's default. A second enqueue
of the same task with the same arguments returns the first one's result."""

from __future__ import annotations

import dataclasses

import pytest

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job
from durable_jobs.tasks.backend import DurableBackend, DurableTask
from testproject.demo import tasks
from tests.tasks.framework import InvalidTask, TaskResultStatus, task_enqueued

pytestmark = pytest.mark.django_db


def test_a_unique_task_enqueued_twice_with_the_same_arguments_runs_once():
    sent = []

    def receiver(sender, task_result, **kwargs):
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = tasks.refresh_feed.enqueue("news")
        again = tasks.refresh_feed.enqueue(feed="news")
        same = tasks.refresh_feed.enqueue("news")
        other = tasks.refresh_feed.enqueue("sport")
    finally:
        task_enqueued.disconnect(receiver)

    assert same.id == first.id and same.status == TaskResultStatus.READY
    assert again.id != first.id, "args and kwargs are compared as given"
    assert other.id != first.id
    assert sent == [first.id, again.id, other.id], "a deduplicated enqueue enqueued nothing"
    assert Job.objects.count() == 3


def test_a_finished_unique_task_frees_its_arguments():
    first = tasks.refresh_feed.enqueue("news")
    testing.run_jobs()
    later = tasks.refresh_feed.enqueue("news")
    assert later.id != first.id and later.status == TaskResultStatus.READY


def test_tasks_without_unique_are_never_deduplicated():
    assert tasks.add.enqueue(1, 2).id != tasks.add.enqueue(1, 2).id


def test_the_backends_unique_option_is_the_default_and_a_task_can_turn_it_off():
    backend = DurableBackend("default", {"OPTIONS": {"UNIQUE": True}})
    first = backend.enqueue(tasks.add, [1, 2], {})
    assert backend.enqueue(tasks.add, [1, 2], {}).id == first.id

    not_unique = dataclasses.replace(tasks.add, unique=False)
    assert backend.enqueue(not_unique, [1, 2], {}).id != first.id


def test_a_period_keeps_a_finished_task_answering_until_the_next_period():
    backend = DurableBackend("default", {"OPTIONS": {"UNIQUE": {"period": 3600}}})
    first = backend.enqueue(tasks.add, [1, 2], {})
    testing.run_jobs()
    again = backend.enqueue(tasks.add, [1, 2], {})
    assert again.id == first.id
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == 3


def test_bad_unique_values_are_refused_with_one_line():
    with pytest.raises(durable.ConfigurationError, match=r"\['UNIQUE'\]: a task is unique by"):
        DurableBackend("other", {"OPTIONS": {"UNIQUE": ["feed"]}})
    with pytest.raises(durable.ConfigurationError, match=r"\['UNIQUE'\]: takes period and"):
        DurableBackend("other", {"OPTIONS": {"UNIQUE": {"window": 3600}}})
    with pytest.raises(durable.ConfigurationError, match="unique.period: must be whole"):
        DurableBackend("other", {"OPTIONS": {"UNIQUE": {"period": 0}}})
    with pytest.raises(InvalidTask, match="fields are not supported"):
        DurableTask(func=tasks.add.func, unique=durable.Unique(fields=["a"]))
    with pytest.raises(InvalidTask, match="unique: must be True"):
        DurableTask(func=tasks.add.func, unique="yes")
