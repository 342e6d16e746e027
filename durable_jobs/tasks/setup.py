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
