"""Every error durable_jobs raises on purpose: one base class, data on the instances.

Bad input is also a ``ValueError`` and bad configuration also an
``ImproperlyConfigured``, so callers that already catch those keep working.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class DurableJobsError(Exception):
    """Base class of every error raised by durable_jobs."""


class ConfigurationError(DurableJobsError, ImproperlyConfigured):
    """The ``DURABLE_JOBS`` setting (or a handler's policy) makes no sense."""


class InvalidInput(DurableJobsError, ValueError):
    """An argument was refused before anything was written; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        #: The message without the field's name, to restate it under another error.
        self.detail = message
        super().__init__(f"{field}: {message}")


class BatchTooLarge(InvalidInput):
    """A ``start_many`` batch is bigger, serialised, than ``MAX_BATCH_BYTES``.

    Refused before anything is written (and before the whole batch is even held in
    memory): one statement carrying it could exceed what PostgreSQL accepts in a message,
    killing the connection and the caller's transaction with it.
    """

    def __init__(self, size: int, limit: int, count: int) -> None:
        self.size = size
        self.limit = limit
        self.count = count
        super().__init__(
            "jobs",
            f"the batch reached {size} bytes serialised at its first {count} jobs; the limit is "
            f"{limit} (DURABLE_JOBS['MAX_BATCH_BYTES']). Split it: several start_many calls in "
            "one transaction.atomic() still land together or not at all",
        )


class RunAfterOutOfRange(InvalidInput):
    """``run_after`` is too far in the past (a mistaken default such as ``datetime.min``
    would put the job at the head of its queue) or further ahead than ``MAX_RUN_AFTER``."""

    def __init__(self, value: object, message: str) -> None:
        self.value = value
        super().__init__("run_after", message)


class UnknownKind(InvalidInput):
    """No handler is registered for this kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__("kind", f"no handler is registered for {kind!r}")


class JobNotFound(DurableJobsError, LookupError):
    """No job with this id exists in this scope (another tenant's job is not found either)."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id} in this scope")


class LockKeyHeld(DurableJobsError):
    """A live job already holds the lock key; ``holder_id`` is its id when known."""

    def __init__(self, lock_key: str | None, holder_id: object | None = None) -> None:
        self.lock_key = lock_key
        self.holder_id = holder_id
        held_by = f" by job {holder_id}" if holder_id else ""
        super().__init__(f"lock key {lock_key!r} is held{held_by}")


class WaitKeyHeld(DurableJobsError):
    """Re-driving this job would make a second live job on its wait key (invariant 22):
    another job of the scope holds the key now; ``holder_id`` is its id when known."""

    def __init__(self, wait_key: str | None, holder_id: object | None = None) -> None:
        self.wait_key = wait_key
        self.holder_id = holder_id
        held_by = f" by job {holder_id}" if holder_id else ""
        super().__init__(f"wait key {wait_key!r} is held{held_by}")


class UniqueKeyHeld(DurableJobsError):
    """Re-driving this job would make a second job on its unique key (invariant 25):
    another job of the scope in a covered status holds the key now."""

    def __init__(self, unique_key: str | None) -> None:
        self.unique_key = unique_key
        super().__init__(f"unique key {unique_key!r} is held by another job")


class IdempotencyConflict(DurableJobsError):
    """The idempotency key was used in this tenant for a different kind or organization."""

    def __init__(self, idempotency_key: str, job_id: object) -> None:
        self.idempotency_key = idempotency_key
        self.job_id = job_id
        super().__init__(
            f"idempotency key {idempotency_key!r} already names a job of another kind or organization"
        )


class IdempotencyInputMismatch(IdempotencyConflict):
    """The idempotency key already names a job of this kind whose input differs
    (``DURABLE_JOBS["IDEMPOTENCY_CHECKS_INPUT"]``): a retried request whose body changed."""

    def __init__(self, idempotency_key: str, job_id: object) -> None:
        self.idempotency_key = idempotency_key
        self.job_id = job_id
        DurableJobsError.__init__(
            self,
            f"idempotency key {idempotency_key!r} already names job {job_id} with a different "
            "input; use a new key for a new request",
        )


class WrongState(DurableJobsError):
    """The job exists but its state refuses the operation (e.g. re-driving a completed job)."""

    def __init__(self, job_id: object, status: str, operation: str, detail: str = "") -> None:
        self.job_id = job_id
        self.status = status
        self.operation = operation
        suffix = f": {detail}" if detail else ""
        super().__init__(f"cannot {operation} job {job_id} in status {status!r}{suffix}")


class JobBusy(DurableJobsError):
    """An operator action gave up waiting for the job's row, which another transaction holds.

    Usually a worker's ``fenced()`` domain write (it locks the job row until it commits).
    Nothing was changed; trying again once that transaction ends succeeds.
    """

    def __init__(self, job_id: object, operation: str, *, waited: float) -> None:
        self.job_id = job_id
        self.operation = operation
        self.waited = waited
        super().__init__(
            f"cannot {operation} job {job_id} right now: a worker holds it in a transaction "
            f"(waited {waited:g}s); nothing was changed, try again"
        )


class LeaseLost(DurableJobsError):
    """This slice no longer holds the job's lease; nothing it writes from now on can land."""

    def __init__(self, job_id: object, expected_epoch: int) -> None:
        self.job_id = job_id
        self.expected_epoch = expected_epoch
        super().__init__(f"lease on job {job_id} at epoch {expected_epoch} is gone")


class CancelRequested(DurableJobsError):
    """Raised into a slice that tries a fenced write after its cancellation was observed."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was asked to cancel")


class JobError(DurableJobsError):
    """Raise from a handler to fail a slice with an explicit class and code.

    ``error_class`` is one of ``transient`` (retry after a backoff), ``terminal`` (fail
    now) or ``unrecoverable`` (fail now, and refuse redrive without force).
    """

    error_class = "transient"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


class TransientError(JobError):
    error_class = "transient"


class TerminalError(JobError):
    error_class = "terminal"


class InvalidJobData(InvalidInput, TerminalError):
    """Data a job would store is unusable (a checkpoint that is not JSON, a negative count).

    Bad input everywhere (a ``ValueError``); raised inside a slice it is a bug in the
    handler, not a passing fault, so the job fails at once as ``terminal`` (the message
    names what was wrong) instead of retrying the same call until its budget runs out.
    """

    error_code = "invalid_job_data"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.code = self.error_code  # JobError's __init__ (reached through super) cleared it


class InvalidCheckpoint(InvalidJobData):
    """``save_checkpoint`` was given a state that cannot be stored as jsonb."""

    error_code = "invalid_checkpoint"


class InvalidProgress(InvalidJobData):
    """``processed``/``total`` (or ``start``'s ``total_count``) is not a count: a
    non-negative integer that fits PostgreSQL's bigint."""

    error_code = "invalid_progress"


class UnrecoverableError(JobError):
    error_class = "unrecoverable"


# --- Django's Tasks framework (durable_jobs.tasks.backend) ---------------------------------------


class TaskUnavailable(TerminalError):
    """A task job names a module path that no longer imports to a task: the job fails
    at once (retrying cannot make the code come back), and the worker carries on."""

    def __init__(self, module_path: str, reason: str) -> None:
        self.module_path = module_path
        super().__init__(
            f"task {module_path!r} cannot be loaded: {reason}. Was it renamed or removed after "
            "this job was enqueued? Enqueue it again under its new path",
            code="task_unavailable",
        )


class TaskAttemptInterrupted(TransientError):
    """Named in a TaskResult's errors for an attempt that ended without an outcome: its
    worker (or handler process) died, lost its lease or ran past the time limit."""


class BookkeepingFailed(DurableJobsError):
    """A slice's bookkeeping write and its retries failed (the connection replaced in between).

    Raised inside the runtime only: the slice is reported ``bookkeeping_failed`` and the
    job is left to its lease, which expires and makes it an orphan the reconciler
    re-drives (invariant 14a). It is never left looking healthy while nobody runs it.
    """

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(f"bookkeeping write failed: {cause}")


class KindNotRegisteredHere(TransientError):
    """A claimed job's kind has no handler in this worker (an older deploy, or ``TASKS``
    unset in this process): a transient failure, retried by a worker that knows it.

    Not ``UnknownKind``, which refuses a *start* of a kind no handler is registered for.
    """


class ScheduleNotFound(DurableJobsError, LookupError):
    """No schedule of this name is in the schedule table (code declares it, workers write it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no schedule {name!r}; schedules are written when a worker starts "
            "(or by durable_jobs.sync_schedules())"
        )


class ScheduleRemoved(DurableJobsError):
    """The schedule was removed from code: it neither fires nor runs; its history stays."""

    def __init__(self, name: str, operation: str) -> None:
        self.name = name
        self.operation = operation
        super().__init__(f"cannot {operation} schedule {name!r}: it was removed from code")
