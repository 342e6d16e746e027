"""durable_jobs: durable long-running background jobs for Django on PostgreSQL.

    import durable_jobs as durable

    @durable.handler("reports.rebuild")
    def rebuild(job: durable.Slice) -> durable.Outcome: ...

    durable.start("reports.rebuild", input={...}, lock_key=..., idempotency_key=...)

The service functions and the slice context are imported lazily: Django imports this
package while it is still loading apps, before models may be touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_jobs.exceptions import (
    CancelRequested,
    ConfigurationError,
    DurableJobsError,
    IdempotencyConflict,
    IdempotencyInputMismatch,
    InvalidInput,
    JobBusy,
    JobError,
    JobNotFound,
    LeaseLost,
    LockKeyHeld,
    ScheduleNotFound,
    ScheduleRemoved,
    TerminalError,
    TransientError,
    UniqueKeyHeld,
    UnknownKind,
    UnrecoverableError,
    WaitKeyHeld,
    WrongState,
)
from durable_jobs.limits.policy import FlowControl, Rate
from durable_jobs.limits.reasons import Reason
from durable_jobs.registry import handler
from durable_jobs.schedules.declare import Schedule, schedule
from durable_jobs.states import DONE, YIELD, Done, Outcome, QueuePause, Scope, Status
from durable_jobs.unique import Unique

if TYPE_CHECKING:
    from durable_jobs.limits.api import explain, flow_keys, set_flow_limit
    from durable_jobs.models import Job
    from durable_jobs.queues import pause_queue, paused_queues, resume_queue
    from durable_jobs.runtime.context import Slice
    from durable_jobs.schedules.api import (
        list_schedules,
        pause_schedule,
        resume_schedule,
        run_schedule,
        sync_schedules,
    )
    from durable_jobs.service import cancel, get, list_jobs, redrive, start, start_many
    from durable_jobs.workflows.api import cancel_tree, children, send_event

_LAZY = {
    "start": "durable_jobs.service",
    "start_many": "durable_jobs.service",
    "get": "durable_jobs.service",
    "list_jobs": "durable_jobs.service",
    "cancel": "durable_jobs.service",
    "redrive": "durable_jobs.service",
    "list_schedules": "durable_jobs.schedules.api",
    "pause_schedule": "durable_jobs.schedules.api",
    "resume_schedule": "durable_jobs.schedules.api",
    "run_schedule": "durable_jobs.schedules.api",
    "sync_schedules": "durable_jobs.schedules.api",
    "pause_queue": "durable_jobs.queues",
    "resume_queue": "durable_jobs.queues",
    "paused_queues": "durable_jobs.queues",
    "send_event": "durable_jobs.workflows.api",
    "cancel_tree": "durable_jobs.workflows.api",
    "children": "durable_jobs.workflows.api",
    "explain": "durable_jobs.limits.api",
    "set_flow_limit": "durable_jobs.limits.api",
    "flow_keys": "durable_jobs.limits.api",
    "Slice": "durable_jobs.runtime.context",
    "Job": "durable_jobs.models",
}

__all__ = [
    "DONE",
    "YIELD",
    "Done",
    "Outcome",
    "QueuePause",
    "Scope",
    "Status",
    "Unique",
    "FlowControl",
    "Rate",
    "Reason",
    "handler",
    "Schedule",
    "schedule",
    "CancelRequested",
    "ConfigurationError",
    "DurableJobsError",
    "IdempotencyConflict",
    "IdempotencyInputMismatch",
    "InvalidInput",
    "JobBusy",
    "JobError",
    "JobNotFound",
    "LeaseLost",
    "LockKeyHeld",
    "ScheduleNotFound",
    "ScheduleRemoved",
    "TerminalError",
    "TransientError",
    "UniqueKeyHeld",
    "UnknownKind",
    "UnrecoverableError",
    "WaitKeyHeld",
    "WrongState",
    # resolved lazily, by __getattr__
    "start",
    "start_many",
    "get",
    "list_jobs",
    "cancel",
    "redrive",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "run_schedule",
    "sync_schedules",
    "pause_queue",
    "resume_queue",
    "paused_queues",
    "send_event",
    "cancel_tree",
    "children",
    "explain",
    "set_flow_limit",
    "flow_keys",
    "Slice",
    "Job",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_jobs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
