"""Where Django's admin autodiscovery looks: the admin lives in ``durable_jobs.console.admin``."""

from durable_jobs.console import admin as _console_admin  # noqa: F401  (registers JobAdmin)
