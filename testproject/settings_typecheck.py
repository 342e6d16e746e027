"""Settings for mypy's django-stubs plugin only (``[tool.django-stubs]`` in pyproject.toml).

The plugin calls ``django.setup()`` to read the models; ``testproject.settings`` (and
``settings_test``, which imports it) start an embedded PostgreSQL when imported, so the
type checker gets this module instead: the apps durable_jobs imports from and a
PostgreSQL alias that is never connected to. No server, no environment variables.
"""

from __future__ import annotations

SECRET_KEY = "durable-jobs-type-check-not-secret"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "durable_jobs",
]
# django.setup() never connects; the engine is named so the postgres-only imports resolve.
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
