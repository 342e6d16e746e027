"""Point this process's Django at a benchmark database: the one setup every scenario shares."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def setup_django(url: str, app_name: str) -> None:
    """Configure Django for ``url`` (settings_bench, warnings-only logs) and migrate it.

    ``app_name`` names this process's connections in ``pg_stat_activity``.
    """
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings_bench"
    os.environ.setdefault("DURABLE_JOBS_LOG_LEVEL", "WARNING")
    os.environ["PGAPPNAME"] = app_name
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
