"""Settings for the test suite: a throwaway embedded PostgreSQL unless ``DATABASE_URL`` is set.

pytest-django reads settings before any fixture runs, so the throwaway server is started
here, once per pytest process, and deleted when the process exits. Subprocess workers
started by the tests inherit the exported ``DATABASE_URL`` (pointed at the test database
by the fixtures) and never start a server of their own.
"""

from __future__ import annotations

import os

os.environ.setdefault("DURABLE_JOBS_LOG_LEVEL", "WARNING")
os.environ["TESTPROJECT_THROWAWAY_DB"] = "1"

from testproject.settings import *

DURABLE_JOBS = {
    # Short leases so crash and stall scenarios play out in seconds.
    "LEASE_TTL": 3.0,
    "HEARTBEAT_INTERVAL": 0.5,
    "ORPHAN_GRACE": 0.5,
    "POLL_INTERVAL": 0.5,
    "RETRY_BACKOFF_BASE": 0.05,
    "RETRY_BACKOFF_MAX": 0.2,
    "SLICE_BUDGET": 30.0,
    "SHUTDOWN_GRACE": 10.0,
    # Wait checks, declared as name:/absolute/path,... (docs/waits.rst).
    "WAIT_PROFILES": env.str("DURABLE_WAIT_PROFILES", default=""),
}
# A test starting a worker subprocess tunes it with DURABLE_JOBS_<NAME>=value.
for _name, _default in list(DURABLE_JOBS.items()) + [
    ("MAX_CONSECUTIVE_FAILURES", None),
    ("MAX_MIRROR_ATTEMPTS", None),
    ("MAX_REDRIVES_WITHOUT_COMMIT", None),
    ("RECONCILE_INTERVAL", None),
    ("FENCED_IDLE_TIMEOUT", None),
    ("MAX_PREFETCH", None),
    ("TIME_LIMIT", None),
    ("CANCEL_GRACE", None),
    ("MAX_ABANDONED_THREADS", None),
    ("EXECUTION", None),
    ("WAIT_CHECK_INTERVAL", None),
    ("WAIT_CHECK_INTERVAL_FLOOR", None),
    ("WAIT_CHECK_TIMEOUT", None),
    ("WAIT_DENIED_RECHECK", None),
]:
    _raw = os.environ.get(f"DURABLE_JOBS_{_name}")
    if _raw is not None:
        DURABLE_JOBS[_name] = (
            _raw if _name == "EXECUTION" else int(_raw) if _name.startswith("MAX_") else float(_raw)
        )
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Behind a pooler (tests/acceptance/test_pgbouncer.py): the listener's direct connection,
# and NOTIFY_CHANNEL="" for polling only.
if os.environ.get("TESTPROJECT_LISTEN_DATABASE_URL"):
    from testproject.settings import env as _env

    DATABASES = {
        **DATABASES,
        "listen": {
            **DATABASES["default"],
            **_env.db_url_config(os.environ["TESTPROJECT_LISTEN_DATABASE_URL"]),
        },
    }
    _listen_options = DATABASES["listen"].setdefault("OPTIONS", {})
    if not DATABASES["listen"].get("HOST") and "host" in _listen_options:
        DATABASES["listen"]["HOST"] = _listen_options.pop("host")
    DURABLE_JOBS["LISTEN_DATABASE"] = "listen"
# Schedules for worker subprocesses (tests/acceptance/test_schedules.py), as JSON.
if os.environ.get("DURABLE_JOBS_SCHEDULES"):
    import json as _json

    DURABLE_JOBS["SCHEDULES"] = _json.loads(os.environ["DURABLE_JOBS_SCHEDULES"])
# Periodic tasks for worker subprocesses: the Tasks backend's OPTIONS["SCHEDULES"], as JSON.
if os.environ.get("DURABLE_TASKS_SCHEDULES"):
    import json as _json

    TASKS = {
        **TASKS,
        "default": {
            **TASKS["default"],
            "OPTIONS": {"SCHEDULES": _json.loads(os.environ["DURABLE_TASKS_SCHEDULES"])},
        },
    }
if os.environ.get("DURABLE_JOBS_NOTIFY_CHANNEL") is not None:
    DURABLE_JOBS["NOTIFY_CHANNEL"] = os.environ["DURABLE_JOBS_NOTIFY_CHANNEL"] or None
