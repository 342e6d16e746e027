"""Register the Tasks backend's job kind at start-up, only when ``TASKS`` names it.

Kept apart from ``durable_jobs.tasks.backend`` so that a project without Django's Tasks framework
(Django 5.2 without the backport) never imports it.
"""

from __future__ import annotations

from django.conf import settings

BACKEND_PATH = "durable_jobs.tasks.DurableBackend"


def configured() -> bool:
    """True when one of the project's ``TASKS`` backends is ``DurableBackend``."""
    tasks = getattr(settings, "TASKS", None)
    return isinstance(tasks, dict) and any(
        isinstance(params, dict) and params.get("BACKEND") == BACKEND_PATH
        for params in tasks.values()
    )


def register_if_configured() -> None:
    if configured():
        from durable_jobs.tasks import backend as tasks

        tasks.register()


def discover_if_configured() -> None:
    """Import the apps' ``tasks`` modules now, when ``TASKS`` names ``DurableBackend``.

    A task's schedule (``@task(schedule=...)``) is declared when its module is imported:
    the worker writes the schedules code declares when it starts, and the system check
    checks them, so both import the tasks modules first (otherwise a worker would mark a
    task's schedule removed because it had not imported the task yet).
    """
    if configured():
        from durable_jobs.tasks import backend as tasks

        tasks.discover_tasks()
