"""``manage.py durable_reconciler``: re-drive orphans, end cancelled jobs, park poison."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_jobs import conf, logsetup
from durable_jobs.management import preflight
from durable_jobs.management.settings_first import SettingsFirst
from durable_jobs.runtime.reconciler import Reconciler
from durable_jobs.validation import NAME

log = logging.getLogger("durable_jobs.reconciler")


def tenant_id(text: str) -> str:
    if not NAME.match(text):
        raise ValueError("tenant ids are letters, digits, _ . : -")
    return text


class Command(SettingsFirst, BaseCommand):
    help = (
        "Run reconciler passes every DURABLE_JOBS['RECONCILE_INTERVAL'] seconds, "
        "with no leader election "
        "(safe to run many). Every durable_worker already reconciles "
        "unless started with --no-reconcile."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one pass and exit")
        parser.add_argument(
            "--tenant", type=tenant_id, default=None, help="only this tenant's jobs (shard a fleet)"
        )

    def handle(
        self, *args: Any, once: bool, tenant: str | None, verbosity: int, **options: Any
    ) -> None:
        logsetup.configure(verbosity)
        interval = conf.get().RECONCILE_INTERVAL  # validated by SettingsFirst
        reconciler = Reconciler(tenant=tenant)
        if once:
            problem = preflight.unreachable()
            if problem is not None:
                raise CommandError(problem)
            report = reconciler.run_pass()
            self.stdout.write(str(report))
            return
        stop = threading.Event()
        previous = {
            s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)
        }
        # Said once SIGTERM is ours: whoever waits for this line may stop us right away.
        log.info(
            "reconciler starting: %s, a pass every %gs",
            f"tenant {tenant}" if tenant else "all tenants",
            interval,
        )
        try:
            reconciler.run(stop=stop)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        log.info("reconciler stopped")
