"""``manage.py durable_worker``: run slices until stopped."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_jobs import conf, logsetup
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.management.settings_first import SettingsFirst
from durable_jobs.runtime.worker import Worker
from durable_jobs.tasks import setup as tasks_setup
from durable_jobs.validation import NAME


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


class Command(SettingsFirst, BaseCommand):
    help = (
        "Claim and run durable job slices. "
        "SIGTERM/SIGINT: finish slices (yield), then exit; twice: exit now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="comma-separated queues to take work from (default: DURABLE_JOBS DEFAULT_QUEUE)",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help="slots: each a thread with its own database connection and, in process "
            "execution, its own handler process (default 1)",
        )
        parser.add_argument(
            "--burst",
            "--once",
            action="store_true",
            dest="burst",
            help="exit once no job is due (for scripts and tests); exit 1 after LEASE_TTL "
            "without a successful claim",
        )
        parser.add_argument(
            "--wait-for-retries",
            action="store_true",
            help="with --burst: do not exit while jobs this worker could run wait out a retry "
            "backoff; sleep until they are due and run them",
        )
        parser.add_argument(
            "--no-reconcile",
            action="store_false",
            dest="reconcile",
            help="do not take part in recovery (by default every worker runs the reconciler "
            "loop, one leader at a time across the fleet)",
        )
        parser.add_argument(
            "--reconcile",
            action="store_true",
            dest="reconcile",
            help="the default; kept so existing command lines keep working",
        )
        parser.set_defaults(reconcile=True)
        parser.add_argument(
            "--execution",
            choices=("process", "thread"),
            default=None,
            help="run handlers in a child process per slot, killable at the time limit "
            "(default), or on the slot threads (default: DURABLE_JOBS EXECUTION)",
        )
        parser.add_argument(
            "--metrics-port",
            type=positive_int,
            default=None,
            help="serve Prometheus counters on 127.0.0.1:PORT (needs durable-jobs[prometheus])",
        )

    def handle(
        self,
        *args: Any,
        queues: list[str] | None,
        concurrency: int,
        burst: bool,
        wait_for_retries: bool,
        reconcile: bool,
        execution: str | None,
        metrics_port: int | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        for queue in queues or ():
            undeclared = conf.undeclared_queue(queue, conf.get())
            if undeclared is not None:
                raise CommandError(f"--queues: {undeclared}")
        if wait_for_retries and not burst:
            raise CommandError(
                "--wait-for-retries goes with --burst (a standing worker always waits)"
            )
        logsetup.configure(verbosity)  # a console handler when the project configured no LOGGING
        if metrics_port is not None:
            try:
                from durable_jobs.console import prometheus
            except ImportError:
                raise CommandError(
                    "--metrics-port needs prometheus-client: pip install durable-jobs[prometheus]"
                ) from None
            prometheus.serve(metrics_port)
        # Before the worker writes its schedules: a task's schedule is declared by its module.
        tasks_setup.discover_if_configured()
        try:
            worker = Worker(
                queues=queues,
                concurrency=concurrency,
                burst=burst,
                wait_for_retries=wait_for_retries,
                reconcile=reconcile,
                execution=execution,
            )
        except ConfigurationError as error:  # e.g. WAIT_CHECK_USER this process cannot become
            raise CommandError(str(error).replace("\n", "; ")) from None
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
