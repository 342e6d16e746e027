"""The django-tasks-db peer: Django 5.2 + django-tasks (the ``django.tasks`` backport) +
django-tasks-db (its database backend), a no-op task, the worker and the clients.

Runs inside ``benchmarks/.venvs/django-tasks-db`` (created by ``python -m benchmarks``)
against ``PEER_DATABASE_URL``. It only produces load; the runner computes every figure in
SQL from ``django_tasks_database_dbtaskresult``. Note that this backend stamps ``enqueued_at``,
``started_at`` and ``finished_at`` with the *Python* clock of the process that writes them
(same machine here, so differences are still meaningful).

    tasks_db_peer.py migrate
    tasks_db_peer.py fill --n 5000                  # pre-fill (enqueue, 1000 per transaction)
    tasks_db_peer.py start-rate --n 1000            # one enqueue per transaction, 1 client
    tasks_db_peer.py latency --n 200 --gap 0.03     # spaced single enqueues
    tasks_db_peer.py worker [--batch] [--interval 1]    # manage.py db_worker, one slot per process
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict


def configure() -> None:
    params = conninfo_to_dict(os.environ["PEER_DATABASE_URL"])
    settings.configure(
        DEBUG=False,
        SECRET_KEY="peer-benchmark-not-secret",
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django.contrib.contenttypes", "django_tasks", "django_tasks_db"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname"),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
                # The same health checks as the durable_jobs test project. Persistent
                # connections: db_worker calls close_old_connections() around every task,
                # which under Django's default CONN_MAX_AGE=0 reconnects for every task.
                "CONN_HEALTH_CHECKS": True,
                "CONN_MAX_AGE": None,
            }
        },
        TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
            "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
            "root": {"handlers": ["console"], "level": "WARNING"},
        },
    )
    django.setup()


def main(argv: list[str]) -> int:
    configure()
    from django.core.management import call_command
    from django.db import transaction

    command, rest = argv[0], argv[1:]
    opts = dict(zip(rest[::2], rest[1::2], strict=False)) if command not in ("worker",) else {}
    if command == "migrate":
        call_command("migrate", verbosity=0)
    elif command == "fill":
        from tasks_db_tasks import noop

        n = int(opts["--n"])
        done = 0
        while done < n:
            chunk = min(1000, n - done)
            with transaction.atomic():
                for _ in range(chunk):
                    noop.enqueue()
            done += chunk
    elif command == "start-rate":
        from tasks_db_tasks import noop

        n = int(opts["--n"])
        noop.enqueue()
        began = time.perf_counter()
        for _ in range(n):
            noop.enqueue()
        print(json.dumps({"n": n, "seconds": time.perf_counter() - began}))
    elif command == "latency":
        from tasks_db_tasks import noop

        rng = random.Random(int(opts.get("--seed", 6)))
        gap = float(opts["--gap"])
        for _ in range(int(opts["--n"])):
            noop.enqueue()
            time.sleep(rng.uniform(gap / 2, gap * 1.5))
    elif command == "worker":
        worker_args = ["db_worker", "--no-startup-delay", "--no-reload", *rest]
        call_command(*worker_args)
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
