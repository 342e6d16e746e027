"""Commands that run the machinery read ``DURABLE_JOBS`` before anything else."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable_jobs import checks, conf
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.management import preflight


class SettingsFirst(BaseCommand):
    """Base of a command: a garbled ``DURABLE_JOBS`` or a database not migrated stops it
    with one line.

    ``manage.py check`` reports every setting problem as ``durable_jobs.E001``; a worker
    or a reconciler only needs to say, in one line and before the system checks' block,
    why it will not start (with or without ``--skip-checks``).
    """

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            conf.get()
        except ConfigurationError as error:
            raise CommandError(str(error).replace("\n", "; ")) from None
        if checks.HANDLER_ERRORS:
            raise CommandError("; ".join(checks.HANDLER_ERRORS))
        # An unmigrated database is refused in one line. An unreachable one (now, or cut
        # while this asks) is not: a standing worker or reconciler waits an outage out
        # (one warning), as it would one that begins later; a one-shot run (--burst,
        # --once) says so when it gives up.
        problem = preflight.unmigrated()
        if problem is not None:
            raise CommandError(problem)
        return super().execute(*args, **options)
