"""``manage.py durable_worker``: run slices until stopped."""

from __future__ import annotations

import logging
import sys

from django.core.management.base import BaseCommand, CommandError

from durable_jobs import logsetup
from durable_jobs.validation import NAME
from durable_jobs.worker import Worker


def queue_list(text: str) -> list[str]:
    queues = [part.strip() for part in text.split(",") if part.strip()]
    bad = [q for q in queues if not NAME.match(q)]
    if not queues or bad:
        raise ValueError(f"queue names are letters, digits, _ . : - (got {text!r})")
    return queues


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = "Claim and run durable job slices. SIGTERM/SIGINT: finish slices (yield), then exit; twice: exit now."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--queues", type=queue_list, default=None,
                            help="comma-separated queues to take work from (default: DURABLE_JOBS DEFAULT_QUEUE)")
        parser.add_argument("--concurrency", type=positive_int, default=1,
                            help="slots: threads, one database connection each (default 1)")
        parser.add_argument("--burst", "--once", action="store_true", dest="burst",
                            help="exit once no job is due (for scripts and tests)")
        parser.add_argument("--reconcile", action="store_true",
                            help="also run the reconciler loop inside this worker")
        parser.add_argument("--metrics-port", type=positive_int, default=None,
                            help="serve Prometheus counters on 127.0.0.1:PORT (needs durable-jobs[prometheus])")

    def handle(self, *args, queues, concurrency, burst, reconcile, metrics_port, verbosity, **options) -> None:
        logging.getLogger("durable_jobs").setLevel(LOG_LEVELS.get(verbosity, logging.INFO))
        logsetup.configure(verbosity)  # a console handler when the project configured no LOGGING
        if metrics_port is not None:
            try:
                from durable_jobs import prometheus
            except ImportError:
                raise CommandError("--metrics-port needs prometheus-client: pip install durable-jobs[prometheus]") from None
            prometheus.serve(metrics_port)
        worker = Worker(queues=queues, concurrency=concurrency, burst=burst, reconcile=reconcile)
        worker.install_signal_handlers()
        try:
            code = worker.run()
        except KeyboardInterrupt:
            raise CommandError("interrupted") from None
        finally:
            worker.restore_signal_handlers()
        sys.stdout.flush()
        if code:
            # Threads may still be inside handlers; leave without waiting for them.
            import os

            os._exit(code)
