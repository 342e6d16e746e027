"""System checks: refuse a configuration that cannot work before a worker starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

from durable_jobs import conf
from durable_jobs.exceptions import ConfigurationError


@checks.register("durable_jobs")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    raw = getattr(settings, "DURABLE_JOBS", None)
    # Each unknown key on its own line, each with its "did you mean".
    unknown = conf.unknown_keys(raw) if isinstance(raw, dict) else []
    errors.extend(checks.Error(message, id="durable_jobs.E001") for message in unknown)
    if not unknown:
        try:
            conf.load(raw)
        except ConfigurationError as error:
            errors.append(checks.Error(str(error), id="durable_jobs.E001"))
    engine = settings.DATABASES.get("default", {}).get("ENGINE", "")
    if "postgresql" not in engine:
        errors.append(
            checks.Error(
                f"durable_jobs needs PostgreSQL; the default database uses {engine!r}",
                hint="Set DATABASES['default']['ENGINE'] to 'django.db.backends.postgresql'.",
                id="durable_jobs.E002",
            )
        )
    return errors


#: Handler registrations that failed at start-up (apps.ready): a nonsense policy.
HANDLER_ERRORS: list[str] = []


@checks.register("durable_jobs")
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [checks.Error(message, id="durable_jobs.E003") for message in HANDLER_ERRORS]


@checks.register("durable_jobs")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A schedule whose kind has no handler, or whose expression, zone, input or queue is
    wrong, or whose name is used twice: one error each, naming the schedule."""
    from durable_jobs import registry
    from durable_jobs.schedules import declare
    from durable_jobs.tasks import setup as tasks_setup

    try:
        conf.get()
    except ConfigurationError:
        return []  # E001 says why; schedules in settings cannot be read before that is fixed
    tasks_setup.discover_if_configured()  # a task's schedule is declared by its module
    _, problems = declare.checked(registry.kinds())
    return [checks.Error(message, id="durable_jobs.E004") for message in problems]
