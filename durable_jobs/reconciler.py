"""One reconciler pass, and the loop that repeats it.

The reconciler is what turns "a worker died" into a non-event. Each step picks its
candidates with ``FOR UPDATE SKIP LOCKED`` (so reconcilers run side by side, each on
a disjoint share, invariant 14) and acts through the store's CAS statements, each job
in a savepoint of its own so one failing mirror never undoes its neighbours.

Steps:

1. **Cancel**: a pending job with a cancel request is ended (``cancel_pending``); a
   running one whose worker is gone (lease released or expired past the grace) is
   ended by the epoch-fenced ``cancel``. A running job with a live lease is left to
   its worker, which sees the request at its next heartbeat.
2. **Orphans**: a running job whose lease expired past the grace under a live claim.
   A verdict already decided (``retry_exhausted``, ``unrecoverable``, ``terminal``) is
   recorded without running the work again; anything else is taken back to pending
   (``take_orphan``: epoch + 1 fences off the old holder) and, once its re-drives
   without a committed unit exceed the budget, parked ``poison``.
3. **Stale pending**: counted and reported, never re-driven. With the database as the
   transport a pending row cannot lose its delivery; work waiting past the pending TTL
   means no worker serves its queue, and spending budgets or parking jobs for that
   would punish the jobs for an operations problem (DESIGN §6).
4. **Retention**: finished jobs older than ``RETENTION`` are deleted in bounded
   batches; parked jobs are kept until an operator acts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from durable_jobs import conf, faults, metrics, registry, store, validation
from durable_jobs.states import VERDICT_CODES, Lease, ParkReason

log = logging.getLogger("durable_jobs.reconciler")

BATCH = 100


@dataclasses.dataclass(slots=True)
class PassReport:
    cancelled: int = 0
    orphans_taken: int = 0
    verdicts_recorded: int = 0
    parked: int = 0
    stale_pending: int = 0
    deleted: int = 0
    mirror_failures: int = 0

    def acted(self) -> bool:
        return any((self.cancelled, self.orphans_taken, self.verdicts_recorded, self.parked, self.deleted))


class Reconciler:
    def __init__(self, *, tenant: str | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
        self.tenant = tenant
        self.using = using

    def run(self, *, stop: threading.Event, once: bool = False) -> None:
        """Repeat passes every RECONCILE_INTERVAL until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.run_pass()
            except DatabaseError as error:
                log.warning("reconciler pass failed: %s", type(error).__name__)
                connections[self.using].close()
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad pass
                log.exception("reconciler pass failed")
            if once:
                return
            stop.wait(conf.get().RECONCILE_INTERVAL)

    def run_pass(self) -> PassReport:
        report = PassReport()
        self.end_cancelled(report)
        self.recover_orphans(report)
        self.count_stale_pending(report)
        self.apply_retention(report)
        if report.acted() or report.stale_pending:
            log.info("reconciler pass: %s", report)
        return report

    # --- step 1 ---
    def end_cancelled(self, report: PassReport) -> None:
        settings = conf.get()
        grace_ms = conf.ms(settings.ORPHAN_GRACE)
        with transaction.atomic(using=self.using):
            # Only jobs no worker is running: pending, a released lease, or a lease expired
            # past the grace (decided in SQL, on the database clock). A live slice ends
            # itself at its next heartbeat, and is not even locked here.
            for job in store.select_cancelling(grace_ms=grace_ms, limit=BATCH, tenant=self.tenant,
                                               using=self.using):
                if job.status == "pending":
                    cas = functools.partial(store.cancel_pending, job.id, using=self.using)
                else:
                    cas = functools.partial(store.cancel, _lease_of(job), using=self.using)
                self._terminal(job, report, cas, "cancelled")

    # --- step 2 ---
    def recover_orphans(self, report: PassReport) -> None:
        settings = conf.get()
        grace_ms = conf.ms(settings.ORPHAN_GRACE)
        with transaction.atomic(using=self.using):
            for job in store.select_orphans(grace_ms=grace_ms, limit=BATCH, tenant=self.tenant, using=self.using):
                if job.cancel_requested_at is not None:
                    continue  # step 1 ends it
                if job.error_code in VERDICT_CODES:
                    cas = functools.partial(store.fail_terminal, _lease_of(job), code=job.error_code,
                                            error_class=job.error_class or "terminal", using=self.using)
                    self._terminal(job, report, cas, "failed")
                    continue
                handler = registry.get(job.kind)
                backoff = handler.retry_delay(job.redrives_since_commit + 1) if handler else settings.RETRY_BACKOFF_BASE
                faults.point("reconciler_between")
                taken = store.take_orphan(job.id, grace_ms=grace_ms, backoff_ms=conf.ms(backoff),
                                          max_redrives=settings.MAX_REDRIVES_WITHOUT_COMMIT, using=self.using)
                if taken is None:
                    continue
                report.orphans_taken += 1
                metrics.emit("orphans_taken", kind=job.kind)
                if taken.status == "failed":
                    report.parked += 1
                    metrics.emit("jobs_parked", kind=job.kind, reason=ParkReason.POISON.value)
                    log.warning("[%s %s] parked as poison: %s", job.kind, job.id, taken.error_message)

    # --- step 3 ---
    def count_stale_pending(self, report: PassReport) -> None:
        ttl_ms = conf.ms(conf.get().PENDING_TTL)
        report.stale_pending = store.count_stale_pending(pending_ttl_ms=ttl_ms, tenant=self.tenant, using=self.using)
        metrics.gauge("stale_pending", report.stale_pending)
        if report.stale_pending:
            log.warning("%d pending jobs have been due for longer than PENDING_TTL; is a worker serving their queue?",
                        report.stale_pending)

    # --- step 4 ---
    def apply_retention(self, report: PassReport) -> None:
        retention = conf.get().RETENTION
        if retention is None:
            return
        for _ in range(10):  # bounded work per pass
            deleted = store.delete_finished(older_than_ms=conf.ms(retention), limit=1000, tenant=self.tenant,
                                            using=self.using)
            report.deleted += deleted
            if deleted < 1000:
                break

    def _terminal(self, job, report: PassReport, cas, outcome: str) -> None:
        """Run a terminal CAS and the kind's mirror together, in a savepoint of their own."""
        handler = registry.get(job.kind)
        try:
            with transaction.atomic(using=self.using):
                row = cas()
                if row is None:
                    return
                if handler is not None and handler.mirror is not None:
                    handler.mirror(row, outcome)
        except Exception as error:  # noqa: BLE001 - the mirror is user code
            if isinstance(error, DatabaseError) and not connections[self.using].is_usable():
                raise  # the connection died: the pass fails and the loop reconnects
            # The mirror failed (the savepoint contained it): count the attempt, and park the
            # job once the budget is spent, so one bad mirror never blocks the step.
            report.mirror_failures += 1
            log.warning("[%s %s] mirror failed during reconcile: %s", job.kind, job.id,
                        validation.printable(f"{type(error).__name__}: {error}", limit=300))
            max_attempts = handler.setting("MAX_MIRROR_ATTEMPTS") if handler else conf.get().MAX_MIRROR_ATTEMPTS
            message = f"mirror failed: {type(error).__name__}"
            if job.status == "running":
                store.bump_mirror_attempts(_lease_of(job), max_attempts=max_attempts, delay_ms=0,
                                           message=message, using=self.using)
            else:
                store.bump_pending_mirror_attempts(job.id, max_attempts=max_attempts, message=message,
                                                   using=self.using)
            return
        if outcome == "cancelled":
            report.cancelled += 1
        else:
            report.verdicts_recorded += 1
        metrics.emit(f"jobs_{outcome}", kind=job.kind)


def _lease_of(job) -> Lease:
    return Lease(job_id=job.id, owner=job.lease_owner or "", epoch=job.lease_epoch, ttl_ms=0)
