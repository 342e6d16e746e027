"""The slice context a handler receives: its job, its lease, and the fenced ways to write."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from durable_jobs import conf, db, faults, store, validation
from durable_jobs.exceptions import CancelRequested, LeaseLost
from durable_jobs.states import Lease, Scope

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.registry import Handler

_UNSET: Any = store.UNSET


class JobLogger(logging.LoggerAdapter):
    """Prefixes every line with the job's kind and id (both validated, never raw input)."""

    def process(self, msg, kwargs):
        return f"[{self.extra['kind']} {self.extra['job_id']}] {msg}", kwargs


class Slice:
    """One bounded run of a handler under one lease.

    Read ``input``, ``checkpoint``, ``scope`` and ``subject``; write domain rows inside
    ``fenced()``; record progress with ``save_checkpoint()`` (durable) or ``heartbeat()``
    (advisory); return ``YIELD`` when ``should_yield()`` says so.
    """

    def __init__(
        self,
        job: Job,
        handler: Handler,
        lease: Lease,
        *,
        stopping: threading.Event | None = None,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        #: The job's row as the claim returned it (read-only: every write goes through the
        #: fenced methods below).
        self.row = job
        self.id = job.id
        self.kind = job.kind
        self.input = job.input
        self.checkpoint = job.checkpoint
        self.meta = job.meta
        self.scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
        self.subject = (job.subject_type, job.subject_id) if job.subject_type else None
        self.processed = job.processed_count
        self.total = job.total_count
        self.lease = lease
        self.handler = handler
        self.using = using
        self.log = JobLogger(
            logging.getLogger("durable_jobs.job"), {"kind": job.kind, "job_id": job.id}
        )
        self._stopping = stopping or threading.Event()
        self.started_at = time.monotonic()
        self._deadline = self.started_at + handler.setting("SLICE_BUDGET")
        #: The hard bound (monotonic): past it the worker ends the slice (time_limit).
        self.time_limit_at = self.started_at + handler.time_limit_seconds()
        self._cancel_observed = job.cancel_requested_at is not None
        #: When (monotonic) this slice first learned of a cancel request.
        self.cancel_seen_at: float | None = self.started_at if self._cancel_observed else None
        self._lease_lost = False
        #: Set by the worker that gave up on this slice (thread execution: time limit or
        #: cancel past its grace); nothing the handler does afterwards is recorded.
        self.abandoned = False
        #: Set once the handler came back, before its outcome is recorded: from then on
        #: the slice is bookkeeping, which no time limit may abandon.
        self.returned = False
        self._end_lock = threading.Lock()
        #: True while a fenced transaction of this slice holds the job row.
        self.in_fence = False

    @property
    def job(self) -> Job:
        """Deprecated alias of ``row`` (``job.job`` read as the job's job); removed in 0.3."""
        warnings.warn(
            "Slice.job is deprecated; use Slice.row (the job's row)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.row

    # --- attempt counters, for handlers that want to behave differently on a retry ---
    @property
    def attempt(self) -> int:
        """1 on the first try of this delivery, 2 after one failed slice, and so on."""
        return self.row.consecutive_failures + 1

    @property
    def continuation(self) -> int:
        """How many slices of this job yielded before this one."""
        return self.row.continuation_seq

    @property
    def heartbeat_interval(self) -> float:
        return self.handler.setting("HEARTBEAT_INTERVAL")

    # --- what the heartbeat thread reports in ---
    def observe_cancel(self) -> None:
        if not self._cancel_observed:
            self.cancel_seen_at = time.monotonic()
        self._cancel_observed = True

    def abandon(self) -> bool:
        """Give up on this slice (every later fenced write raises ``LeaseLost``).

        False when the handler has already returned: its outcome is being recorded, and
        exactly one of the two — the supervisor's charge or the record — must happen.
        """
        with self._end_lock:
            if self.returned:
                return False
            self.abandoned = True
            self._lease_lost = True
            return True

    def handler_returned(self) -> bool:
        """Mark the handler as returned; False when the worker abandoned the slice first."""
        with self._end_lock:
            if self.abandoned:
                return False
            self.returned = True
            return True

    def mark_lease_lost(self) -> None:
        self._lease_lost = True

    @property
    def cancel_observed(self) -> bool:
        return self._cancel_observed

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost

    @property
    def interrupted(self) -> bool:
        """The worker is shutting down and wants this slice to hand back."""
        return self._stopping.is_set()

    def should_yield(self) -> bool:
        """True when the slice should return ``YIELD``: budget spent, shutdown, cancel, or lease lost."""
        return (
            self._stopping.is_set()
            or self._cancel_observed
            or self._lease_lost
            or time.monotonic() >= self._deadline
        )

    def past_time_limit(self, now: float | None = None) -> bool:
        """True once the slice has run past its kind's time limit: the worker ends it."""
        return (time.monotonic() if now is None else now) >= self.time_limit_at

    # --- fenced writes ---
    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """Run the block's domain writes in one transaction with the lease re-asserted.

        Invariant 5. The job row is locked ``FOR UPDATE`` with the owner and epoch
        checked, so nobody can take the job over until this commits; a lost lease raises
        ``LeaseLost`` before the block runs and nothing lands. At the end the lease is
        extended from ``clock_timestamp()``, so a transaction that ran longer than the
        lease commits a fresh lease, never one born expired. A fenced write is a
        committed unit (invariant 7): it resets the suspicion budgets.

        Inside the caller's own ``atomic()`` the row stays locked until that outer
        transaction commits (the background heartbeat skips it meanwhile), so the lease
        is extended once more right after that commit.
        """
        if self._lease_lost:
            raise LeaseLost(self.id, self.lease.epoch)
        if self._cancel_observed:
            raise CancelRequested(self.id)
        if self.in_fence:  # nested: the outer fence already holds the row
            yield
            return
        outermost = not connections[self.using].in_atomic_block
        # What save_checkpoint() records in memory is only true once this commits.
        remembered = (self.checkpoint, self.processed, self.total)
        with transaction.atomic(using=self.using):
            self.in_fence = True
            try:
                if outermost:
                    db.limit_idle_in_transaction(
                        conf.ms(conf.get().FENCED_IDLE_TIMEOUT), using=self.using
                    )
                if not store.assert_lease(self.lease, using=self.using):
                    self._lease_lost = True
                    raise LeaseLost(self.id, self.lease.epoch)
                yield
                faults.point("domain_before_commit")
                cancel = store.heartbeat(self.lease, committed=True, using=self.using)
                if cancel is None:  # cannot happen while we hold the row lock; never assume
                    self._lease_lost = True
                    raise LeaseLost(self.id, self.lease.epoch)
                if cancel:
                    self.observe_cancel()
                if not outermost:
                    transaction.on_commit(
                        self._beat_after_outer_commit, using=self.using, robust=True
                    )
            except BaseException:
                self.checkpoint, self.processed, self.total = remembered
                raise
            finally:
                self.in_fence = False
        faults.point("domain_after_commit")

    def _beat_after_outer_commit(self) -> None:
        if store.heartbeat(self.lease, using=self.using) is None:
            self._lease_lost = True

    def save_checkpoint(
        self, state: Any, *, processed: int | None = None, total: Any = _UNSET
    ) -> None:
        """Durably record where the work stands: a committed unit (resets the budgets).

        Inside ``fenced()`` it commits with the block's domain writes; outside, in a
        fenced transaction of its own.
        """
        settings = conf.get()
        # Checked before anything is written; a bad value raises InvalidCheckpoint or
        # InvalidProgress, which fail the job at once (a bug, not worth five retries).
        validation.checkpoint(
            state, max_bytes=settings.MAX_PAYLOAD_BYTES, max_depth=settings.MAX_PAYLOAD_DEPTH
        )
        processed, total = validation.progress(processed, total, unset=_UNSET)
        with self.fenced():
            if not store.write_checkpoint(
                self.lease, state, processed=processed, total=total, using=self.using
            ):
                self._lease_lost = True
                raise LeaseLost(self.id, self.lease.epoch)
        self.checkpoint = state
        if processed is not None:
            self.processed = processed
        if total is not _UNSET:
            self.total = total

    def heartbeat(self, *, processed: int | None = None, total: Any = _UNSET) -> None:
        """Report progress and extend the lease now; raises ``LeaseLost`` if it is gone.

        Advisory: progress recorded here is not a committed unit. The worker heartbeats
        in the background anyway, so call this only to publish progress. It does not
        move the slice's time limit.
        """
        if self._lease_lost:
            raise LeaseLost(self.id, self.lease.epoch)
        processed, total = validation.progress(processed, total, unset=_UNSET)  # InvalidProgress
        cancel = store.heartbeat(self.lease, processed=processed, total=total, using=self.using)
        if cancel is None:
            self._lease_lost = True
            raise LeaseLost(self.id, self.lease.epoch)
        if cancel:
            self.observe_cancel()
        if processed is not None:
            self.processed = processed
        if total is not _UNSET:
            self.total = total
