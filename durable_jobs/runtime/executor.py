"""Run one claimed slice and record its outcome: the single place outcomes are normalised.

Whatever a handler returns or raises maps to exactly one end (``Ran``, by ``invoke``,
wherever the handler ran) and each end to exactly one transition (``record``):

=====================================  ==================================================
handler, or what the worker saw         transition (store statement)
=====================================  ==================================================
``DONE`` / ``Done(result)``             complete + mirror, one transaction
``YIELD``                               yield_slice (seq + 1); interrupted on shutdown
``YIELD`` after a cancel                cancel + mirror, one transaction
a wait (children, event, sleep)         hold_for_wait: seq + 1, no lease (invariant 30)
raises ``CancelRequested``              cancel + mirror
raises ``LeaseLost``                    release (if still ours): someone else owns it
raises a lost-connection error          charge_interruption: the re-drive budget
raises bad job data (``InvalidInput``)  fail_slice as terminal, whatever the classifier
raises anything else                    fail_slice; on a verdict, fail_terminal + mirror
returns anything else                   fail_slice as terminal (``invalid_outcome``)
ran past its time limit                 fail_slice (``time_limit``, transient)
its handler process died                charge_interruption: the re-drive budget
=====================================  ==================================================

The bookkeeping write has a fallback: a database error there is logged, the
connection replaced and the write tried again (a cut connection for a few seconds, with
a short backoff; any other error once). If that fails too the job is left
to its lease, which expires and makes it an orphan the reconciler re-drives; it is
never left looking healthy while nobody runs it, and the worker loop never dies of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    transaction,
)

from durable_jobs import conf, db, faults, metrics, reads, registry, signals, store
from durable_jobs.exceptions import (
    BookkeepingFailed,
)
from durable_jobs.runtime import flow
from durable_jobs.runtime.context import Slice
from durable_jobs.runtime.control import SliceControl
from durable_jobs.runtime.heartbeat import HeldLease
from durable_jobs.runtime.invoke import (
    Ran,
    describe,
    invoke,
    time_limit_failure,
    unregistered,
)
from durable_jobs.states import (
    VERDICT_CODES,
    ErrorClass,
    Lease,
    ParkReason,
    SliceEnd,
    SliceOutcome,
)
from durable_jobs.waits import gate as waits_gate

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.registry import Handler
    from durable_jobs.runtime.heartbeat import Heartbeater

log = logging.getLogger("durable_jobs.worker")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SliceReport:
    """What happened to one slice, for logs, metrics and the testing helpers."""

    job_id: Any
    kind: str
    outcome: SliceOutcome
    duration: float
    error: str | None = None
    #: The slice's own work: its ``duration`` less what the slot spent waiting to hear
    #: from the handler process beyond the run itself (the run timed by that process's
    #: clock). On a saturated machine that wait is tens of milliseconds for a no-op run;
    #: the slot's bookkeeping and the kind's mirror stay in. None in thread execution,
    #: where the duration is all there is.
    busy: float | None = None
    #: held: seconds until the job is due again (its wait's instant or next check).
    recheck_in: float | None = None


def run_slice(
    job: Job,
    *,
    stopping: threading.Event | None = None,
    heartbeater: Heartbeater | None = None,
    completions: list[DeferredCompletion] | None = None,
    runner: Callable[[SliceControl], Ran] | None = None,
    on_start: Callable[[SliceControl], None] | None = None,
    check_slots: waits_gate.CheckSlots | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> SliceReport:
    """Run the handler for ``job`` (already claimed by this worker) and record the outcome.

    ``runner`` runs the handler somewhere else (process execution: a child process) and
    answers how it ended; without one the handler runs on this thread (``invoke``).
    ``on_start`` is handed the worker's control of the slice before the handler runs (the worker's
    supervisor watches it).

    With ``completions`` (a worker slot's batch), a job of a kind without a mirror that
    finishes is not completed here but appended to the list, outcome ``deferred``: the
    slot completes the batch with one statement (``complete_deferred``), each row still
    fenced on its own epoch. Nothing is reported completed before that commits.

    A job whose wait condition has not cleared goes through the wait gate first
    (``durable_jobs.waits.gate``), with ``check_slots`` bounding this worker's checks:
    held (outcome ``held``), failed with its wait code, or cleared and run.
    """
    began = time.monotonic()
    faults.point("after_claim")
    owner = job.lease_owner
    assert owner is not None, "run_slice is given claimed rows only"  # store.dequeue sets it
    # The TTL the claim gave the lease; a kind with its own is given that below.
    claimed_ttl_ms = conf.ms(conf.get().LEASE_TTL)
    lease = Lease(job_id=job.id, owner=owner, epoch=job.lease_epoch, ttl_ms=claimed_ttl_ms)
    control = None
    heard_late: float | None = None
    try:
        handler = registry.get(job.kind) or unregistered(job.kind)
        if handler.lease_ttl is not None and conf.ms(handler.lease_ttl) != claimed_ttl_ms:
            lease = Lease(
                job_id=job.id,
                owner=owner,
                epoch=job.lease_epoch,
                ttl_ms=conf.ms(handler.lease_ttl),
            )
        if job.error_code in VERDICT_CODES:
            # A verdict decided by fail_slice whose terminal transaction never committed:
            # record it, never run the work again.
            outcome = _end_failed(
                job, handler, lease, job.error_code, None, using, error_class=job.error_class
            )
            return _report(job, began, outcome)
        if waits_gate.pending(job):
            verdict = _gate(job, handler, lease, heartbeater, check_slots, stopping, using)
            if verdict.end != "run":
                outcome = SliceOutcome(verdict.end)  # held, or failed with its wait code
                if verdict.end == "failed":
                    outcome = _end_failed(job, handler, lease, verdict.code, verdict.message, using)
                return _report(job, began, outcome, verdict.message, recheck_in=verdict.recheck_in)
            assert verdict.job is not None, "the gate's run verdict carries the row"
            job = verdict.job
        verdict_of_wait = flow.failure_verdict(job, lease, using=using)
        if verdict_of_wait is not None:
            # The wait's failure policy ends the parent before its handler runs again.
            code, message = verdict_of_wait
            outcome = _end_failed(job, handler, lease, code, message, using)
            return _report(job, began, outcome, message)
        control = SliceControl(job, handler, lease, stopping=stopping, using=using)
        if on_start is not None:
            on_start(control)
        faults.point("slice_starting")
        if control.abandoned:
            # The worker is exiting and handing every lease back: the handler must not
            # start once its claim may be another worker's. The claim goes back
            # uncharged, as an interruption; where the main thread has already handed
            # it back, the fence makes this a no-op.
            with contextlib.suppress(BookkeepingFailed):
                _guarded(using, lambda: store.yield_slice(lease, interrupted=True, using=using))
            return _report(job, began, SliceOutcome.ABANDONED, "the worker is exiting")
        signals.slice_started.send_robust(sender=Slice, job=job)
        if heartbeater is not None:
            heartbeater.track(control)
        if lease.ttl_ms != claimed_ttl_ms and store.heartbeat(lease, using=using) is None:
            outcome, error = (
                SliceOutcome.LEASE_LOST,
                None,
            )  # the claim used the default TTL; this kind has its own
        else:
            asked = time.monotonic()
            ran = runner(control) if runner is not None else invoke(control.context, using=using)
            if ran.seconds is not None:
                # Negative when the child ran it (queued) before this slot asked for it.
                heard_late = time.monotonic() - asked - ran.seconds
            if not control.handler_returned():
                # The worker gave up on this slice (time limit, cancel past its grace) and
                # recorded that itself; whatever the handler did since is not ours to write.
                outcome, error = SliceOutcome.ABANDONED, ran.message
            else:
                outcome, error = record(control, ran, completions=completions, using=using)
    except BookkeepingFailed as failed:
        # The write and its retries all failed: the job is left to its lease, which
        # expires and makes it an orphan the reconciler re-drives (invariant 14a).
        outcome, error = SliceOutcome.BOOKKEEPING_FAILED, failed.cause
    except Exception as unexpected:
        log.exception("[%s %s] slice bookkeeping failed", job.kind, job.id)
        outcome, error = SliceOutcome.BOOKKEEPING_FAILED, describe(unexpected)
        # Hand the lease back (after a pause, in case the fault repeats) rather than leave
        # the job to wait out its lease as an orphan.
        with contextlib.suppress(BookkeepingFailed):
            _guarded(
                using,
                lambda: store.release_lease(
                    lease, delay_ms=conf.ms(conf.get().RETRY_BACKOFF_MAX), using=using
                ),
            )
    finally:
        if heartbeater is not None and control is not None:
            heartbeater.untrack(control)
    report = _report(job, began, outcome, error, heard_late=heard_late)
    signals.slice_finished.send_robust(sender=Slice, job=job, outcome=report.outcome)
    return report


def _end_failed(
    job: Job,
    handler: Handler,
    lease: Lease,
    code: str | None,
    message: str | None,
    using: str,
    *,
    error_class: str | None = ErrorClass.TERMINAL.value,
) -> SliceOutcome:
    """End the job failed with ``code`` before its handler runs: a verdict already decided,
    or a wait's (a wait condition's code, a workflow wait's failure policy)."""
    return _finish_guarded(
        job,
        handler,
        lease,
        SliceOutcome.FAILED,
        using=using,
        code=code,
        error_class=error_class,
        message=message,
    )


def _gate(
    job: Job,
    handler: Handler,
    lease: Lease,
    heartbeater: Heartbeater | None,
    check_slots: waits_gate.CheckSlots | None,
    stopping: threading.Event | None,
    using: str,
) -> waits_gate.Verdict:
    """Run the wait gate with the claim's lease kept alive: checks may outlast a lease TTL."""
    held = HeldLease(job, lease, handler.setting("HEARTBEAT_INTERVAL"))
    if heartbeater is not None:
        heartbeater.track(held)
    try:
        return waits_gate.run(job, lease, slots=check_slots, stopping=stopping, using=using)
    finally:
        if heartbeater is not None:
            heartbeater.untrack(held)


def record(
    control: SliceControl,
    ran: Ran,
    *,
    completions: list[DeferredCompletion] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[SliceOutcome, str | None]:
    """Write the one transition ``ran`` calls for; return (outcome, error text)."""
    job, handler, lease = control.row, control.handler, control.lease
    if ran.end is SliceEnd.LEASE_LOST:
        # Lost here (taken over) or only given up locally: hand the lease back in case it
        # is still ours, so the job need not wait out its expiry.
        _guarded(using, lambda: store.release_lease(lease, delay_ms=0, using=using))
        return SliceOutcome.LEASE_LOST, None
    if ran.end is SliceEnd.WITHDRAWN:
        _guarded(using, lambda: store.release_lease(lease, delay_ms=0, using=using))
        return SliceOutcome.HANDED_BACK, None
    if ran.end is SliceEnd.CANCEL:
        return _finish_guarded(job, handler, lease, SliceOutcome.CANCELLED, using=using), None
    if ran.end is SliceEnd.DONE:
        if completions is not None and handler.mirror is None:
            completions.append(
                DeferredCompletion(job=job, lease=lease, result_json=ran.result_json)
            )
            return SliceOutcome.DEFERRED, None
        result = json.loads(ran.result_json) if ran.result_json is not None else None
        return _finish_guarded(
            job, handler, lease, SliceOutcome.COMPLETED, using=using, result=result
        ), None
    if ran.end is SliceEnd.YIELD:
        delivery = _guarded(
            using, lambda: store.yield_slice(lease, interrupted=ran.interrupted, using=using)
        )
        if delivery is None:
            return SliceOutcome.LEASE_LOST, None
        return (SliceOutcome.INTERRUPTED if ran.interrupted else SliceOutcome.YIELDED), None
    if ran.end is SliceEnd.WAIT:
        held = _guarded(using, lambda: flow.hold(lease, ran.wait_json, using=using))
        return (SliceOutcome.LEASE_LOST if held is None else held), None
    if ran.end is SliceEnd.INTERRUPTED:
        return _charge_interruption(control, ran, using), ran.message
    if ran.end is SliceEnd.TIME_LIMIT:
        return _fail(control, time_limit_failure(control), using), ran.message
    return _fail(control, ran, using), ran.message


def _charge_interruption(control: SliceControl, ran: Ran, using: str) -> SliceOutcome:
    settings = conf.get()
    job, handler, lease = control.row, control.handler, control.lease
    row = _guarded(
        using,
        lambda: store.charge_interruption(
            lease,
            reason=ran.message or "interrupted",
            max_redrives=settings.MAX_REDRIVES_WITHOUT_COMMIT,
            backoff_ms=conf.ms(handler.retry_delay(job.redrives_since_commit + 1)),
            traceback=ran.traceback,
            started_at=claimed_at(control),
            using=using,
        ),
    )
    if row is None:
        return SliceOutcome.LEASE_LOST
    if row.status == "failed":
        metrics.emit("jobs_parked", kind=job.kind, reason=ParkReason.POISON.value)
        return SliceOutcome.PARKED
    return SliceOutcome.INTERRUPTED


def claimed_at(control: SliceControl) -> Any:
    """When the slice's claim took the lease: the claim's own ``heartbeat_at``, as it
    returned it (the database's clock; the row object is not refreshed by heartbeats)."""
    return control.row.heartbeat_at


def _fail(control: SliceControl, ran: Ran, using: str) -> SliceOutcome:
    """Count a failed slice; on a verdict, record it with the terminal transaction.

    Invariant 32: ``fail_slice`` records the attempt (a time limit's as ``time_limit``).
    """
    handler, lease, job = control.handler, control.lease, control.row
    reply = _guarded(
        using,
        lambda: store.fail_slice(
            lease,
            error_class=ran.error_class or ErrorClass.TRANSIENT.value,
            code=ran.code,
            message=ran.message,
            max_failures=handler.setting_for(job, "MAX_CONSECUTIVE_FAILURES"),
            backoff_base_ms=conf.ms(handler.setting_for(job, "RETRY_BACKOFF_BASE")),
            backoff_max_ms=conf.ms(handler.setting_for(job, "RETRY_BACKOFF_MAX")),
            outcome="time_limit" if ran.end is SliceEnd.TIME_LIMIT else "failed",
            traceback=ran.traceback,
            started_at=claimed_at(control),
            using=using,
        ),
    )
    if reply is None:
        return SliceOutcome.LEASE_LOST
    if reply.verdict is None:
        return SliceOutcome.RETRYING
    return _finish_guarded(
        control.row,
        handler,
        lease,
        SliceOutcome.FAILED,
        using=using,
        code=reply.verdict,
        error_class=ran.error_class,
        message=ran.message,
    )


#: The status each terminal outcome writes.
_ENDS = {
    SliceOutcome.COMPLETED: "completed",
    SliceOutcome.FAILED: "failed",
    SliceOutcome.CANCELLED: "cancelled",
}


def _finish_guarded(
    job: Job,
    handler: Handler,
    lease: Lease,
    outcome: SliceOutcome,
    *,
    using: str,
    **details: Any,
) -> SliceOutcome:
    """``_finish`` under ``_guarded``: retried on a cut connection, and recognising its own
    terminal write when a try before the retry committed and only its reply was lost."""

    def landed() -> SliceOutcome | None:
        row = reads.get_job_unscoped(lease.job_id, using=using)
        if row is None or row.status != _ENDS[outcome] or row.lease_epoch != lease.epoch:
            return None  # not ended, or ended by another hand (a takeover moves the epoch)
        signals.job_finished.send_robust(sender=Slice, job=row, outcome=outcome)
        metrics.emit(f"jobs_{outcome}", kind=job.kind)
        return outcome

    return _guarded(
        using, lambda: _finish(job, handler, lease, outcome, using=using, **details), landed=landed
    )


def _finish(
    job: Job,
    handler: Handler,
    lease: Lease,
    outcome: SliceOutcome,
    *,
    using: str,
    result: Any = None,
    processed: int | None = None,
    code: str | None = None,
    error_class: str | None = None,
    message: str | None = None,
) -> SliceOutcome:
    """The terminal transaction: the epoch-fenced CAS and the mirror commit together.

    Invariant 11: when the mirror raises, both roll back; the attempt is then counted in
    its own autocommit statement, which also releases the lease and, past the budget,
    parks the job ``mirror_failed``. A mirror failure spends no retry budget.
    """

    def transition():
        if outcome is SliceOutcome.COMPLETED:
            return store.complete(lease, result=result, processed=processed, using=using)
        if outcome is SliceOutcome.FAILED:
            return store.fail_terminal(
                lease,
                code=code or "failed",
                error_class=error_class or "terminal",
                message=message,
                using=using,
            )
        return store.finish_cancelled(lease, using=using)

    try:
        # Without a mirror the CAS is the whole terminal transaction: one statement.
        with (
            transaction.atomic(using=using)
            if handler.mirror is not None
            else contextlib.nullcontext()
        ):
            row = transition()
            if row is None:
                return SliceOutcome.LEASE_LOST
            if handler.mirror is not None:
                handler.mirror(row, outcome)
            faults.point("terminal_inside")
    except Exception as error:
        if db.is_connection_loss(error) or (
            isinstance(error, OperationalError) and not db.connection_usable(using)
        ):
            raise  # the connection failed, not the mirror: _guarded retries the whole transaction
        # A usable connection means the mirror itself failed (a constraint, a deadlock,
        # a statement timeout): count it against the mirror budget, not the work.
        db.leave_broken_transaction(using)
        log.warning("[%s %s] mirror failed: %s", job.kind, job.id, describe(error))
        parked = store.bump_mirror_attempts(
            lease,
            max_attempts=handler.setting("MAX_MIRROR_ATTEMPTS"),
            delay_ms=conf.ms(handler.retry_delay(job.mirror_attempts + 1)),
            message=f"mirror failed: {describe(error)}",
            using=using,
        )
        if parked is None:
            return SliceOutcome.LEASE_LOST
        if parked.status != "failed":
            return SliceOutcome.MIRROR_RETRY
        metrics.emit("jobs_parked", kind=job.kind, reason=ParkReason.MIRROR_FAILED.value)
        return SliceOutcome.PARKED
    faults.point("terminal_after")
    signals.job_finished.send_robust(sender=Slice, job=row, outcome=outcome)
    metrics.emit(f"jobs_{outcome}", kind=job.kind)
    return outcome


#: How long a bookkeeping write keeps retrying a cut connection (seconds). A connection
#: that ``pg_terminate_backend`` or a proxy cut is replaced at the next connect, so the
#: first retry nearly always lands; the bound is for a server that is restarting. It is
#: well inside any lease TTL (conf refuses one under the heartbeat interval): the job's
#: lease is still ours and still beaten by the heartbeat meanwhile.
RECONNECT_WINDOW = 5.0
#: Pauses between those retries (seconds): at once, then growing, the last one repeated.
RECONNECT_PAUSES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)


def _guarded(
    using: str, write: Callable[[], T], *, landed: Callable[[], T | None] | None = None
) -> T:
    """Run a bookkeeping write; on a database failure replace the connection and retry.

    A lost connection is retried, on a new connection each time, for up to
    ``RECONNECT_WINDOW`` (at once, then with a short backoff): before issue #27 a finished
    job whose write met two cut connections in a row waited out its whole lease as an
    orphan. Any other database error (a statement that failed on a live connection) is
    tried once more only. A write retried after its reply was lost may find its own first
    try committed: every bookkeeping statement is fenced, so the second run matches
    nothing and doubles nothing; the terminal writes recognise their own landed write
    (``landed``: asked before a retry that follows a cut connection) so the outcome is
    still reported as it was.

    Raises ``BookkeepingFailed`` when the retries are spent: ``run_slice`` reports the
    slice ``bookkeeping_failed`` and the job is left to its lease (invariant 14a).
    """
    window = min(RECONNECT_WINDOW, conf.ms(conf.get().LEASE_TTL) / 2000)
    deadline = time.monotonic() + window
    cause = ""
    lost = False
    for attempt in itertools.count(1):
        try:
            if lost and landed is not None:
                # The try before was cut off: it may have committed, its reply lost.
                own = landed()
                if own is not None:
                    log.info("bookkeeping write had landed before its connection was cut")
                    return own
            return write()
        except (OperationalError, InterfaceError, DatabaseError) as error:
            cause = describe(error)
            lost = db.is_connection_loss(error)
            db.reset_connection(using)
            pause = RECONNECT_PAUSES[min(attempt - 1, len(RECONNECT_PAUSES) - 1)]
            if not lost and attempt >= 2 or time.monotonic() + pause > deadline:
                break
            # One cut connection is routine (a pooler, an administrator, a failover): it
            # says so at INFO. A write that still fails on a new connection is a warning.
            log.log(
                logging.INFO if lost and attempt == 1 else logging.WARNING,
                "bookkeeping write failed (attempt %d), retrying on a new connection: %s",
                attempt,
                cause,
            )
            time.sleep(pause)
    log.error(
        "bookkeeping write failed %d times (%s); "
        "the job's lease will expire and the reconciler will re-drive it",
        attempt,
        cause,
    )
    raise BookkeepingFailed(cause)


#: SQLSTATEs that say the server ended the session: an administrator's command
#: (pg_terminate_backend), a crash or a shutdown, a server not accepting connections yet.


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeferredCompletion:
    job: Job
    lease: Lease
    result_json: str | None


def complete_deferred(
    completions: list[DeferredCompletion], *, using: str = DEFAULT_DB_ALIAS
) -> list[SliceOutcome]:
    """Complete a slot's batch of finished slices in one statement; return each one's outcome.

    Each row is fenced on its own epoch: a job taken over meanwhile is ``lease_lost`` and
    the others still complete. Signals, metrics and the log line follow the commit.
    """
    if not completions:
        return []
    try:
        applied = _guarded(
            using,
            lambda: store.complete_many(
                [(item.lease, item.result_json) for item in completions], using=using
            ),
            landed=lambda: _landed_completions(completions, using),
        )
    except BookkeepingFailed:
        applied = set()  # none committed: each is left to its lease, and reported so
        failed = True
    else:
        failed = False
    outcomes = []
    for item in completions:
        if failed:
            outcome = SliceOutcome.BOOKKEEPING_FAILED
        elif item.job.id in applied:
            outcome = SliceOutcome.COMPLETED
        else:
            outcome = SliceOutcome.LEASE_LOST
        if outcome is SliceOutcome.COMPLETED:
            faults.point("terminal_after")
            signals.job_finished.send_robust(sender=Slice, job=item.job, outcome=outcome)
            metrics.emit("jobs_completed", kind=item.job.kind)
            # One INFO line per batch below: a line per no-op-sized job was a measurable
            # share of a slice (issue #14); each job is still named at DEBUG.
            log.debug(
                "slice kind=%s job=%s outcome=completed (batched completion)",
                item.job.kind,
                item.job.id,
            )
        else:
            log.warning(
                "slice kind=%s job=%s outcome=%s (batched completion)",
                item.job.kind,
                item.job.id,
                outcome,
            )
        outcomes.append(outcome)
    completed: dict[str, int] = {}
    for item, outcome in zip(completions, outcomes, strict=True):
        if outcome is SliceOutcome.COMPLETED:
            completed[item.job.kind] = completed.get(item.job.kind, 0) + 1
    for kind, count in completed.items():
        log.info("slices kind=%s jobs=%d outcome=completed (batched completion)", kind, count)
    return outcomes


def _landed_completions(completions: list[DeferredCompletion], using: str) -> set[Any] | None:
    """After a cut connection: the batch's completions that had committed, the rest completed now.

    ``store.complete_many`` may run as two transactions (its leaf form, then the telling
    form for the rows left), so a try may have landed some rows and not others.
    """
    leases = [(item.lease.job_id, item.lease.epoch) for item in completions]
    done = reads.ended_at_epoch(leases, "completed", using=using)
    if not done:
        return None  # nothing landed: the write runs again as it is
    ended = {str(job_id) for job_id in done}
    rest = [item for item in completions if str(item.job.id) not in ended]
    if rest:
        done |= store.complete_many([(item.lease, item.result_json) for item in rest], using=using)
    return done


def _report(
    job: Job,
    began: float,
    outcome: SliceOutcome,
    error: str | None = None,
    *,
    recheck_in: float | None = None,
    heard_late: float | None = None,
) -> SliceReport:
    duration = time.monotonic() - began
    report = SliceReport(
        job_id=job.id,
        kind=job.kind,
        outcome=outcome,
        duration=duration,
        error=error,
        recheck_in=recheck_in,
        busy=None if heard_late is None else duration - heard_late,
    )
    metrics.emit("slices", kind=job.kind, outcome=outcome)
    metrics.observe("slice_seconds", duration, kind=job.kind, outcome=outcome)
    level = (
        logging.WARNING
        if outcome
        in (SliceOutcome.LEASE_LOST, SliceOutcome.BOOKKEEPING_FAILED, SliceOutcome.PARKED)
        else logging.INFO
    )
    if outcome is SliceOutcome.DEFERRED:
        return report  # logged when its batched completion commits
    # kind matched KIND_PATTERN at start and the id is a UUID: only validated bytes here.
    log.log(
        level,
        "slice kind=%s job=%s outcome=%s duration_ms=%d%s",
        job.kind,
        job.id,
        outcome,
        duration * 1000,
        f" error={error!r}" if error else "",
    )
    return report
