"""The slice context a handler receives: its job, its lease, and the fenced ways to write."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from durable_jobs import conf, db, faults, store, validation
from durable_jobs.exceptions import CancelRequested, LeaseLost
from durable_jobs.runtime import flow
from durable_jobs.states import Lease, Scope
from durable_jobs.workflows import ChildOutcome, Event, Wait

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.registry import Handler

_UNSET: Any = store.UNSET


class JobLogger(logging.LoggerAdapter):
    """Prefixes every line with the job's kind and id (both validated, never raw input)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[str, MutableMapping[str, Any]]:
        extra = self.extra
        assert extra is not None  # Slice always gives the job's kind and id
        return f"[{extra['kind']} {extra['job_id']}] {msg}", kwargs


@dataclasses.dataclass(eq=False)
class SliceState:
    """What the handler's context and the worker's control of one slice share.

    The handler reads it (``should_yield()``, ``lease_lost``); the worker's side
    (``control.SliceControl``: the heartbeat, the supervisor, the handler process's
    mailbox) writes it. Kept apart from both so neither hands the other its methods.
    """

    stopping: threading.Event
    deadline: float  # monotonic: the slice budget is spent
    cancel_observed: bool = False
    #: When (monotonic) the slice first learned of a cancel request: its grace runs from here.
    cancel_seen_at: float | None = None
    lease_lost: bool = False
    #: True while a fenced transaction of this slice holds the job row.
    in_fence: bool = False

    def observe_cancel(self) -> None:
        if not self.cancel_observed:
            self.cancel_seen_at = time.monotonic()
        self.cancel_observed = True


def new_state(job: Job, handler: Handler, stopping: threading.Event | None) -> SliceState:
    """The shared state of a slice starting now."""
    now = time.monotonic()
    cancelled = job.cancel_requested_at is not None
    return SliceState(
        stopping=stopping or threading.Event(),
        deadline=now + handler.setting("SLICE_BUDGET"),
        cancel_observed=cancelled,
        cancel_seen_at=now if cancelled else None,
    )


