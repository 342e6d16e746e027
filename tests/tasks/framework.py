"""Django's Tasks API from whichever line is installed: ``django.tasks`` on Django 6, the
``django_tasks`` backport on Django 5.2. Tests use nothing else to enqueue and read tasks."""

from __future__ import annotations

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

__all__ = [
    "InvalidTask",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
