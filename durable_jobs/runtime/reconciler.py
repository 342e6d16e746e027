"""One reconciler pass, the loop that repeats it, and the leader loop every worker runs.

The reconciler is what turns "a worker died" into a non-event. Each step picks a batch
of candidates with ``FOR UPDATE SKIP LOCKED`` (so reconcilers run side by side, each
skipping what another holds, invariant 14), then acts on them one at a time: each
candidate is re-taken by the same predicate, alone, in a short transaction of its own
that holds its CAS and the kind's mirror. User mirror code therefore only ever runs with
its own job row locked; a failed mirror is counted in its own autocommit statement after
its transaction rolled back (invariant 11); and a pass that dies (SIGKILL, a cut
connection) loses at most the one transaction it was in, never a count already made.

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
3. **Tell parked subjects**: a job parked (``poison``, ``mirror_failed``) never had its
   domain row told; its kind's mirror is called with ``failed`` (the row it gets has
   ``parked_at`` set and ``error_code`` the reason), at most MAX_MIRROR_ATTEMPTS times.
4. **Stale pending**: on a broker queue, a job whose message was lost (its broker
   answers and holds nothing for the queue) is re-driven and published again, within
   the seed's budget (``redrive_lost_deliveries``, invariant 31). Everywhere else it is
   counted and reported, never re-driven: with the database as the transport a pending
   row cannot lose its delivery; work waiting past the pending TTL
   means no worker serves its queue, and spending budgets or parking jobs for that
   would punish the jobs for an operations problem (DESIGN §6).
5. **Retention**: finished jobs older than ``RETENTION`` are deleted in bounded
   batches; parked jobs are kept until an operator acts.

Every ``durable_worker`` runs ``run_as_leader``: passes run only while the worker holds
the leased leader row for its tenant filter (``store.acquire_leadership``), so a fleet
reconciles once, and the lease moving on when its holder dies is what makes recovery
need no extra process (invariant 14).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from durable_jobs import conf, db, faults, metrics, registry, store, validation
from durable_jobs.models import Job
from durable_jobs.states import VERDICT_CODES, Lease, ParkReason
from durable_jobs.transports import publishing as transports

log = logging.getLogger("durable_jobs.reconciler")

BATCH = 100
#: Rows one retention DELETE removes: big enough that the statement's fixed cost is
#: noise, small enough that it holds its row locks for a few tens of milliseconds.
RETENTION_BATCH = 5000
#: The share of RECONCILE_INTERVAL a pass may spend deleting finished jobs.
RETENTION_SHARE = 0.5
#: The leader's lease lasts this many reconcile intervals: renewed before every pass, it
#: survives a slow pass or two, and expires soon after its holder dies.
LEADER_LEASE_INTERVALS = 3


@dataclasses.dataclass(slots=True)
class PassReport:
    cancelled: int = 0
    orphans_taken: int = 0
    verdicts_recorded: int = 0
    parked: int = 0
    parked_told: int = 0
    stale_pending: int = 0
    lost_deliveries: int = 0
    deleted: int = 0
    mirror_failures: int = 0

    def acted(self) -> bool:
        return any(
            (
                self.cancelled,
                self.orphans_taken,
                self.verdicts_recorded,
                self.parked,
                self.parked_told,
                self.lost_deliveries,
                self.deleted,
                self.mirror_failures,
            )
        )


class Reconciler:
    def __init__(self, *, tenant: str | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
        self.tenant = tenant
        self.using = using

    def run(self, *, stop: threading.Event, once: bool = False) -> None:
        """Repeat passes every RECONCILE_INTERVAL until ``stop`` is set."""
        while not stop.is_set():
            self.run_guarded_pass()
            if once:
                return
            stop.wait(conf.get().RECONCILE_INTERVAL)

    def run_guarded_pass(self) -> PassReport | None:
        """Run one pass; log (never raise) what went wrong, so the loop outlives any one bad pass."""
        try:
            return self.run_pass()
        except DatabaseError as error:
            log.warning("reconciler pass failed: %s", type(error).__name__)
            connections[self.using].close()
        except Exception:
            log.exception("reconciler pass failed")
        return None

    def run_pass(self) -> PassReport:
        report = PassReport()
        self.end_cancelled(report)
        self.recover_orphans(report)
        self.tell_parked(report)
        self.redrive_lost_deliveries(report)
        self.count_stale_pending(report)
        self.apply_retention(report)
        if report.acted() or report.stale_pending:
            log.info("reconciler pass: %s", report)
        return report

    # --- step 1 ---
    def end_cancelled(self, report: PassReport) -> None:
        grace_ms = conf.ms(conf.get().ORPHAN_GRACE)
        select = functools.partial(
            store.select_cancelling, grace_ms=grace_ms, tenant=self.tenant, using=self.using
        )
        # Only jobs no worker is running: pending, a released lease, or a lease expired
        # past the grace (decided in SQL, on the database clock). A live slice ends
        # itself at its next heartbeat, and is not even locked here.
        for candidate in select(limit=BATCH):
            self._one_at_a_time(
                candidate, select, self._end_cancelled, self._count_terminal_mirror_failure, report
            )

    def _end_cancelled(self, job: Job, report: PassReport) -> None:
        if job.status == "pending":
            row = store.cancel_pending(job.id, using=self.using)
        else:
            row = store.finish_cancelled(_lease_of(job), using=self.using)
        if row is None:
            return
        self._mirror(row, "cancelled")
        report.cancelled += 1
        metrics.emit("jobs_cancelled", kind=job.kind)

    # --- step 2 ---
    def recover_orphans(self, report: PassReport) -> None:
        grace_ms = conf.ms(conf.get().ORPHAN_GRACE)
        select = functools.partial(
            store.select_orphans, grace_ms=grace_ms, tenant=self.tenant, using=self.using
        )
        for candidate in select(limit=BATCH):
            if candidate.cancel_requested_at is not None:
                continue  # step 1 ends it
            self._one_at_a_time(
                candidate, select, self._recover_orphan, self._count_terminal_mirror_failure, report
            )

    def _recover_orphan(self, job: Job, report: PassReport) -> None:
        settings = conf.get()
        if job.cancel_requested_at is not None:
            return  # asked to cancel since the batch was read: step 1 ends it
        if job.error_code in VERDICT_CODES:
            # A verdict whose worker died before recording it: record it, never run the work again.
            row = store.fail_terminal(
                _lease_of(job),
                code=job.error_code,
                error_class=job.error_class or "terminal",
                using=self.using,
            )
            if row is None:
                return
            self._mirror(row, "failed")
            report.verdicts_recorded += 1
            metrics.emit("jobs_failed", kind=job.kind)
            return
        handler = registry.get(job.kind)
        backoff = (
            handler.retry_delay(job.redrives_since_commit + 1)
            if handler
            else settings.RETRY_BACKOFF_BASE
        )
        faults.point("reconciler_between")
        taken = store.take_orphan(
            job.id,
            grace_ms=conf.ms(settings.ORPHAN_GRACE),
            backoff_ms=conf.ms(backoff),
            max_redrives=settings.MAX_REDRIVES_WITHOUT_COMMIT,
            using=self.using,
        )
        if taken is None:
            return
        if taken.status == "pending" and transports.is_brokered(taken.queue_name, settings):
            # Its new pair (redrives + 1), once this transaction commits (invariant 31).
            transports.publish_after_commit(taken, delay_ms=conf.ms(backoff), using=self.using)
        report.orphans_taken += 1
        metrics.emit("orphans_taken", kind=job.kind)
        if taken.status == "failed":
            report.parked += 1
            metrics.emit("jobs_parked", kind=job.kind, reason=ParkReason.POISON.value)
            log.warning("[%s %s] parked as poison: %s", job.kind, job.id, taken.error_message)

    # --- step 3 ---
    def tell_parked(self, report: PassReport) -> None:
        """Call the mirror with ``failed`` for parked jobs whose domain rows still say "running".

        Kinds this process does not know are left for a reconciler that does (stamping
        them would claim a mirror that never ran); kinds without a mirror are stamped.
        """
        bounds = {
            kind: bounds_of(handler) for kind in registry.kinds() if (handler := registry.get(kind))
        }
        if not bounds:
            return
        select = functools.partial(
            store.select_parked_untold, bounds, tenant=self.tenant, using=self.using
        )
        for candidate in select(limit=BATCH):
            self._one_at_a_time(
                candidate, select, self._tell_parked, self._count_park_mirror_failure, report
            )

    def _tell_parked(self, job: Job, report: PassReport) -> None:
        row = store.stamp_parked_mirrored(job.id, epoch=job.lease_epoch, using=self.using)
        if row is None:
            return
        self._mirror(row, "failed")
        report.parked_told += 1

    def _count_park_mirror_failure(self, job: Job, error: Exception, report: PassReport) -> None:
        report.mirror_failures += 1
        attempts = store.bump_park_mirror_attempts(job.id, epoch=job.lease_epoch, using=self.using)
        detail = validation.printable(f"{type(error).__name__}: {error}", limit=300)
        if attempts is not None and attempts >= bounds_of(registry.get(job.kind)):
            log.error(
                "[%s %s] parked as %s; its mirror failed %d times telling the subject, giving up (the "
                "domain row still shows the old state: fix the mirror, then redrive the job): %s",
                job.kind,
                job.id,
                job.error_code,
                attempts,
                detail,
            )
        else:
            log.warning(
                "[%s %s] mirror failed telling the subject of a job parked as %s: %s",
                job.kind,
                job.id,
                job.error_code,
                detail,
            )

    # --- step 4 ---
    def redrive_lost_deliveries(self, report: PassReport) -> None:
        """Step 4a, broker queues only (invariant 31): re-drive a delivery a broker lost.

        A job of a broker queue due for longer than PENDING_TTL whose broker answers and
        holds nothing for that queue (no backlog, nothing taken and unacked) lost its
        message: a crash between commit and publish, a publish that failed or timed out.
        It is re-driven under a new pair (``redrive_pending``: redrives + 1, charged to
        ``redrives_since_commit``, the seed's budget) and published again after commit;
        past MAX_REDRIVES_WITHOUT_COMMIT it is parked ``poison`` (``park``, fenced on the
        epoch read under this transaction's row lock). A queue whose broker does not
        answer, or still holds a backlog, is left alone: a message waiting behind others
        is not lost, and spending budget for a broker outage would park healthy jobs.
        """
        settings = conf.get()
        queues = transports.stale_candidate_queues(settings)
        if queues is not None:
            # Asked before any row is locked: a broker's round trip must not hold job rows,
            # and a queue that still has a backlog must not fill every batch with rows that
            # are then skipped while other queues' lost deliveries wait behind them.
            queues = [queue for queue in queues if transports.holds_nothing(queue)]
        if queues == []:
            return
        ttl_ms = conf.ms(settings.PENDING_TTL)
        budget = settings.MAX_REDRIVES_WITHOUT_COMMIT
        empty: dict[str, bool] = {}
        with transaction.atomic(using=self.using):
            for job in store.select_stale_pending(
                queues=queues,
                pending_ttl_ms=ttl_ms,
                limit=BATCH,
                tenant=self.tenant,
                using=self.using,
            ):
                if job.queue_name not in empty:
                    empty[job.queue_name] = transports.holds_nothing(job.queue_name)
                if not empty[job.queue_name]:
                    continue
                if job.redrives_since_commit + 1 > budget:
                    message = (
                        f"its delivery was lost {job.redrives_since_commit + 1} times without "
                        f"committing any work (budget {budget})"
                    )
                    if store.park(
                        job.id, job.lease_epoch, ParkReason.POISON.value, message, using=self.using
                    ):
                        report.parked += 1
                        metrics.emit("jobs_parked", kind=job.kind, reason=ParkReason.POISON.value)
                        log.warning("[%s %s] parked as poison: %s", job.kind, job.id, message)
                    continue
                row = store.redrive_pending(job.id, pending_ttl_ms=ttl_ms, using=self.using)
                if row is not None:
                    transports.publish_after_commit(row, using=self.using)
                    report.lost_deliveries += 1
                    metrics.emit("lost_deliveries_redriven", kind=job.kind)

    def count_stale_pending(self, report: PassReport) -> None:
        ttl_ms = conf.ms(conf.get().PENDING_TTL)
        report.stale_pending = store.count_stale_pending(
            pending_ttl_ms=ttl_ms, tenant=self.tenant, using=self.using
        )
        metrics.gauge("stale_pending", report.stale_pending)
        if report.stale_pending:
            log.warning(
                "%d pending jobs have been due for longer than PENDING_TTL; is a worker serving their queue?",
                report.stale_pending,
            )

    # --- step 5 ---
    def apply_retention(self, report: PassReport) -> None:
        retention = conf.get().RETENTION
        if retention is None:
            return
        # Batches until none is full or the pass has spent its share of the interval:
        # each batch is its own short statement (its row locks end with it), and the
        # budget, not a row count, bounds the pass, so retention keeps up with whatever
        # rate the server can delete at (a fixed 10,000 rows per pass capped it at
        # 2,000 rows/s at the default interval, below what one worker completes).
        deadline = time.monotonic() + conf.get().RECONCILE_INTERVAL * RETENTION_SHARE
        while True:
            deleted = store.delete_finished(
                older_than_ms=conf.ms(retention),
                limit=RETENTION_BATCH,
                tenant=self.tenant,
                using=self.using,
            )
            report.deleted += deleted
            if deleted < RETENTION_BATCH or time.monotonic() >= deadline:
                break

    # --- one candidate at a time ---
    def _one_at_a_time(
        self,
        candidate: Job,
        select: Callable[..., list[Job]],
        act: Callable[[Job, PassReport], None],
        count_failure: Callable[[Job, Exception, PassReport], None],
        report: PassReport,
    ) -> None:
        """Re-take ``candidate`` alone and act on it in a short transaction of its own.

        The batch was read by a statement of its own, whose row locks ended with it. The
        same predicate, for this one id, re-checks that the job still qualifies and locks
        its row alone (SKIP LOCKED: another reconciler, or a worker's fence, holding it
        means someone else is on it). ``act`` runs the CAS and the mirror inside; when the
        mirror fails, the transaction rolls back and ``count_failure`` runs after it, in
        autocommit, so the count survives whatever happens to the rest of the pass.
        """
        job = None
        try:
            with transaction.atomic(using=self.using):
                rows = select(limit=1, job_id=candidate.id)
                if not rows:
                    return
                job = rows[0]
                act(job, report)
        except _MirrorFailed as failure:
            assert job is not None
            count_failure(job, failure.error, report)

    def _mirror(self, row: Job, outcome: str) -> None:
        """Call the kind's mirror on ``row``; its failure becomes ``_MirrorFailed`` (user code, invariant 11)."""
        handler = registry.get(row.kind)
        if handler is None or handler.mirror is None:
            return
        try:
            handler.mirror(row, outcome)
        except Exception as error:
            if isinstance(error, DatabaseError) and not connections[self.using].is_usable():
                raise  # the connection died: the pass fails and the loop reconnects
            raise _MirrorFailed(error) from error

    def _count_terminal_mirror_failure(
        self, job: Job, error: Exception, report: PassReport
    ) -> None:
        """Count a failed mirror of a terminal CAS; past the kind's budget the job is parked ``mirror_failed``."""
        report.mirror_failures += 1
        log.warning(
            "[%s %s] mirror failed during reconcile: %s",
            job.kind,
            job.id,
            validation.printable(f"{type(error).__name__}: {error}", limit=300),
        )
        max_attempts = bounds_of(registry.get(job.kind))
        message = f"mirror failed: {type(error).__name__}"
        if job.status == "running":
            store.bump_mirror_attempts(
                _lease_of(job),
                max_attempts=max_attempts,
                delay_ms=0,
                message=message,
                using=self.using,
            )
        else:
            store.bump_pending_mirror_attempts(
                job.id, max_attempts=max_attempts, message=message, using=self.using
            )


class _MirrorFailed(Exception):
    """A mirror raised inside a reconciler transaction; carries the user's error out of it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def bounds_of(handler: registry.Handler | None) -> int:
    """The kind's MAX_MIRROR_ATTEMPTS (the settings' when the kind is unknown here)."""
    return handler.setting("MAX_MIRROR_ATTEMPTS") if handler else conf.get().MAX_MIRROR_ATTEMPTS


def _lease_of(job: Job) -> Lease:
    return Lease(job_id=job.id, owner=job.lease_owner or "", epoch=job.lease_epoch, ttl_ms=0)


# ---------------------------------------------------------------------------------------
# Leadership: every worker runs this loop; one at a time runs passes.
# ---------------------------------------------------------------------------------------


def leadership_name(tenant: str | None) -> str:
    """One leadership per tenant filter: a fleet sharded by tenant has a leader per shard."""
    return "reconciler" if tenant is None else f"reconciler:tenant:{tenant}"


def run_as_leader(
    stop: threading.Event,
    identity: str,
    *,
    using: str = DEFAULT_DB_ALIAS,
    tenant: str | None = None,
) -> None:
    """Run reconciler passes whenever ``identity`` holds the leader row, until ``stop`` is set.

    Before every pass the leader renews its lease (LEADER_LEASE_INTERVALS reconcile
    intervals, on the database clock); every other worker tries to take it at the same
    cadence and succeeds once it has expired, which is how leadership leaves a dead
    leader. On ``stop`` the leader resigns, so leadership moves at once.
    """
    reconciler = Reconciler(tenant=tenant, using=using)
    name = leadership_name(tenant)
    leading: int | None = None
    unavailable = False
    try:
        while not stop.is_set():
            interval = conf.get().RECONCILE_INTERVAL
            try:
                # A cut connection alone is retried at once: leadership is not given up for it.
                epoch = db.retry_after_a_cut(
                    using,
                    functools.partial(
                        store.acquire_leadership,
                        name,
                        identity,
                        ttl_ms=conf.ms(interval * LEADER_LEASE_INTERVALS),
                        using=using,
                    ),
                )
            except DatabaseError as error:
                # Once per outage: the loop tries again every interval, and the worker's
                # slots say the same from their side.
                log.log(
                    logging.DEBUG if unavailable else logging.WARNING,
                    "reconciler leadership %s: database unavailable (%s)",
                    name,
                    type(error).__name__,
                )
                unavailable = True
                connections[using].close()
                epoch = None
            else:
                unavailable = False
            if epoch is not None and epoch != leading:
                log.info("reconciler leadership %s taken by %s (epoch %d)", name, identity, epoch)
            elif epoch is None and leading is not None:
                log.info("reconciler leadership %s lost by %s", name, identity)
            leading = epoch
            if leading is not None:
                reconciler.run_guarded_pass()
            stop.wait(interval)
    finally:
        if leading is not None:
            try:
                store.resign_leadership(name, identity, using=using)
                log.info("reconciler leadership %s resigned by %s", name, identity)
            except DatabaseError as error:
                log.warning(
                    "reconciler leadership %s: could not resign (%s); it expires by itself",
                    name,
                    type(error).__name__,
                )
        connections[using].close()
