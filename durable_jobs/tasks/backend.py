"""A backend for Django's Tasks framework: ``@task`` functions run as durable jobs.

Configure it with ``TASKS = {"default": {"BACKEND": "durable_jobs.tasks.DurableBackend"}}``
(Django 6's ``django.tasks``, or the ``django-tasks`` backport on Django 5.2). Each
``enqueue`` is a ``durable_jobs.start`` of kind ``django.tasks`` on the caller's
connection, so it commits or rolls back with the caller's transaction and wakes a worker
only on commit. ``durable_worker`` runs it like every other job: leases, heartbeats,
retries, cancellation, the reconciler. A ``TaskResult`` is rebuilt from the job row and
its attempt rows (``TaskAttempt``), one per claim that ran the task.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback as traceback_module
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import autodiscover_modules, import_string

# The type checker reads Django 6's django.tasks (typed by django-stubs); the backport
# mirrors that API, so one set of names is checked and the import below picks the module.
if TYPE_CHECKING:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    from durable_jobs.states import QueuePause
else:
    try:  # Django 6.x
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2 with the django-tasks backport
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError as error:
            raise ImportError(
                "durable_jobs.tasks needs Django's Tasks framework: Django 6, or on Django 5.2 the "
                "django-tasks backport (pip install 'durable-jobs[tasks]')"
            ) from error

from durable_jobs import conf, queues, registry
from durable_jobs.exceptions import (
    CancelRequested,
    ConfigurationError,
    InvalidInput,
    InvalidJobData,
    LeaseLost,
    TaskAttemptInterrupted,
    TaskUnavailable,
)
from durable_jobs.states import Done
from durable_jobs.tasks import schedules as task_schedules
from durable_jobs.unique import Unique, coerce

log = logging.getLogger("durable_jobs.tasks")

#: The job kind every task runs as; the task itself is named in the job's input.
TASK_KIND = task_schedules.TASK_KIND

__all__ = ["TASK_KIND", "DurableBackend", "DurableTask", "register"]

#: Module paths of the tasks defined in this process for a DurableBackend: ``@task``
#: validates each task with its backend when it builds it. A job's input names its task
#: by path, and that path is data anyone who can start a job controls; only a path in
#: this set is ever imported (importing an arbitrary module runs its top-level code).
_known_tasks: set[str] = set()
_discovered = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(Task):
    """The backend's ``task_class``: a ``Task`` with a retry policy of its own.

    ``@task(max_attempts=3, retry_backoff_base=5)`` (Django 6.1 passes extra keywords to
    the task class). ``max_attempts`` counts runs that raised: the N-th ends the task
    ``FAILED``; an attempt cut short by a dead worker is not counted here but against
    ``DURABLE_JOBS['MAX_REDRIVES_WITHOUT_COMMIT']``. Left as None, each falls back to the
    backend's ``OPTIONS``, then to ``DURABLE_JOBS``.
    """

    max_attempts: int | None = None
    retry_backoff_base: float | None = None  # seconds, or a timedelta
    retry_backoff_max: float | None = None
    #: Run the task periodically: a cron expression (``"0 6 * * *"``, ``"@hourly"``) or a
    #: ``durable_jobs.Schedule`` (its ``input`` is the task's kwargs), or a list of them.
    #: Each tick enqueues the task once (durable_jobs.schedules, invariant 24).
    schedule: Any = None
    #: ``@task(unique=True)``: an enqueue while the same task with the same arguments is
    #: queued or running returns that task's result instead of a second run (a
    #: ``durable.Unique`` without fields adds a period; False turns the backend's
    #: ``OPTIONS["UNIQUE"]`` off). See docs/unique.rst.
    unique: Unique | bool | None = None


#: The backend's OPTIONS, and what each defaults to.
OPTIONS = {
    # The database alias jobs are written to (enqueue joins that alias's transaction).
    "DATABASE": DEFAULT_DB_ALIAS,
    # Runs a task gets when it raises, unless the task says otherwise: 1, Django's own
    # backends' behaviour (a task is not retried unless it asks to be).
    "MAX_ATTEMPTS": 1,
    # Retry backoff of tasks that do not set their own; None: DURABLE_JOBS' values.
    "RETRY_BACKOFF_BASE": None,
    "RETRY_BACKOFF_MAX": None,
    # Periodic tasks: {task path: a cron expression, a durable_jobs.Schedule or a dict of
    # its fields (or a list)}, for tasks whose @task cannot say so, or an operator's choice.
    "SCHEDULES": None,
    # Uniqueness of tasks that do not say: None (none), True (the same task and arguments
    # while one is queued or running), a durable.Unique without fields, or a dict of its
    # arguments ({"period": 3600}: also one that completed in the same hour).
    "UNIQUE": None,
}

#: What a task's uniqueness compares: the task and its arguments, nothing else of the job.
TASK_UNIQUE_FIELDS = ("args", "kwargs", "task")


class DurableBackend(BaseTaskBackend):
    """Django's Tasks API over durable_jobs: ``enqueue`` starts a job, ``get_result`` reads it."""

    task_class = DurableTask
    supports_defer = True
    supports_async_task = True  # run by the worker through async_to_sync
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Built when the first @task module is imported, so it touches no model and no
        # database: it only checks its own settings and registers the job kind.
        if not isinstance(self.options, dict):
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {type(self.options).__name__}"
            )
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}; known: {sorted(OPTIONS)}"
            )
        options = {**OPTIONS, **self.options}
        self.database = options["DATABASE"]
        if not isinstance(self.database, str) or not self.database:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] must be a database alias"
            )
        self.max_attempts = _attempts(
            f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS']", options["MAX_ATTEMPTS"]
        )
        self.retry_backoff_base = _seconds(
            f"TASKS[{alias!r}]['OPTIONS']['RETRY_BACKOFF_BASE']", options["RETRY_BACKOFF_BASE"]
        )
        self.retry_backoff_max = _seconds(
            f"TASKS[{alias!r}]['OPTIONS']['RETRY_BACKOFF_MAX']", options["RETRY_BACKOFF_MAX"]
        )
        schedules = options["SCHEDULES"] or {}
        if not isinstance(schedules, dict):
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS']['SCHEDULES'] must be a dict {{task path: cron}}"
            )
        for path, schedule in schedules.items():
            task_schedules.declare(self, path, schedule, queue=None, priority=None, policy=None)
        label = f"TASKS[{alias!r}]['OPTIONS']['UNIQUE']"
        try:
            self.unique = _task_unique(label, options["UNIQUE"])
        except InvalidInput as error:
            raise ConfigurationError(str(error)) from None
        try:
            register()
        except ConfigurationError:
            # A broken DURABLE_JOBS: system check durable_jobs.E001 names it, and the
            # Tasks framework's own check (which builds this backend) must not crash first.
            log.debug(
                "durable_jobs.tasks: kind not registered, DURABLE_JOBS is invalid", exc_info=True
            )

    # --- the Tasks API ------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        _known_tasks.add(task.module_path)
        if isinstance(task, DurableTask):
            try:
                _attempts("max_attempts", task.max_attempts)
                _seconds("retry_backoff_base", task.retry_backoff_base)
                _seconds("retry_backoff_max", task.retry_backoff_max)
                _task_unique("unique", task.unique)
            except (ConfigurationError, InvalidInput) as error:
                raise InvalidTask(f"task {task.module_path}: {error}") from None
            if task.schedule is not None:
                try:
                    task_schedules.declare(
                        self,
                        task.module_path,
                        task.schedule,
                        queue=task.queue_name,
                        priority=task.priority,
                        policy=self._policy(task),
                    )
                except ConfigurationError as error:
                    raise InvalidTask(str(error)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Start the task as a durable job in the caller's transaction (``OPTIONS['DATABASE']``)."""
        from durable_jobs import service

        self.validate_task(task)
        payload = {
            "task": task.module_path,
            "args": normalize_json(args),
            "kwargs": normalize_json(kwargs),
            "backend": self.alias,
            "run_after": task.run_after.isoformat() if task.run_after is not None else None,
            **self._policy(task),
        }
        own = _task_unique("unique", task.unique) if isinstance(task, DurableTask) else None
        job = service.start(
            TASK_KIND,
            input=payload,
            queue=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            unique=self.unique if own is None else own,
            using=self.database,
        )
        if job.deduplicated:
            # The same task with the same arguments is already queued or running (or
            # finished within the period): its result is the answer, and nothing was
            # enqueued, so no task_enqueued.
            return self.get_result(str(job.id))
        result = task_result(job, [], task=task)
        _send(task_enqueued, self, result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """Rebuild the ``TaskResult`` from the job row and its attempts."""
        from durable_jobs.exceptions import InvalidInput, JobNotFound
        from durable_jobs.models import TaskAttempt
        from durable_jobs.service import get

        try:
            job = get(result_id, using=self.database)
        except (InvalidInput, JobNotFound):
            raise TaskResultDoesNotExist(result_id) from None
        if job.kind != TASK_KIND:
            raise TaskResultDoesNotExist(result_id)
        attempts = list(
            TaskAttempt.objects.using(self.database).filter(job_id=job.id).order_by("epoch")
        )
        return task_result(job, attempts)

    def check(self, **kwargs: Any) -> list:
        from durable_jobs.tasks.checks import check_tasks_backend

        return check_tasks_backend(self)

    # --- paused queues (invariant 27): durable_jobs' own, beyond Django's API -----------

    def queue_pause(self, queue_name: str) -> QueuePause | None:
        """The pause in force on ``queue_name`` in this backend's database; None: not paused.

        Django's ``TaskResult`` has no place for it: a task enqueued onto a paused queue is
        stored and stays ``READY`` until ``durable_jobs.resume_queue(queue_name)``.
        """

        return {p.queue: p for p in queues.paused_queues(using=self.database)}.get(queue_name)

    def paused_queues(self) -> list[str]:
        """The names of the paused queues in this backend's database."""

        return [pause.queue for pause in queues.paused_queues(using=self.database)]

    # --- helpers ------------------------------------------------------------------------

    def _policy(self, task: Task) -> dict[str, Any]:
        """The task's retry policy, resolved now and stored on its job (the worker that
        counts a failure never imports the task)."""
        own = task if isinstance(task, DurableTask) else None
        max_attempts = (own and own.max_attempts) or self.max_attempts
        base = (
            _seconds("retry_backoff_base", own.retry_backoff_base if own else None)
            or self.retry_backoff_base
        )
        cap = (
            _seconds("retry_backoff_max", own.retry_backoff_max if own else None)
            or self.retry_backoff_max
        )
        effective_base = base if base is not None else conf.get().RETRY_BACKOFF_BASE
        if cap is None and base is not None and base > conf.get().RETRY_BACKOFF_MAX:
            cap = base  # a base above the default cap means "at least this long", not an error
        effective_cap = cap if cap is not None else conf.get().RETRY_BACKOFF_MAX
        if effective_cap < effective_base:
            raise InvalidTask(
                f"task {task.module_path}: retry_backoff_max ({effective_cap:g}s) must be at least "
                f"retry_backoff_base ({effective_base:g}s)"
            )
        return {"max_attempts": max_attempts, "retry_backoff_base": base, "retry_backoff_max": cap}


def _task_unique(label: str, value: Any) -> Unique | bool | None:
    """A task's ``unique`` (or the backend's OPTIONS["UNIQUE"]): over the task and its
    arguments, so a ``Unique`` naming fields is refused (a task has no named input)."""
    if isinstance(value, dict):
        try:
            value = Unique(**value)
        except TypeError:
            raise InvalidInput(label, f"takes period and states, got {sorted(value)}") from None
    rule = coerce(label, value)
    if isinstance(value, (list, tuple)) or (isinstance(rule, Unique) and rule.fields is not None):
        raise InvalidInput(label, "a task is unique by its arguments: fields are not supported")
    if isinstance(rule, Unique):
        return Unique(fields=TASK_UNIQUE_FIELDS, period=rule.period, states=rule.states)
    return rule


def _attempts(label: str, value: Any) -> int | None:
    if value is None:
        return None
    return conf.positive_int(label, value)


def _seconds(label: str, value: Any) -> float | None:
    return None if value is None else conf.duration(label, value)


# ---------------------------------------------------------------------------------------
# The job row as a TaskResult
# ---------------------------------------------------------------------------------------

_FINISHED = {
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
INTERRUPTED_PATH = f"{TaskAttemptInterrupted.__module__}.{TaskAttemptInterrupted.__qualname__}"
INTERRUPTED_TEXT = (
    "the attempt ended without an outcome: its worker (or the process running the task) died, "
    "lost its lease or ran past the time limit, and the job was handed on"
)


def status_of(job: Any) -> TaskResultStatus:
    """pending (held, yielded) and a released lease waiting for its retry are READY;
    a claimed job is RUNNING; completed SUCCESSFUL; failed, cancelled and parked FAILED."""
    if job.status in _FINISHED:
        return _FINISHED[job.status]
    if job.status == "running" and job.lease_owner is not None:
        return TaskResultStatus.RUNNING
    return TaskResultStatus.READY


def task_result(job: Any, attempts: list[Any], *, task: Task | None = None) -> TaskResult:
    """The ``TaskResult`` a task job's row and its attempts (in epoch order) describe."""
    data = job.input if isinstance(job.input, dict) else {}
    if task is None:
        task = _task_of(job, data)
    status = status_of(job)
    result: TaskResult[..., Any] = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=attempts[0].started_at if attempts else None,
        finished_at=job.finished_at
        if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
        else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        args=data.get("args") or [],
        kwargs=data.get("kwargs") or {},
        backend=data.get("backend") or task.backend,
        errors=_errors(job, attempts, status),
        worker_ids=[attempt.worker_id for attempt in attempts],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _errors(job: Any, attempts: list[Any], status: TaskResultStatus) -> list[TaskError]:
    from durable_jobs.models import JobAttempt

    # The job's own attempt history (invariant 32) names what ended each interrupted or
    # lost attempt; the epoch is the same slice's in both tables.
    history = {
        a.epoch: a
        for a in JobAttempt.objects.using(job._state.db or "default").filter(job_id=job.id)
    }
    errors = []
    for position, attempt in enumerate(attempts):
        if attempt.exception_class_path:
            errors.append(
                TaskError(
                    exception_class_path=attempt.exception_class_path,
                    traceback=attempt.traceback or "",
                )
            )
        elif attempt.finished_at is None and not (
            status == TaskResultStatus.RUNNING and attempt.epoch == job.lease_epoch
        ):
            last = position == len(attempts) - 1
            if last and job.status == "cancelled":
                continue  # ended by the cancellation, reported below
            recorded = history.get(attempt.epoch)
            text = (recorded.error_message if recorded is not None else None) or (
                job.error_message if last and job.error_message else INTERRUPTED_TEXT
            )
            errors.append(TaskError(exception_class_path=INTERRUPTED_PATH, traceback=text))
    ended_by_attempt = bool(attempts) and (
        attempts[-1].exception_class_path or attempts[-1].finished_at is None
    )
    if job.status == "cancelled":
        who = f" by {job.cancelled_by}" if job.cancelled_by else ""
        errors.append(
            TaskError(
                exception_class_path=_path(CancelRequested),
                traceback=f"cancelled{who} through durable_jobs",
            )
        )
    elif job.status == "failed" and not ended_by_attempt:
        # Failed without the last attempt raising: a return value that is not JSON, a
        # verdict recorded by the reconciler, a job that never ran.
        from durable_jobs import exceptions

        cls = (
            exceptions.UnrecoverableError
            if job.error_class == "unrecoverable"
            else exceptions.TerminalError
        )
        errors.append(
            TaskError(
                exception_class_path=_path(cls),
                traceback=job.error_message or f"failed ({job.error_code})",
            )
        )
    return errors


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _task_of(job: Any, data: dict[str, Any]) -> Task:
    path = data.get("task")
    try:
        task = load_task(path)
    except TaskUnavailable as error:
        raise TaskResultDoesNotExist(f"{job.id}: {error}") from None
    changes: dict[str, Any] = {}
    if job.priority != task.priority:
        changes["priority"] = job.priority
    if job.queue_name != task.queue_name:
        changes["queue_name"] = job.queue_name
    if data.get("run_after"):
        changes["run_after"] = datetime.fromisoformat(data["run_after"])
    if changes:
        try:
            task = dataclasses.replace(task, **changes)
        except InvalidTask:
            pass  # the queue is no longer in QUEUES: show the task as it is defined now
    return task


def load_task(path: Any) -> Task:
    """The ``Task`` at ``path`` (a module path as ``Task.module_path`` spells it).

    Only a task this process has defined for a DurableBackend is resolved: an unknown
    path is refused before anything is imported (a job's input must not choose which
    module a worker imports). A path not seen yet first makes the process import each
    installed app's ``tasks`` module, once, so a worker knows the tasks apps define there.
    """
    if not isinstance(path, str) or not path:
        raise TaskUnavailable(str(path), "the job's input names no task")
    if path not in _known_tasks:
        discover_tasks()
    if path not in _known_tasks:
        raise TaskUnavailable(
            path,
            "it is not a task of this backend (no imported module, nor any installed app's "
            "tasks module, defines a @task at that path); nothing was imported",
        )
    try:
        found = import_string(path)
    except ImportError as error:
        raise TaskUnavailable(path, f"{type(error).__name__}: {error}") from None
    except Exception as error:  # noqa: BLE001 - a module that raises on import
        raise TaskUnavailable(
            path, f"importing it raised {type(error).__name__}: {error}"
        ) from None
    if not isinstance(found, Task):
        raise TaskUnavailable(
            path, f"it is a {type(found).__name__}, not a task (is @task still on it?)"
        )
    return found


def discover_tasks() -> None:
    """Import each installed app's ``tasks`` module, once per process (the set of modules
    is the deployment's INSTALLED_APPS, never a job's input)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    try:
        autodiscover_modules("tasks")
    except Exception:
        log.warning("durable_jobs.tasks: importing the apps' tasks modules raised", exc_info=True)


# ---------------------------------------------------------------------------------------
# Execution: the handler of kind "django.tasks"
# ---------------------------------------------------------------------------------------


def run_task(context: Any) -> Done:
    """Run one attempt of the task the job names, recording the attempt under the lease."""
    from durable_jobs import store

    job, lease, using = context.row, context.lease, context.using
    data = job.input if isinstance(job.input, dict) else {}
    if store.begin_task_attempt(lease, worker_id(lease.owner, job.id), using=using) is None:
        raise LeaseLost(job.id, lease.epoch)
    try:
        task = load_task(data.get("task"))
        # The claimed row: running under this lease, so the result says RUNNING.
        result = task_result(job, _attempts_of(job, using), task=task)
        _send(task_started, _backend_of(result), result)
        args, kwargs = list(data.get("args") or []), dict(data.get("kwargs") or {})
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as error:
            raise InvalidJobData("return value", f"is not JSON-serialisable ({error})") from None
    except BaseException as error:
        _end_attempt(lease, error, using)
        raise
    if not store.end_task_attempt(lease, using=using):
        raise LeaseLost(job.id, lease.epoch)
    return Done(value)


def _attempts_of(job: Any, using: str) -> list[Any]:
    from durable_jobs.models import TaskAttempt

    return list(TaskAttempt.objects.using(using).filter(job_id=job.id).order_by("epoch"))


def _end_attempt(lease: Any, error: BaseException, using: str) -> None:
    from durable_jobs import store

    text = "".join(traceback_module.format_exception(error)).replace("\x00", "\\x00")
    try:
        store.end_task_attempt(
            lease, exception_class_path=_path(type(error))[:300], traceback=text, using=using
        )
    except Exception:
        log.warning(
            "[%s %s] could not record the failed attempt", TASK_KIND, lease.job_id, exc_info=True
        )


def worker_id(owner: str | None, job_id: Any) -> str:
    """The worker named by a lease owner: a batched claim appends ``:<job id>`` to the slot."""
    owner = owner or "unknown"
    suffix = f":{job_id}"
    return owner.removesuffix(suffix)


def job_policy(job: Any) -> dict[str, Any]:
    """The retry policy ``enqueue`` stored on the job, as the registry's policy fields."""
    data = job.input if isinstance(job.input, dict) else {}
    policy: dict[str, float] = {}
    attempts = data.get("max_attempts")
    if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 1:
        policy["max_consecutive_failures"] = attempts
    for name in ("retry_backoff_base", "retry_backoff_max"):
        value = data.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            policy[name] = float(value)
    return policy


def _backend_of(result: TaskResult) -> Any:
    try:
        return task_backends[result.backend]
    except Exception:  # noqa: BLE001 - the alias left TASKS: the signal still names our class
        return DurableBackend


def _send(signal: Any, backend: Any, result: TaskResult) -> None:
    """Send a Tasks signal robustly: a raising receiver is logged and changes nothing."""
    sender = backend if isinstance(backend, type) else type(backend)
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            log.error(
                "task %s: a %s receiver (%r) raised %s: %s",
                result.id,
                _signal_name(signal),
                receiver,
                type(response).__name__,
                response,
            )


def _signal_name(signal: Any) -> str:
    for name, candidate in (
        ("task_enqueued", task_enqueued),
        ("task_started", task_started),
        ("task_finished", task_finished),
    ):
        if candidate is signal:
            return name
    return "signal"


def _on_job_finished(sender: Any, job: Any, outcome: str, **kwargs: Any) -> None:
    """``task_finished`` once the job's terminal transaction committed (never for a
    failed attempt that will be retried: the task has not finished)."""
    if job.kind != TASK_KIND:
        return
    data = job.input if isinstance(job.input, dict) else {}
    try:
        # A job without its alias fails the lookup either way, and is logged below.
        backend = task_backends[str(data.get("backend"))]
        result = backend.get_result(str(job.id)) if isinstance(backend, DurableBackend) else None
    except Exception:
        log.warning("task %s: cannot build its result for task_finished", job.id, exc_info=True)
        return
    if result is not None:
        _send(task_finished, backend, result)


def register() -> None:
    """Register the ``django.tasks`` job kind and the ``task_finished`` bridge (idempotent)."""
    from durable_jobs import signals

    if registry.get(TASK_KIND) is None:
        registry.handler(TASK_KIND, job_policy=job_policy)(run_task)
    signals.job_finished.connect(
        _on_job_finished, dispatch_uid="durable_jobs.tasks.backend.task_finished"
    )
