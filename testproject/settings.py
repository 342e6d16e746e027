"""Settings of the test project: the demo, the benchmarks and the test suite use it.

Configuration comes from the environment through django-environ. ``DATABASE_URL`` names
the database; when it is unset an embedded PostgreSQL is started under ``.pgdata/dev``
(kept between runs). ``testproject.settings_test`` starts a throwaway one instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import environ

from testproject import database

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="durable-jobs-test-project-not-secret")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "durable_jobs",
    "testproject.demo",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

USE_TZ = True
# The admin's CSS and the console's live-progress script (served by runserver with DEBUG,
# and by the browser tests' live server).
STATIC_URL = "static/"
TIME_ZONE = "UTC"

# Django's Tasks framework runs @task functions as durable jobs (django.tasks on Django 6;
# on Django 5.2 the django-tasks backport, an app of its own, provides the same API).
if (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is not None
):
    INSTALLED_APPS.append("django_tasks")
TASKS = {
    "default": {
        "BACKEND": "durable_jobs.tasks.DurableBackend",
        "QUEUES": ["default"],
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(throwaway: bool) -> dict:
    url = database.database_url(BASE_DIR, throwaway=throwaway)
    config = environ.Env.db_url_config(url)
    # A unix-socket URL (postgresql://user@/name?host=/socket/dir, what the embedded
    # server gives) arrives with the socket in OPTIONS; HOST is where Django expects it.
    options = config.setdefault("OPTIONS", {})
    if not config.get("HOST") and "host" in options:
        config["HOST"] = options.pop("host")
    if not config.get("PORT") and "port" in options:
        config["PORT"] = options.pop("port")
    # psycopg's prepared statements, as a URL's ?prepare_threshold=N (the query string
    # arrives as text; psycopg wants a number). The seam's server-binding path is tested so.
    if "prepare_threshold" in options:
        options["prepare_threshold"] = int(options["prepare_threshold"])
    # Workers hold their connections for hours; health checks make Django replace a
    # connection that PostgreSQL (or an operator's pg_terminate_backend) has cut.
    config.setdefault("CONN_HEALTH_CHECKS", True)
    return config


# settings_test turns this on: a server deleted at exit instead of the kept dev one.
DATABASES = {"default": _database(throwaway=env.bool("TESTPROJECT_THROWAWAY_DB", default=False))}

DURABLE_JOBS = {
    # The demo wants to be watched: short slices and a quick heartbeat.
    "SLICE_BUDGET": env.float("DURABLE_JOBS_SLICE_BUDGET", default=2.0),
    # Wait checks, declared as name:/absolute/path,... (docs/waits.rst).
    "WAIT_PROFILES": env.str("DURABLE_WAIT_PROFILES", default=""),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "durable_jobs": {
            "handlers": ["console"],
            "level": env.str("DURABLE_JOBS_LOG_LEVEL", default="INFO"),
        },
    },
}
