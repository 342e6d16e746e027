"""The closed vocabularies of a job row: statuses, error classes, verdicts, park reasons."""

from __future__ import annotations

import dataclasses
import datetime
import enum


class Status(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


LIVE_STATUSES = (Status.PENDING.value, Status.RUNNING.value)
TERMINAL_STATUSES = (Status.COMPLETED.value, Status.FAILED.value, Status.CANCELLED.value)


class ErrorClass(str, enum.Enum):
    TRANSIENT = "transient"
    TERMINAL = "terminal"
    UNRECOVERABLE = "unrecoverable"

    def __str__(self) -> str:
        return self.value


# Error codes that are verdicts: the job must end failed, decided inside the UPDATE that
# counted the failure (invariant 3). A row carrying one is never run again, only recorded.
VERDICT_TERMINAL = "terminal"
VERDICT_UNRECOVERABLE = "unrecoverable"
VERDICT_RETRY_EXHAUSTED = "retry_exhausted"
VERDICT_CODES = (VERDICT_TERMINAL, VERDICT_UNRECOVERABLE, VERDICT_RETRY_EXHAUSTED)


class ParkReason(str, enum.Enum):
    """Why the reconciler or the executor gave up on a job; only an operator re-drives it."""

    POISON = "poison"  # re-driven too often without committing anything
    MIRROR_FAILED = "mirror_failed"  # the terminal transaction's mirror kept failing

    def __str__(self) -> str:
        return self.value


class Outcome(str, enum.Enum):
    """What a handler returns: finished, or hand the rest back for another slice."""

    DONE = "done"
    YIELD = "yield"

    def __str__(self) -> str:
        return self.value


DONE = Outcome.DONE
YIELD = Outcome.YIELD


class SliceEnd(str, enum.Enum):
    """How a slice's run ended, before anything is recorded: the closed set ``Ran.end`` takes.

    Produced where the handler ran (the slot thread, or the handler process, which sends
    it over a pipe as its value) and by the worker itself when it had to end the slice.
    The executor's ``record`` maps each to exactly one transition, and so to one
    ``SliceOutcome``.
    """

    DONE = "done"  # returned DONE or Done(result)
    YIELD = "yield"  # returned YIELD (interrupted when the worker was stopping)
    CANCEL = "cancel"  # observed a cancel request
    LEASE_LOST = "lease_lost"  # its lease was taken over
    FAILED = "failed"  # raised, or returned something that is not an outcome
    INTERRUPTED = "interrupted"  # lost its connection, or its handler process died
    TIME_LIMIT = "time_limit"  # ran past its kind's time limit and was ended
    WITHDRAWN = "withdrawn"  # taken back from the handler process before it started
    WAIT = "wait"  # returned a workflow wait (children, an event, a sleep): held, no lease

    def __str__(self) -> str:
        return self.value


class SliceOutcome(str, enum.Enum):
    """What was recorded for a slice: ``SliceReport.outcome``, the log line's ``outcome=``
    and the ``slices`` metric's label. One value per transition the executor writes."""

    COMPLETED = "completed"
    FAILED = "failed"  # a verdict: the job ended failed
    CANCELLED = "cancelled"
    YIELDED = "yielded"
    INTERRUPTED = "interrupted"  # handed back on shutdown, or charged as an interruption
    RETRYING = "retrying"  # a failed slice waits out its backoff
    PARKED = "parked"
    LEASE_LOST = "lease_lost"
    HANDED_BACK = "handed_back"  # withdrawn unstarted: released uncharged
    MIRROR_RETRY = "mirror_retry"  # the terminal transaction's mirror failed; counted
    BOOKKEEPING_FAILED = "bookkeeping_failed"  # the write and its retries failed: left to its lease
    DEFERRED = "deferred"  # finished; completed with the slot's batch
    ABANDONED = "abandoned"  # the worker gave up on it and recorded that itself
    HELD = "held"  # its wait condition has not cleared, or it waits in a workflow

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """Whose job it is: ``(tenant, organization)``.

    A ``None`` organization means "tenant-wide" and is a value of its own: it matches only
    other tenant-wide jobs, never a job of some organization, and vice versa.
    """

    tenant: str
    organization: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """The right a claim grants: who may write (owner), which generation (epoch)."""

    job_id: object
    owner: str
    epoch: int
    ttl_ms: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One attempt's identity. A straggling copy with an older pair can never claim."""

    seq: int
    redrives: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailReply:
    """What ``fail_slice`` decided inside its UPDATE."""

    consecutive_failures: int
    error_code: str | None

    @property
    def verdict(self) -> str | None:
        """The verdict code when the job must now end failed, else None (it will retry)."""
        return self.error_code if self.error_code in VERDICT_CODES else None


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """A handler's "finished", carrying a JSON result to store on the row."""

    result: object = None


# Error codes of a job failed by its wait condition, before its first slice ran
# (durable_jobs.waits.gate; docs/waits.rst). Each is recorded with error class `terminal`.
WAIT_NEVER = "wait_never"  # a check answered "never"
WAIT_FAULTS_EXHAUSTED = "wait_faults_exhausted"  # WAIT_MAX_FAULTS "cannot tell" in a row
WAIT_MAX_HOLD = "wait_max_hold"  # checks still said "not yet" past WAIT_MAX_HOLD
WAIT_UNREADABLE = "wait_unreadable"  # a stored condition this version cannot read
WAIT_ERROR_CODES = (WAIT_NEVER, WAIT_FAULTS_EXHAUSTED, WAIT_MAX_HOLD, WAIT_UNREADABLE)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueuePause:
    """A paused queue (invariant 27): since when (database clock), by whom, and why.

    ``newly_paused`` is False when a pause call found the queue already paused: the first
    pause is kept, with its time, author and reason.
    """

    queue: str
    paused_at: datetime.datetime
    paused_by: str | None = None
    reason: str | None = None
    newly_paused: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FlowKeyState:
    """A flow key as operators see it: its limits and how much of them is in use now."""

    key: str
    #: The operator's runtime limits (None: not set; the settings' or the kind's apply).
    operator_concurrency: int | None
    operator_rate: int | None
    operator_rate_window_ms: int | None
    operator_weight: float | None
    #: The limits in force (None: unlimited).
    concurrency: int | None
    rate: int | None
    #: Permits held now, starts inside the rate window, jobs waiting to be claimed.
    running: int
    recent_starts: int
    waiting: int
    changed_at: datetime.datetime | None
    changed_by: str | None
