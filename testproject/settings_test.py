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

from testproject.settings import *  # noqa: E402,F401,F403

DURABLE_JOBS = {
    # Short leases so crash and stall scenarios play out in seconds.
    "LEASE_TTL": 3.0,
    "HEARTBEAT_INTERVAL": 0.5,
    "ORPHAN_GRACE": 0.5,
    "POLL_INTERVAL": 0.5,
    "RETRY_BACKOFF_BASE": 0.05,
    "RETRY_BACKOFF_MAX": 0.2,
    "SLICE_BUDGET": 30.0,
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
