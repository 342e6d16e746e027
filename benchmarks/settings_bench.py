"""Settings of the benchmark: the test project's, plus the benchmark's handlers.

The runner (``python -m benchmarks``) exports ``DATABASE_URL`` (its own server and
database) before anything imports this, and tunes the worker subprocesses with:

``BENCH_NOTIFY``         ``0`` disables LISTEN/NOTIFY (``NOTIFY_CHANNEL = None``): the poll path.
``BENCH_POLL_INTERVAL``  the idle worker's poll interval, seconds (default 1, the library default).
``BENCH_CONN_MAX_AGE``   ``none`` (persistent) or seconds: overrides Django's ``CONN_MAX_AGE``,
                         which the test project leaves at Django's default, 0.
``BENCH_PREPARE_THRESHOLD``  sets ``OPTIONS["prepare_threshold"]`` (the opt-in that makes the
                         server-binding cursor and psycopg's prepared statements apply).
``BENCH_TRANSPORT``      ``rabbitmq`` or ``redis`` moves every queue to that broker (with
                         ``BENCH_BROKER_PREFIX``): ``benchmarks/transport_bench.py``.
``BENCH_OFF``            switches one mechanism off for the trial: ``prefetch``
                         (``MAX_PREFETCH = 1``), ``zygote`` (``START_METHOD = "spawn"``), or one
                         that ``bench_app/apps.py`` patches (``cloader``, ``srvbind``,
                         ``sendahead``).
"""

from __future__ import annotations

import copy
import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES as _DATABASES
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.bench_app"]

DATABASES = copy.deepcopy(_DATABASES)
_max_age = os.environ.get("BENCH_CONN_MAX_AGE", "").strip().lower()
if _max_age:
    DATABASES["default"]["CONN_MAX_AGE"] = None if _max_age == "none" else int(_max_age)
if os.environ.get("BENCH_PREPARE_THRESHOLD", "").strip():
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = int(
        os.environ["BENCH_PREPARE_THRESHOLD"]
    )

DURABLE_JOBS = {
    "NOTIFY_CHANNEL": None if os.environ.get("BENCH_NOTIFY", "1") == "0" else "durable_jobs",
    "POLL_INTERVAL": float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
}
# ``BENCH_TRANSPORT``: every queue on that transport (benchmarks/transport_bench.py), with
# ``BENCH_BROKER_PREFIX`` naming this run's queues on the broker.
_transport = os.environ.get("BENCH_TRANSPORT", "database")
if _transport != "database":
    DURABLE_JOBS |= {
        "TRANSPORT": _transport,
        "QUEUES": ["default"],
        "BROKER_URLS": {
            "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
            "redis": "redis://127.0.0.1:6379/0",
        },
        "BROKER_PREFIX": os.environ.get("BENCH_BROKER_PREFIX", "bench"),
    }
_off = os.environ.get("BENCH_OFF", "").strip()
if _off == "prefetch":
    DURABLE_JOBS["MAX_PREFETCH"] = 1  # one claim per job: no batching
elif _off == "zygote":
    DURABLE_JOBS["START_METHOD"] = "spawn"  # a plain subprocess per handler process

# ``BENCH_LISTEN_DATABASE_URL``: the listener's own direct connection (LISTEN_DATABASE),
# for workers whose DATABASE_URL goes through a pooler (benchmarks/scale_bench.py).
if os.environ.get("BENCH_LISTEN_DATABASE_URL"):
    import environ

    DATABASES["listen"] = {
        **DATABASES["default"],
        **environ.Env.db_url_config(os.environ["BENCH_LISTEN_DATABASE_URL"]),
    }
    DURABLE_JOBS["LISTEN_DATABASE"] = "listen"
