"""What ``DurableBackend.check()`` reports: the app, the database, the queues."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from durable_jobs import conf
from durable_jobs.exceptions import ConfigurationError


def check_tasks_backend(backend: Any) -> list[checks.CheckMessage]:
    """What ``DurableBackend.check()`` reports: the app, the database, the queues."""
    from django.apps import apps

    errors: list[checks.CheckMessage] = []
    label = f"TASKS[{backend.alias!r}]"
    if not apps.is_installed("durable_jobs"):
        errors.append(
            checks.Error(
                f"{label} uses durable_jobs.tasks.DurableBackend but durable_jobs is not in INSTALLED_APPS",
                hint="Add 'durable_jobs' to INSTALLED_APPS and run migrate.",
                id="durable_jobs.E101",
            )
        )
    database = settings.DATABASES.get(backend.database)
    if database is None:
        errors.append(
            checks.Error(
                f"{label}['OPTIONS']['DATABASE'] names {backend.database!r}, which is not in DATABASES",
                id="durable_jobs.E102",
            )
        )
    elif "postgresql" not in database.get("ENGINE", ""):
        errors.append(
            checks.Error(
                f"{label} writes tasks to database {backend.database!r}, which uses {database.get('ENGINE')!r}; "
                "durable_jobs needs PostgreSQL",
                id="durable_jobs.E103",
            )
        )
    bad = sorted(
        queue
        for queue in backend.queues
        if not isinstance(queue, str) or not conf.NAME_PATTERN.match(queue)
    )
    if bad:
        errors.append(
            checks.Error(
                f"{label}['QUEUES'] has names durable_jobs cannot use as queues: {bad}",
                hint="Queue names are 1-100 characters of letters, digits, _ . : -",
                id="durable_jobs.E104",
            )
        )
    try:
        default_queue = conf.get().DEFAULT_QUEUE
    except ConfigurationError:
        return errors  # durable_jobs.E001 says what is wrong with DURABLE_JOBS
    others = sorted(
        queue for queue in backend.queues if queue not in bad and queue != default_queue
    )
    if others:
        errors.append(
            checks.Warning(
                f"{label}['QUEUES'] has {others}: durable_worker takes only DURABLE_JOBS['DEFAULT_QUEUE'] "
                f"({default_queue!r}) unless it is told otherwise, so tasks on those queues wait for a worker "
                "started with --queues",
                hint=f"Run durable_worker --queues {','.join([default_queue, *others])} (or one worker per queue).",
                id="durable_jobs.W101",
            )
        )
    if not backend.queues:
        errors.append(
            checks.Warning(
                f"{label}['QUEUES'] is empty, so any queue_name is accepted, and durable_worker takes only "
                f"{default_queue!r} unless started with --queues",
                id="durable_jobs.W102",
            )
        )
    return errors
