"""Django's Tasks framework on durable_jobs: ``TASKS = {"default": {"BACKEND": "durable_jobs.tasks.DurableBackend"}}``.

``setup`` decides at start-up whether the project's ``TASKS`` names this backend and only
then imports ``backend``, which needs Django 6's ``django.tasks`` or, on Django 5.2, the
``django-tasks`` backport. The backend's names are therefore resolved lazily here, so that
importing ``durable_jobs.tasks.setup`` never imports a Tasks framework the project lacks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TASK_KIND", "DurableBackend", "DurableTask", "register"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'durable_jobs.tasks' has no attribute {name!r}")
    from durable_jobs.tasks import backend

    return getattr(backend, name)
