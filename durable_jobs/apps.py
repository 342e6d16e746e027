from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DurableJobsConfig(AppConfig):
    name = "durable_jobs"
    label = "durable_jobs"
    verbose_name = "Durable jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable_jobs import checks, conf
        from durable_jobs.exceptions import ConfigurationError

        try:
            conf.get()
        except ConfigurationError:
            # Registering a handler reads DURABLE_JOBS, so importing the handler modules
            # now would turn a typo into a traceback from every manage.py command. The
            # system check durable_jobs.E001 reports it instead, and commands that run
            # checks (the worker, the reconciler, migrate, check) stop on it.
            return
        # Handlers live in each app's durable.py, found the way admin.py is. A handler
        # whose policy is nonsense (a time_limit not above its slice_budget, a kind
        # registered twice) is reported like a bad setting: by the system check
        # durable_jobs.E003, and in one line by the worker and the reconciler.
        try:
            autodiscover_modules("durable")
        except ConfigurationError as error:
            checks.HANDLER_ERRORS.append(str(error))
            return
        # Django's Tasks framework: a worker (and its handler processes) must know the
        # "django.tasks" kind before any @task module is imported.
        from durable_jobs.tasks import setup as tasks_setup

        tasks_setup.register_if_configured()
