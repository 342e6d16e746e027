"""Commands that run the machinery read ``DURABLE_JOBS`` before anything else."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable_jobs import conf
from durable_jobs.exceptions import ConfigurationError


class SettingsFirst(BaseCommand):
    """Base of a command: a garbled ``DURABLE_JOBS`` stops it with one line.

    ``manage.py check`` reports every problem as ``durable_jobs.E001``; a worker or a
    reconciler only needs to say, in one line and before the system checks' block, why
    it will not start (with or without ``--skip-checks``).
    """

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            conf.get()
        except ConfigurationError as error:
            raise CommandError(str(error).replace("\n", "; ")) from None
        return super().execute(*args, **options)
