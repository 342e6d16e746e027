"""Periodic tasks: a task's schedules, declared as schedules of the ``django.tasks`` kind.

``@task(schedule=...)`` (the backend's task class, ``DurableTask``) and the backend's
``OPTIONS["SCHEDULES"]`` both come here. Each tick starts the job ``enqueue`` would
start for the task, with the task's kwargs from the schedule's ``input``; the schedule is
then checked, written, fired and operated like every other (durable_jobs.schedules,
invariant 24).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from durable_jobs.exceptions import ConfigurationError
from durable_jobs.schedules.declare import Schedule
from durable_jobs.schedules.declare import declare as declare_schedule

#: The kind every task runs as (``durable_jobs.tasks.backend.TASK_KIND``).
TASK_KIND = "django.tasks"


def declare(
    backend: Any,
    path: str,
    schedule: Any,
    *,
    queue: str | None,
    priority: int | None,
    policy: dict[str, Any] | None,
) -> None:
    """Declare the schedules of task ``path`` on ``backend`` (a cron string, a ``Schedule``,
    a dict of its fields -- handy in settings -- or a list); ConfigurationError otherwise.

    Named ``task:<path>`` unless the ``Schedule`` names itself; checked, like every
    schedule, by the system check (durable_jobs.E004). ``policy`` is the task's retry
    policy as ``enqueue`` stores it; None (a task known only by path) takes the backend's.
    """
    items = schedule if isinstance(schedule, (list, tuple)) else [schedule]
    for item in items:
        if isinstance(item, str):
            item = Schedule(item)
        elif isinstance(item, dict):
            item = _from_dict(path, item)
        if not isinstance(item, Schedule):
            raise ConfigurationError(
                f"task {path}: schedule must be a cron expression, a durable_jobs.Schedule or a "
                f"dict with 'cron', got {type(item).__name__}"
            )
        defaults = {
            "max_attempts": backend.max_attempts,
            "retry_backoff_base": None,
            "retry_backoff_max": None,
        }
        payload = {
            "task": path,
            "args": [],
            "kwargs": item.input or {},
            "backend": backend.alias,
            "run_after": None,
            **(policy or defaults),
        }
        declare_schedule(
            TASK_KIND,
            dataclasses.replace(
                item,
                name=item.name or f"task:{path}",
                input=payload,
                queue=item.queue or queue,
                priority=item.priority if priority is None else priority,
            ),
            origin=f"task {path}",
        )


#: The keys of a schedule given as a dict: ``Schedule``'s fields (``input``: the kwargs).
DICT_KEYS = frozenset({"cron", "tz", "input", "queue", "priority", "catch_up", "name"})


def _from_dict(path: str, fields: dict[str, Any]) -> Schedule:
    unknown = sorted(set(fields) - DICT_KEYS)
    if unknown or "cron" not in fields:
        raise ConfigurationError(
            f"task {path}: a schedule dict needs 'cron' and takes {', '.join(sorted(DICT_KEYS))}"
            + (f"; unknown keys {unknown}" if unknown else "")
        )
    return Schedule(fields["cron"], **{k: v for k, v in fields.items() if k != "cron"})