class Slice:
    """What a handler receives: one bounded run of its job under one lease.

    Read ``input``, ``checkpoint``, ``scope``, ``subject`` and ``row`` (the job's row as
    claimed); write domain rows inside ``fenced()``; record progress with
    ``save_checkpoint()`` (durable) or ``heartbeat()`` (advisory); return ``YIELD`` when
    ``should_yield()`` says so. The worker's control of the slice (time limits,
    abandoning it, the heartbeat's reports) is not here: see ``control.SliceControl``.
    """

    def __init__(
        self,
        job: Job,
        handler: Handler,
        lease: Lease,
        *,
        stopping: threading.Event | None = None,
        using: str = DEFAULT_DB_ALIAS,
        state: SliceState | None = None,
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
        self._state = state or new_state(job, handler, stopping)

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

    # --- what the handler asks ---
    @property
    def cancel_observed(self) -> bool:
        """A cancel request reached this slice: return (``YIELD`` ends it cancelled)."""
        return self._state.cancel_observed

    @property
    def lease_lost(self) -> bool:
        """The lease is gone: nothing this slice writes from now on can land."""
        return self._state.lease_lost

    @property
    def interrupted(self) -> bool:
        """The worker is shutting down and wants this slice to hand back."""
        return self._state.stopping.is_set()

    def should_yield(self) -> bool:
        """True when the slice should return ``YIELD``: budget spent, shutdown, cancel, or lease lost."""
        state = self._state
        return (
            state.stopping.is_set()
            or state.cancel_observed
            or state.lease_lost
            or time.monotonic() >= state.deadline
        )

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
        if self._state.lease_lost:
            raise LeaseLost(self.id, self.lease.epoch)
        if self._state.cancel_observed:
            raise CancelRequested(self.id)
        if self._state.in_fence:  # nested: the outer fence already holds the row
            yield
            return
        outermost = not connections[self.using].in_atomic_block
        # What save_checkpoint() records in memory is only true once this commits.
        remembered = (self.checkpoint, self.processed, self.total)
        with transaction.atomic(using=self.using):
            self._state.in_fence = True
            try:
                if outermost:
                    db.limit_idle_in_transaction(
                        conf.ms(conf.get().FENCED_IDLE_TIMEOUT), using=self.using
                    )
                if not store.assert_lease(self.lease, using=self.using):
                    self._state.lease_lost = True
                    raise LeaseLost(self.id, self.lease.epoch)
                yield
                faults.point("domain_before_commit")
                cancel = store.heartbeat(self.lease, committed=True, using=self.using)
                if cancel is None:  # cannot happen while we hold the row lock; never assume
                    self._state.lease_lost = True
                    raise LeaseLost(self.id, self.lease.epoch)
                if cancel:
                    self._state.observe_cancel()
                if not outermost:
                    transaction.on_commit(
                        self._beat_after_outer_commit, using=self.using, robust=True
                    )
            except BaseException:
                self.checkpoint, self.processed, self.total = remembered
                raise
            finally:
                self._state.in_fence = False
        faults.point("domain_after_commit")

    def _beat_after_outer_commit(self) -> None:
        if store.heartbeat(self.lease, using=self.using) is None:
            self._state.lease_lost = True

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
                self._state.lease_lost = True
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
        if self._state.lease_lost:
            raise LeaseLost(self.id, self.lease.epoch)
        processed, total = validation.progress(processed, total, unset=_UNSET)  # InvalidProgress
        cancel = store.heartbeat(self.lease, processed=processed, total=total, using=self.using)
        if cancel is None:
            self._state.lease_lost = True
            raise LeaseLost(self.id, self.lease.epoch)
        if cancel:
            self._state.observe_cancel()
        if processed is not None:
            self.processed = processed
        if total is not _UNSET:
            self.total = total

    # --- workflows (docs/workflows.rst; invariants 29 and 30) ---
    def spawn(self, kind: str, *, key: Any, input: Any = None, priority: int | None = None) -> Any:
        """Start a child job inside ``fenced()``; return its id (the same on a re-run).

        The child commits with the fenced transaction, inherits this job's scope, and its
        id derives from this job and ``key``: a slice re-run after a crash finds the
        child it already started instead of starting another (invariant 29).
        """
        return self.spawn_many([{"kind": kind, "key": key, "input": input, "priority": priority}])[
            0
        ]

    def spawn_many(self, children: list[dict[str, Any]]) -> list[Any]:
        """Start many children in one statement (``{"kind", "key", "input"?, "priority"?}`` each)."""
        return flow.spawn(self, children)

    def children(self) -> list[ChildOutcome]:
        """This job's children as last committed: ``ChildOutcome`` (status, result, error)."""
        return flow.children(self)

    def wait_for_children(self, *, at_least: int | None = None, policy: str = "fail") -> Wait:
        """Return this to wait, holding no lease, until ``at_least`` children ended (None: all).

        ``policy`` when a child fails or is cancelled: ``fail`` (the default: this job
        ends ``child_failed``), ``cancel`` (and its live children are asked to cancel),
        ``continue`` (count it as ended), ``wait`` (count only completed children).
        """
        flow.refuse_on_a_broker(self.row.queue_name, "wait_for_children")
        return Wait.children(at_least=at_least, policy=policy)

    def wait_for_event(self, name: str, *, timeout: Any = None) -> Wait:
        """Return this to wait, holding no lease, for the event ``name`` or the ``timeout``."""
        flow.refuse_on_a_broker(self.row.queue_name, "wait_for_event")
        return Wait.for_event(name, timeout=timeout)

    def received(self, name: str) -> Event | None:
        """Consume the oldest unread event ``name`` inside ``fenced()``; an ``Event`` or None."""
        return flow.received(self, name)

    def sleep(self, duration: Any) -> Wait:
        """Return this to sleep ``duration`` (a timedelta) on the database clock, holding no lease."""
        return Wait.sleep(duration)
