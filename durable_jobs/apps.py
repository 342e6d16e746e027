from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DurableJobsConfig(AppConfig):
    name = "durable_jobs"
    label = "durable_jobs"
    verbose_name = "Durable jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable_jobs import checks  # noqa: F401  (registers the system checks)

        # Handlers live in each app's durable.py, found the way admin.py is.
        autodiscover_modules("durable")
