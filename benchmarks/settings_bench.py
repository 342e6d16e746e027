"""Settings of the benchmark: the test project's, plus the benchmark's handlers.

The runner (``python -m benchmarks``) exports ``DATABASE_URL`` (its own server and
database) before anything imports this, and tunes the worker subprocesses with:

``BENCH_NOTIFY``         ``0`` disables LISTEN/NOTIFY (``NOTIFY_CHANNEL = None``): the poll path.
``BENCH_POLL_INTERVAL``  the idle worker's poll interval, seconds (default 1, the library default).
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F401,F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.bench_app"]

DURABLE_JOBS = {
    "NOTIFY_CHANNEL": None if os.environ.get("BENCH_NOTIFY", "1") == "0" else "durable_jobs",
    "POLL_INTERVAL": float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
}
